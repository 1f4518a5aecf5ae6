"""The token store (skrull_ext/data/sources/token_store.py): cached samples equal the
in-memory JSONL source's, the key follows every input, a partial store is rebuilt,
and a multi-process build is byte-identical to a one-process build."""

import dataclasses
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from skrull_ext import assets
from skrull_ext.data.sources.prepare import cached_sequences
from skrull_ext.data.steps.base import DATASETS, SourceDataLoaderBase
from skrull_ext.data.sources.token_store import FILES, StoreSequences, cache_key, store_is_complete
from skrull_ext.data.sources.tokenizer import LocalTokenizer, SyntheticTokenizer

FIXTURE = assets.text_path("tiny_sft")


@pytest.fixture(scope="module")
def tok():
    return LocalTokenizer(LocalTokenizer.Config(path="tiny_bpe"), tokenizer_path="")


def _config(tmp_path, **kw):
    kw = {"dataset_path": FIXTURE, **kw}
    kw.setdefault("dataset", "jsonl")
    return SourceDataLoaderBase.Config(token_cache=True, token_cache_dir=str(tmp_path / "cache"), **kw)


def _same_source(cached, plain):
    """Same records, samples, lengths, locations, loss masks and bad records, through the source API."""
    assert len(cached) == len(plain) and cached.max_length == plain.max_length
    assert cached.bad == plain.bad and cached.bad_summary() == plain.bad_summary()
    for i in range(2 * len(plain)):  # two epochs: the same permutations
        a, b = cached[i], plain[i]
        assert cached.length(i) == plain.length(i) and cached.location(i) == plain.location(i)
        assert cached.has_loss_within(i, 3) == plain.has_loss_within(i, 3)
        assert a.input.tolist() == b.input.tolist() and a.labels.tolist() == b.labels.tolist()


def test_cached_equals_uncached(tmp_path, tok):
    cfg = _config(tmp_path, max_len=64)
    cached = DATASETS["jsonl"](cfg, tok)
    assert isinstance(cached, StoreSequences)
    _same_source(cached, DATASETS["jsonl"](dataclasses.replace(cfg, token_cache=False), tok))


BAD_LINES = [b'{"text": "a plain document of some words"}', b'{"text": "caf\xe9"}', b"{not json",
             b'{"body": "x"}', b'{"messages": [{"role": "bot", "content": "x"}]}',
             b'{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}]}',
             b'{"text": "a"}']


@pytest.mark.parametrize("workers", [1, pytest.param(2, marks=pytest.mark.slow)])  # 2: a pool of processes
def test_bad_records_cached_as_uncached(tmp_path, tok, workers):
    """on_bad_record through the store: 'skip' keeps the same records and the
    same messages in file order (whatever the workers); 'error' stops with the
    same message, and leaves no store behind."""
    data = tmp_path / "mixed.jsonl"
    data.write_bytes(b"\n".join(BAD_LINES) + b"\n")
    cfg = _config(tmp_path, dataset_path=str(data), min_len=3, on_bad_record="skip")
    cached = cached_sequences(cfg, tok, workers=workers, progress=False)
    _same_source(cached, DATASETS["jsonl"](dataclasses.replace(cfg, token_cache=False), tok))
    assert len(cached) == 2 and [b.split(": ", 1)[0] for b in cached.bad] == [f"{data}:{n}" for n in (2, 3, 4, 5, 7)]
    error = dataclasses.replace(cfg, on_bad_record="error")
    with pytest.raises(ValueError) as plain_error:
        DATASETS["jsonl"](dataclasses.replace(error, token_cache=False), tok)
    with pytest.raises(ValueError) as cached_error:
        cached_sequences(error, tok, workers=workers, progress=False)
    assert str(cached_error.value) == str(plain_error.value) and f"{data}:2: not UTF-8" in str(plain_error.value)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir() if not p.name.endswith(".lock")) == \
        [os.path.basename(cached.store.folder)]  # the failed build left nothing
    # the same file spelled another way shares the store; messages name it as the job spells it
    other = str(tmp_path / ".." / tmp_path.name / "mixed.jsonl")
    again = cached_sequences(dataclasses.replace(cfg, dataset_path=other), tok, progress=False)
    assert again.store.folder == cached.store.folder
    assert again.location(0).startswith(f"{other}:") and again.bad[0].startswith(f"{other}:2: not UTF-8")


