"""A resume on other data or another seed is caught (data/steps/data_order.py).

The loaders' checkpointed state records the data order it was written with
(``data_order``); loading it into a loader of another ``dataloader.seed``,
other data (another file, a changed one, another mixture weight) or other
synthetic draws stops in one line naming the key, both values and what to
do, in both batchings, with look-ahead on and off. The same data moved
elsewhere is the same order. A checkpoint written before the key loads, with
one warning line, through DCP itself (which loads exactly the keys the fresh
loader's state_dict names)."""

import hashlib
import logging
import os
import shutil

import numpy as np
import pytest

from skrull_ext.data.sources.mixture import MixSource
from skrull_ext.data.sources.tokenizer import LocalTokenizer
from skrull_ext.data.steps import data_order
from skrull_ext.data.steps.loader import SkrullDataLoader
from skrull_ext.data.steps.packed import PackedDataLoader
from skrull_ext.errors import DataError
from skrull_ext.scheduler import Scheduler, cost_model
from skrull_ext.train.job.skrull_config import SkrullConfig

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "fixtures", "accounting.jsonl")
GBS = 4
WHAT_TO_DO = (", and a loader's state (the samples read, look-ahead windows, epoch order) only fits the data order "
              "it was written with, so continuing would train some samples twice and others never; continue with ")
WEIGHTS = (" --checkpoint.initial_load_model_only")


@pytest.fixture(scope="module")
def tok():
    return LocalTokenizer.Config(path="tiny_bpe").build(tokenizer_path="")


def skrull(lookahead: int = 1, tok=None, **data):
    data = {"length_scale": 32.0, "max_len": 512, "vocab_size": 2048, **data}
    config = SkrullDataLoader.Config(global_batch_size=GBS, prefetch_steps=0, **data)
    out = config.build(dp_world_size=1, dp_rank=0, tokenizer=tok)
    section = SkrullConfig(bucket_size=512, cost_model="h100-assumed", lookahead=lookahead)
    out.attach(Scheduler(section.scheduler_config(1, 1), cost_model.preset("llama3-debug")), 0, 1)
    return out


def packed(tok=None, **data):
    data = {"length_scale": 32.0, "max_len": 128, "vocab_size": 2048, **data}
    out = PackedDataLoader.Config(global_batch_size=GBS, packing="rows", **data).build(
        dp_world_size=1, dp_rank=0, tokenizer=tok, seq_len=128, local_batch_size=GBS)
    out.set_overlength("truncate")
    return out


def trained(loader, steps: int) -> dict:
    for _ in range(steps):
        loader.next_step() if isinstance(loader, SkrullDataLoader) else next(iter(loader))
    return loader.state_dict()


def refusal(key: str, now: str, then: str, keep: str, step: int = 2, path: str = "<its step-2 folder>") -> str:
    return (f"{key} = {now}: the checkpoint of step {step} was written with {key} = {then}{WHAT_TO_DO}{keep}, or "
            f"train on from its weights in a new run (another dump_folder) with --checkpoint.initial_load_path "
            f"{path}{WEIGHTS}")


def lengths_hash(lengths) -> str:
    """The hash restated: BLAKE2b-64 of the lengths as little-endian int64."""
    return hashlib.blake2b(np.asarray(lengths, dtype="<i8").tobytes(), digest_size=8).hexdigest()


# ---------------------------------------------------------------- the seed, both batchings, look-ahead on/off


@pytest.mark.parametrize("make", ["skrull", "skrull-lookahead", "packed"])
def test_another_seed_is_refused_at_load_naming_both_values(make):
    build = {"skrull": skrull, "skrull-lookahead": lambda **d: skrull(4, **d), "packed": packed}[make]
    state = trained(build(), 2)
    assert state["step"] == 2 and data_order.KEY in state
    with pytest.raises(DataError) as info:
        build(seed=7).load_state_dict(state)
    assert str(info.value) == refusal("dataloader.seed", "7", "0", "--dataloader.seed 0")
    again = build()  # the seed it was written with: it continues
    again.load_state_dict(state)
    assert again.step == 2 and again.state_dict() == state


