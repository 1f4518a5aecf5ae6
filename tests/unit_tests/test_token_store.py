"""The token store (skrull_ext/datasets/token_store.py): cached samples equal the
in-memory JSONL source's, the key follows every input, a partial store is rebuilt,
and a multi-process build is byte-identical to a one-process build."""

import dataclasses
import os
from pathlib import Path

import numpy as np
import pytest

from skrull_ext import assets
from skrull_ext.datasets.prepare import cached_sequences
from skrull_ext.datasets.source import DATASETS, SourceDataLoaderBase
from skrull_ext.datasets.token_store import store_is_complete
from skrull_ext.tokenizer import LocalTokenizer

FIXTURE = assets.text_path("tiny_sft")


@pytest.fixture(scope="module")
def tok():
    return LocalTokenizer(LocalTokenizer.Config(path="tiny_bpe"), tokenizer_path="")


def _config(tmp_path, **kw):
    kw = {"dataset_path": FIXTURE, **kw}
    kw.setdefault("dataset", "jsonl")
    return SourceDataLoaderBase.Config(token_cache=True, token_cache_dir=str(tmp_path / "cache"), **kw)


@pytest.mark.parametrize("max_len", [None, 64])
def test_cached_equals_uncached(tmp_path, tok, max_len):
    cfg = _config(tmp_path, max_len=max_len)
    cached = DATASETS["jsonl"](cfg, tok)
    plain = DATASETS["jsonl"](dataclasses.replace(cfg, token_cache=False), tok)
    assert len(cached) == len(plain) and cached.max_length == plain.max_length
    for i in range(2 * len(plain)):
        a, b = cached[i], plain[i]
        assert cached.length(i) == plain.length(i)
        assert a.input.tolist() == b.input.tolist() and a.labels.tolist() == b.labels.tolist()


def test_key_changes_with_each_input_and_partial_store_rebuilt(tmp_path, tok):
    data = tmp_path / "d.jsonl"
    data.write_bytes(Path(FIXTURE).read_bytes())
    cfg = _config(tmp_path, dataset_path=str(data))
    first = cached_sequences(cfg, tok, workers=1, progress=False).store.folder
    assert cached_sequences(cfg, tok, workers=1, progress=False).store.folder == first  # reused
    for change in ({"system_prompt": "Be brief."}, {"min_len": 3}, {"chat_template": "chatml"}):
        assert cached_sequences(dataclasses.replace(cfg, **change), tok, workers=1, progress=False).store.folder != first
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


def test_multiprocess_build_equals_single(tmp_path, tok):
    one = cached_sequences(_config(tmp_path / "a"), tok, workers=1, progress=False).store.folder
    two = cached_sequences(_config(tmp_path / "b"), tok, workers=2, progress=False).store.folder
    for f in ("ids.bin", "mask.bin", "offsets.npy", "lengths.npy"):
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
