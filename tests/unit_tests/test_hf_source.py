"""``[dataloader] dataset = "hf"``: the shipped JSONL fixture's records read back
through HF ``datasets`` from parquet, json, arrow files, split folders and
save_to_disk folders give exactly the JSONL source's samples."""

import json
import os
import shutil

import numpy as np
import pytest

from skrull_ext import assets
from skrull_ext.data.sources.hf_source import data_files
from skrull_ext.data.steps.loader import SkrullDataLoader
from skrull_ext.data.steps.base import DATASETS
from skrull_ext.data.sources.tokenizer import LocalTokenizer
from skrull_ext.errors import DataError
from skrull_ext.scheduler import Scheduler, cost_model
from skrull_ext.train.job.skrull_config import SkrullConfig
from tests.unit_tests.chat_families import write_family

datasets = pytest.importorskip("datasets")

FIXTURE = assets.text_path("tiny_sft")


@pytest.fixture(scope="module")
def hf_cache(tmp_path_factory):
    """datasets' Arrow cache in a temporary folder, not the user's."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path_factory.mktemp("hf_cache")))
        yield


@pytest.fixture(scope="module")
def layouts(hf_cache, tmp_path_factory):
    """The fixture's records in every layout dataset = 'hf' reads, same order."""
    root = tmp_path_factory.mktemp("layouts")
    ds = datasets.load_dataset("json", data_files=[FIXTURE], split="train", on_mixed_types=None)
    n = len(ds)
    out = {"jsonl_file": FIXTURE}
    ds.to_parquet(str(root / "all.parquet"))
    out["parquet_file"] = str(root / "all.parquet")
    ds.save_to_disk(str(root / "saved"))
    out["save_to_disk"] = str(root / "saved")
    datasets.DatasetDict({"train": ds, "test": ds.select(range(3))}).save_to_disk(str(root / "saved_dict"))
    out["save_to_disk_dict"] = str(root / "saved_dict")
    arrow = [f for f in os.listdir(root / "saved") if f.endswith(".arrow")]
    shutil.copy(root / "saved" / arrow[0], root / "all.arrow")
    out["arrow_file"] = str(root / "all.arrow")
    split = root / "split"
    split.mkdir()
    ds.select(range(n // 2)).to_parquet(str(split / "train-00000-of-00002.parquet"))
    ds.select(range(n // 2, n)).to_parquet(str(split / "train-00001-of-00002.parquet"))
    ds.select(range(5)).to_parquet(str(split / "test-00000-of-00001.parquet"))
    out["split_folder"] = str(split)
    return out


def _source(tok, **kwargs):
    config = SkrullDataLoader.Config(**kwargs)
    return DATASETS[config.dataset](config, tok)


def _same_samples(a, b):
    assert len(a) == len(b)
    for r in range(len(a)):
        assert np.array_equal(a.ids_of(r), b.ids_of(r)) and np.array_equal(a.mask_of(r), b.mask_of(r))


@pytest.fixture(scope="module", params=["tiny_bpe", "qwen2_5"])
def tok(request, tmp_path_factory):
    """The shipped tokenizer (ChatML pieces) and one with a real chat template."""
    if request.param == "tiny_bpe":
        return LocalTokenizer.Config(path="tiny_bpe").build(tokenizer_path="")
    folder = write_family(str(tmp_path_factory.mktemp("qwen")), "qwen2_5")
    return LocalTokenizer.Config(path=folder).build(tokenizer_path="")


@pytest.mark.parametrize("layout", ["jsonl_file", "parquet_file", "arrow_file", "save_to_disk",
                                    "save_to_disk_dict", "split_folder"])
def test_every_layout_gives_the_jsonl_samples(layouts, tok, layout):
    want = _source(tok, dataset="jsonl", dataset_path=FIXTURE)
    got = _source(tok, dataset="hf", dataset_path=layouts[layout])
    _same_samples(got, want)
    assert sum(got.mask_of(r).any() for r in range(len(got))) == len(got)


def test_split_and_data_files_pick_the_rows(layouts, tok):
    test = _source(tok, dataset="hf", dataset_path=layouts["split_folder"], split="test")
    full = _source(tok, dataset="jsonl", dataset_path=FIXTURE)
    assert len(test) == 5 and all(np.array_equal(test.ids_of(i), full.ids_of(i)) for i in range(5))
    assert len(_source(tok, dataset="hf", dataset_path=layouts["save_to_disk_dict"], split="test")) == 3
    one = _source(tok, dataset="hf", dataset_path=layouts["split_folder"], data_files=["train-00001-*.parquet"])
    assert len(one) == len(full) - len(full) // 2
    assert [os.path.basename(f) for f in data_files(layouts["split_folder"])] == [
        "train-00000-of-00002.parquet", "train-00001-of-00002.parquet"]


def test_hf_through_the_dataloader_equals_jsonl(layouts, tok):
    """The scheduled steps (samples, placement, token counts) of a parquet job
    equal those of the JSONL job of the same records (one record is longer
    than the 512 tokens CP 2 holds: cut the same way from both)."""
    section = SkrullConfig(bucket_size=256, cost_model="h100-assumed", overlength="truncate")

    def steps(**kwargs):
        loader = SkrullDataLoader.Config(max_len=512, global_batch_size=8, **kwargs).build(
            dp_world_size=1, dp_rank=0, tokenizer=tok)
        loader.attach(Scheduler(section.scheduler_config(1, 2, lookahead=1), cost_model.preset("llama3-debug")), 0, 2)
        out = []
        for _ in range(3):
            step = loader.next_step()
            tokens = [loader.source[i].input.tolist() for i in step.samples]
            out.append((step.samples, list(step.plan.cp_rank), step.global_valid_tokens, tokens))
        return out

    assert steps(dataset="hf", dataset_path=layouts["parquet_file"]) == steps(dataset="jsonl", dataset_path=FIXTURE)


def test_bad_rows_and_paths_are_named(hf_cache, tmp_path, tok):
    rows = [{"prompt": "hi", "response": "hello"}, {"prompt": "a", "response": "b"}, {"prompt": "q", "response": " "}]
    path = tmp_path / "bad.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    with pytest.raises(DataError, match=r"bad.parquet row 2: message 1 \(assistant\) is empty"):
        _source(tok, dataset="hf", dataset_path=str(path))
    (tmp_path / "mixed.jsonl").write_text('{"text": "a"}\n{"text": ["b"]}\n')
    with pytest.raises(DataError, match=r"mixed.jsonl: datasets cannot read it: ArrowInvalid: .*changed from string"):
        _source(tok, dataset="hf", dataset_path=str(tmp_path / "mixed.jsonl"))
    (tmp_path / "mixed.jsonl").unlink()
    (tmp_path / "cut.jsonl").write_text('{"text": "a"}\n\n{"text": "b"}\n{"text": "c\n')  # a cut last line
    with pytest.raises(DataError, match=r"cut.jsonl:4: not valid JSON: Unterminated string"):  # was pyarrow's "row 2"
        _source(tok, dataset="hf", dataset_path=str(tmp_path / "cut.jsonl"))
    (tmp_path / "cut.jsonl").unlink()
    with pytest.raises(DataError, match=r"dataloader.dataset_path: '/no/such/data' is not a local file or folder"):
        _source(tok, dataset="hf", dataset_path="/no/such/data")
    (tmp_path / "rows.csv").write_text("prompt,response\nhi,hello\n")
    with pytest.raises(DataError, match=r"rows.csv: unsupported file type '.csv'"):
        _source(tok, dataset="hf", dataset_path=str(tmp_path / "rows.csv"))
    with pytest.raises(DataError, match=r"dataloader.split: 'validation' has no .* files under .*splits there: \['train'\]"):
        _source(tok, dataset="hf", dataset_path=str(tmp_path), split="validation", data_files=[])
    with pytest.raises(DataError, match=r"dataloader.data_files: 'nothing-\*.parquet' matches no file"):
        _source(tok, dataset="hf", dataset_path=str(tmp_path), data_files=["nothing-*.parquet"])


def test_jsonl_and_hf_read_other_formats_alike(hf_cache, tmp_path, tok):
    """A ShareGPT JSONL with renamed columns, read as JSONL and through datasets."""
    rows = [{"dialog": [{"speaker": "human", "text": f"Question {i}?"}, {"speaker": "gpt", "text": f"Answer {i}."}]}
            for i in range(4)]
    path = tmp_path / "sharegpt.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    columns = {"conversations": "dialog", "from": "speaker", "value": "text"}
    a = _source(tok, dataset="jsonl", dataset_path=str(path), columns=columns, system_prompt="Be brief.")
    b = _source(tok, dataset="hf", dataset_path=str(path), columns=columns, system_prompt="Be brief.")
    _same_samples(a, b)
    assert "Be brief." in tok.decode(a.ids_of(0).tolist())