def test_key_changes_with_each_input_and_partial_store_rebuilt(tmp_path, tok):
    data = tmp_path / "d.jsonl"
    data.write_bytes(Path(FIXTURE).read_bytes())
    cfg = _config(tmp_path, dataset_path=str(data))
    first = cached_sequences(cfg, tok, workers=1, progress=False).store.folder
    assert cached_sequences(cfg, tok, workers=1, progress=False).store.folder == first  # reused
    assert cached_sequences(dataclasses.replace(cfg, max_len=16), tok, progress=False).store.folder == first
    for change in ({"system_prompt": "Be brief."}, {"min_len": 3}, {"chat_template": "chatml"},
                   {"on_bad_record": "skip"}, {"columns": {"prompt": "question"}}):
        assert cached_sequences(dataclasses.replace(cfg, **change), tok, workers=1, progress=False).store.folder != first
    skip = dataclasses.replace(cfg, on_bad_record="skip")  # rows of the other kinds are skipped, not fatal
    for change in ({"format": "messages"}, {"text_field": "body"}):
        assert (cached_sequences(dataclasses.replace(skip, **change), tok, workers=1, progress=False).store.folder
                != cached_sequences(skip, tok, workers=1, progress=False).store.folder)
    # Another tokenizer (the byte-level one), or the same folder with an edited file: another store.
    by_bytes = SyntheticTokenizer.Config(vocab_size=2048).build()
    assert cached_sequences(cfg, by_bytes, workers=1, progress=False).store.folder != first
    edited = tmp_path / "tok"
    shutil.copytree(tok.tokenizer_path, edited)
    assert cache_key([str(data)], tok, None, {})[0] == cache_key([str(data)], tok, None, {})[0]
    (edited / "tokenizer_config.json").write_text((edited / "tokenizer_config.json").read_text() + " ")
    other = LocalTokenizer.Config(path=str(edited)).build(tokenizer_path="")
    assert cache_key([str(data)], other, None, {})[0] != cache_key([str(data)], tok, None, {})[0]
    st = os.stat(data)
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert cached_sequences(cfg, tok, workers=1, progress=False).store.folder != first
    # a truncated store (a killed write) is detected and rebuilt
    folder = cached_sequences(cfg, tok, workers=1, progress=False).store.folder
    good = Path(folder, "ids.bin").read_bytes()
    with open(os.path.join(folder, "ids.bin"), "r+b") as f:
        f.truncate(len(good) // 2)
    assert not store_is_complete(folder)
    again = cached_sequences(cfg, tok, workers=1, progress=False)
    assert Path(again.store.folder, "ids.bin").read_bytes() == good


@pytest.mark.slow  # a pool of tokenizer processes
def test_multiprocess_build_equals_single(tmp_path, tok):
    one = cached_sequences(_config(tmp_path / "a"), tok, workers=1, progress=False).store.folder
    two = cached_sequences(_config(tmp_path / "b"), tok, workers=2, progress=False).store.folder
    for f in FILES:
        assert Path(one, f).read_bytes() == Path(two, f).read_bytes()
    assert isinstance(cached_sequences(_config(tmp_path / "a"), tok).store._ids, np.memmap)


def test_cached_parquet_equals_uncached(tmp_path, tok, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))
    ds = datasets.load_dataset("json", data_files=[FIXTURE], split="train", on_mixed_types=None)
    ds.to_parquet(str(tmp_path / "all.parquet"))
    cfg = _config(tmp_path, dataset="hf", dataset_path=str(tmp_path / "all.parquet"))
    cached, plain = DATASETS["hf"](cfg, tok), DATASETS["hf"](dataclasses.replace(cfg, token_cache=False), tok)
    assert len(cached) == len(plain)
    for i in range(len(plain)):
        assert cached[i].input.tolist() == plain[i].input.tolist()
        assert cached[i].labels.tolist() == plain[i].labels.tolist()


@pytest.mark.slow  # --workers 2: a pool of processes
def test_prepare_command_builds_the_store_a_job_then_opens(tmp_path, tok, capsys):
    """``python -m skrull_ext.prepare JOB --key value``: the store the job's loader opens without building."""
    from skrull_ext.prepare import main

    job = os.path.join(os.path.dirname(assets.__file__), "..", "jobs", "debug_cpu_text.toml")
    cache = tmp_path / "cache"
    assert main([job, "--workers", "2", "--dataloader.token_cache_dir", str(cache)]) == 0
    line = capsys.readouterr().out.strip()
    records = len(DATASETS["jsonl"](dataclasses.replace(_config(tmp_path), token_cache=False), tok))
    assert line.startswith(f"prepared {records} records")
    folder = line.rsplit("-> ", 1)[1]
    assert cached_sequences(_config(tmp_path), tok, progress=False).store.folder == folder
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"\n".join(BAD_LINES) + b"\n")
    assert main([job, "--dataloader.dataset_path", str(bad), "--dataloader.on_bad_record", "skip",
                 "--dataloader.token_cache_dir", str(cache)]) == 0
    assert f", 4 skipped as bad (the first: {bad}:2: not UTF-8" in capsys.readouterr().out  # min_len 2: line 7 kept
    with pytest.raises(SystemExit) as e:
        main([job, "--workers", "0"])
    assert e.value.code == 2 and "--workers 0: must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main([job, "--dataloader.dataset", "synthetic"])
    assert e.value.code == 2 and "dataloader.dataset = 'synthetic' has no text to prepare" in capsys.readouterr().err