def test_either_batching_continues_the_others_checkpoint_and_refuses_its_other_seed():
    # The keys are shared (loader.py's state_dict): the check holds across the batchings too.
    state = trained(skrull(4), 4)  # at a window's end, which torchtitan's batching may continue
    packed().load_state_dict(state)
    with pytest.raises(DataError, match=r"^dataloader\.seed = 3: the checkpoint of step 4 was written with "
                                        r"dataloader\.seed = 0, "):
        packed(seed=3).load_state_dict(state)
    state = trained(packed(), 3)
    skrull().load_state_dict(state)
    with pytest.raises(DataError, match=r"^dataloader\.seed = 3: the checkpoint of step 3 "):
        skrull(seed=3).load_state_dict(state)


def test_a_data_mismatch_is_named_before_the_batchings_own_refusals():
    # Inside a look-ahead window torchtitan's batching refuses the checkpoint; of another seed, the seed is named.
    state = trained(skrull(4), 2)
    with pytest.raises(DataError, match=r"^dataloader\.seed = 1: "):
        packed(seed=1).load_state_dict(state)
    with pytest.raises(DataError, match=r"^the checkpoint of step 2 was saved inside a look-ahead window"):
        packed().load_state_dict(state)


# ---------------------------------------------------------------- the data


def test_synthetic_draws_are_their_length_distribution_and_the_keys_that_shape_them():
    state = trained(skrull(), 2)
    with pytest.raises(DataError) as info:
        skrull(length_scale=16.0).load_state_dict(state)
    assert str(info.value) == refusal("dataloader.length_scale", "16", "32", "--dataloader.length_scale 32")
    with pytest.raises(DataError) as info:
        skrull(min_len=3).load_state_dict(state)
    assert str(info.value) == refusal("dataloader.min_len", "3", "2", "--dataloader.min_len 2")
    skrull(max_len=256).load_state_dict(state)  # a limit on the same samples, not other ones
    with pytest.raises(DataError) as info:
        skrull(lengths="wikipedia_en_dumpslice.qwen").load_state_dict(state)
    src, now = skrull().source, skrull(lengths="wikipedia_en_dumpslice.qwen").source
    assert str(info.value) == refusal(
        "dataloader.lengths", f"'wikipedia_en_dumpslice.qwen' ({len(now.lengths)} lengths #{lengths_hash(now.lengths)})",
        f"'sharegpt_v3_conversations.qwen' ({len(src.lengths)} lengths #{lengths_hash(src.lengths)})",
        "dataloader.lengths as it was written ('sharegpt_v3_conversations.qwen' "
        f"({len(src.lengths)} lengths #{lengths_hash(src.lengths)}))")


def _jsonl(tmp_path, name: str, lines: list[str]) -> str:
    path = tmp_path / name
    path.write_text("".join(lines))
    return str(path)


def test_another_file_or_a_changed_one_is_refused_and_the_same_data_moved_is_not(tmp_path, tok):
    with open(FIXTURE) as f:
        lines = f.readlines()
    first = _jsonl(tmp_path, "a.jsonl", lines)
    data = dict(dataset="jsonl", token_cache_dir=str(tmp_path / "tokens"), length_scale=1.0)
    state = trained(skrull(tok=tok, dataset_path=first, **data), 1)
    old = skrull(tok=tok, dataset_path=first, **data).source

    def said(src) -> str:
        return f"{len(src)} samples, lengths #{lengths_hash(src._lengths)}"

    # The same records in another folder: the same order; a resume goes on.
    os.mkdir(tmp_path / "moved")
    moved = shutil.copy(first, tmp_path / "moved" / "a.jsonl")
    skrull(tok=tok, dataset_path=str(moved), **data).load_state_dict(state)
    # One record fewer, the same records reordered, one record edited: refused, naming both.
    for name, changed in [("fewer", lines[:-1]), ("reordered", lines[1:] + lines[:1]),
                          ("edited", [lines[0].replace("Hi, who", "Hello there, who"), *lines[1:]])]:
        path = _jsonl(tmp_path, f"{name}.jsonl", changed)
        loader = skrull(tok=tok, dataset_path=path, **data)
        with pytest.raises(DataError) as info:
            loader.load_state_dict(state)
        was = f"{first!r} ({said(old)})"
        assert str(info.value) == refusal("dataloader.dataset_path", f"{path!r} ({said(loader.source)})", was,
                                          f"dataloader.dataset_path as it was written ({was})",
                                          step=1, path="<its step-1 folder>"), name
    assert said(old) == "8 samples, lengths #" + lengths_hash(old._lengths)


