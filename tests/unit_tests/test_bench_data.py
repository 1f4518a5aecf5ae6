"""bench data's generated corpus: real chat records of the asked lengths, the same for the same seed."""

import json

import numpy as np
import pytest

from skrull_ext import lengths as shipped_lengths
from skrull_ext.bench.data import generate, parse_args
from skrull_ext.data.sources.text import JsonlSequences
from skrull_ext.data.sources.tokenizer import LocalTokenizer


def test_generated_chats_follow_the_scaled_distribution(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    generate(str(a), 400, "mix_sharegpt_conv95+longbench_en5", 32.0, seed=1)
    generate(str(b), 400, "mix_sharegpt_conv95+longbench_en5", 32.0, seed=1)
    assert a.read_bytes() == b.read_bytes()
    roles = {tuple(m["role"] for m in json.loads(line)["messages"]) for line in a.read_text().splitlines()}
    assert roles == {("user", "assistant")}
    tok = LocalTokenizer(LocalTokenizer.Config(path="tiny_bpe"), tokenizer_path="")
    src = JsonlSequences(str(a), tok)  # the real reader and chat template: every record trains
    assert len(src) == 400
    got = np.median(src._lengths)
    want = np.median(np.asarray(shipped_lengths.load("mix_sharegpt_conv95+longbench_en5"))) / 32.0
    assert 0.5 * want < got < 2.0 * want, (got, want)  # the template adds a few tokens per chat


def test_bad_arguments_are_named(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--workers", "0"])
    assert "--workers 0: must be >= 1" in capsys.readouterr().err