def test_the_token_store_and_tokenizing_in_memory_are_the_same_order(tmp_path, tok):
    # A resume may switch dataloader.token_cache: the same records, the same lengths, the same hash.
    data = dict(dataset="jsonl", dataset_path=FIXTURE, token_cache_dir=str(tmp_path))
    assert skrull(tok=tok, **data).data_order == skrull(tok=tok, token_cache=False, **data).data_order


def test_a_mixtures_weights_epochs_and_sources_are_its_order(tmp_path, tok):
    def mix(*sources):
        return dict(dataset="mixture", sources=list(sources), token_cache_dir=str(tmp_path), length_scale=1.0)

    a, b = MixSource(path=FIXTURE, name="notes", weight=3), MixSource(path="tiny_sft", weight=1)
    state = trained(skrull(tok=tok, **mix(a, b)), 2)
    skrull(tok=tok, **mix(MixSource(path=FIXTURE, name="notes", weight=6), MixSource(path="tiny_sft", weight=2))
           ).load_state_dict(state)  # the same shares
    with pytest.raises(DataError) as info:
        skrull(tok=tok, **mix(a, MixSource(path="tiny_sft", weight=2))).load_state_dict(state)
    assert str(info.value) == refusal("dataloader.sources[0].weight", "0.6 of the draws", "0.75 of the draws",
                                      "dataloader.sources[0].weight as it was written (0.75 of the draws)")
    with pytest.raises(DataError, match=r"^dataloader\.sources\[1\]\.epochs = at most 16 samples: the checkpoint "
                                        r"of step 2 was written with dataloader\.sources\[1\]\.epochs = no limit,"):
        skrull(tok=tok, **mix(a, MixSource(path="tiny_sft", weight=1, epochs=0.5))).load_state_dict(state)
    with pytest.raises(DataError, match=r"^dataloader\.sources = notes: the checkpoint of step 2 was written with "
                                        r"dataloader\.sources = notes, tiny_sft,"):
        skrull(tok=tok, **mix(a)).load_state_dict(state)
    with pytest.raises(DataError, match=r"^dataloader\.dataset = synthetic: the checkpoint of step 2 was written "
                                        r"with dataloader\.dataset = mixture, .* continue with --dataloader\.dataset "
                                        r"mixture, or"):
        skrull().load_state_dict(state)


# ---------------------------------------------------------------- a checkpoint written before the key


def test_a_state_without_the_key_loads_with_one_warning_line(caplog):
    state = trained(skrull(4), 2)
    del state[data_order.KEY]
    loader = skrull(4, seed=5)
    with caplog.at_level(logging.WARNING):
        loader.load_state_dict(state)
    said = [r.getMessage() for r in caplog.records if "data order" in r.getMessage()]
    assert said == ["dataloader: the checkpoint of step 2 records no data order (written before "
                    "dataloader.data_order was saved), so this run cannot check that it reads the same data with "
                    "the same dataloader.seed; if either changed, some samples are trained twice and others never"]
    assert loader.step == 2 and data_order.KEY in loader.state_dict()


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")  # dcp in one process
@pytest.mark.parametrize("make", ["skrull", "packed"])
def test_dcp_loads_a_checkpoint_without_the_key_when_the_loader_is_told(tmp_path, make, caplog):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    from skrull_ext.train.job.resume_checks import dataloader_keys

    build = skrull if make == "skrull" else packed
    state = trained(build(), 2)
    old, new = str(tmp_path / "old"), str(tmp_path / "new")
    dcp.save({"dataloader": {k: v for k, v in state.items() if k != data_order.KEY}}, checkpoint_id=old, no_dist=True)
    dcp.save({"dataloader": build()}, checkpoint_id=new, no_dist=True)  # a fresh loader's: step 0
    assert data_order.KEY not in dataloader_keys(old) and data_order.KEY in dataloader_keys(new)
    # Untold, DCP asks the old checkpoint for the key and fails (why the trainer tells the loader).
    with pytest.raises(CheckpointException, match="Missing key in checkpoint state_dict: dataloader.data_order"):
        dcp.load({"dataloader": build()}, checkpoint_id=old, no_dist=True)
    model = build()
    model.expect_checkpoint(old, set())  # a checkpoint without dataloader state is never loaded into it
    assert data_order.KEY in model.state_dict()
    loader = build()
    loader.expect_checkpoint(old, dataloader_keys(old))
    with caplog.at_level(logging.WARNING):
        dcp.load({"dataloader": loader}, checkpoint_id=old, no_dist=True)
    assert loader.step == 2 and sum("records no data order" in r.getMessage() for r in caplog.records) == 1
    assert loader.state_dict() == state  # its next checkpoint records the key again
    # A checkpoint with the key, loaded by a loader of another seed: refused, naming the folder.
    other = build(seed=1)
    other.expect_checkpoint(new, dataloader_keys(new))
    with pytest.raises(DataError) as info:
        dcp.load({"dataloader": other}, checkpoint_id=new, no_dist=True)
    assert str(info.value) == refusal("dataloader.seed", "1", "0", "--dataloader.seed 0", step=0, path=new)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")  # dcp in one process
def test_check_continue_names_the_checkpoint_the_trainer_tells_the_loader(tmp_path):
    from types import SimpleNamespace

    from skrull_ext.train.job.resume_checks import check_continue

    def config(**ckpt):
        return SimpleNamespace(dump_folder=str(tmp_path), training=SimpleNamespace(steps=10), checkpoint=SimpleNamespace(
            **{"enable": True, "create_seed_checkpoint": False, "folder": "checkpoint", "load_step": -1,
               "initial_load_path": None, "initial_load_model_only": True, "initial_load_in_hf": False, **ckpt}))

    assert check_continue(config()) is None  # a fresh start
    whole = tmp_path / "elsewhere"
    whole.mkdir()
    (whole / ".metadata").write_text("")
    # torchtitan's initial load of a whole training state continues its data too; weights only do not.
    assert check_continue(config(initial_load_path=str(whole), initial_load_model_only=False)).path == str(whole)
    assert check_continue(config(initial_load_path=str(whole))) is None
    (tmp_path / "checkpoint" / "step-0").mkdir(parents=True)
    (tmp_path / "checkpoint" / "step-0" / ".metadata").write_text("")
    assert check_continue(config()) is None  # a seed checkpoint: torchtitan loads its model only
    for step in (2, 4):
        (tmp_path / "checkpoint" / f"step-{step}").mkdir(parents=True)
        (tmp_path / "checkpoint" / f"step-{step}" / ".metadata").write_text("")
    assert check_continue(config()).path == str(tmp_path / "checkpoint" / "step-4")
    assert check_continue(config()).dataloader_keys is None  # an unreadable .metadata: DCP's own load says why
    assert check_continue(config(load_step=2)).path == str(tmp_path / "checkpoint" / "step-2")
    # A readable one: its dataloader keys, read once there, for the trainer to hand the loader.
    import torch.distributed.checkpoint as dcp

    dcp.save({"dataloader": {"step": 6, "lookahead": "[]", data_order.KEY: "{}"}},
             checkpoint_id=str(tmp_path / "checkpoint" / "step-6"),
             no_dist=True)
    assert check_continue(config()).dataloader_keys == {"step", "lookahead", data_order.KEY}
