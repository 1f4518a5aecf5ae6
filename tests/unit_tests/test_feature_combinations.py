"""Where features meet: what a crossing of policies, batchings, layouts,
LoRA, activation checkpointing and resume found at the edges, one case per
mechanism (how flags reach nested sections, what the checkpointer's keys
imply, what state each batching saves, where the batch shape is checked,
what seeds which draw). The multi-process halves are in
tests/integration_tests/test_accounting_run.py (the samples_* tags under
both batchings) and test_resume.py (a Skrull checkpoint continued under
torchtitan's batching)."""

import json
import os
import textwrap

import pytest
import torch

from skrull_ext.data.steps.packed import PackedDataLoader
from skrull_ext.data.steps.loader import SkrullDataLoader
from skrull_ext.data.sources.tokenizer import LocalTokenizer
from skrull_ext.errors import DataError, JobFileError
from skrull_ext.lora.apply import with_lora
from skrull_ext.lora.config import LoRAConfig
from skrull_ext.train.job.job_file import load_config, load_job

JOBS = os.path.join(os.path.dirname(__file__), "..", "..", "skrull_ext", "jobs")
DEBUG = os.path.join(JOBS, "debug_cpu.toml")


def _job(tmp_path, extra: str) -> str:
    with open(DEBUG) as f:
        body = f.read().replace("[checkpoint]\nenable = false\n", "")
    profile = os.path.abspath(os.path.join(JOBS, "..", "..", "profiles", "cpu-debug-gloo2.toml"))
    body = body.replace('"../../profiles/cpu-debug-gloo2.toml"', repr(profile).replace("'", '"'))
    path = tmp_path / "job.toml"
    path.write_text(body + textwrap.dedent(extra))
    return str(path)


def test_saving_keys_without_the_checkpointer_are_refused(tmp_path):
    """interval and last_save_in_hf without enable trained and saved nothing, silently."""
    job = _job(tmp_path, "[checkpoint]\ninterval = 10\nlast_save_in_hf = true\n")
    with pytest.raises(JobFileError) as info:
        load_config(["--config-file", job])
    assert str(info.value) == (
        "checkpoint.enable = False: [checkpoint] sets interval = 10, last_save_in_hf = True, which only act when "
        "the checkpointer runs: nothing would be saved; add --checkpoint.enable (or [checkpoint] enable = true), "
        "or remove them")
    config = load_config(["--config-file", job, "--checkpoint.enable"])
    assert config.checkpoint.enable and config.checkpoint.last_save_model_only


def test_activation_checkpoint_flags_reach_the_section():
    from torchtitan.distributed.activation_checkpoint import FullAC

    config = load_config(["--config-file", DEBUG, "--activation_checkpoint.kind", "full",
                          "--activation_checkpoint.preserve_rng_state"])
    assert isinstance(config.activation_checkpoint, FullAC.Config)
    assert config.activation_checkpoint.preserve_rng_state


@pytest.fixture(scope="module")
def tok():
    return LocalTokenizer.Config(path="tiny_bpe").build(tokenizer_path="")


def _packed(tok, packing="rows", B=2, S=128, max_len=128, batch=4):
    loader = PackedDataLoader.Config(dataset="jsonl", dataset_path="tiny_sft", max_len=max_len,
                                     global_batch_size=batch, packing=packing).build(
        dp_world_size=1, dp_rank=0, tokenizer=tok, seq_len=S, local_batch_size=B)
    loader.set_overlength("truncate")
    return loader


def test_both_batchings_save_the_same_keys_and_continue_each_other(tok):
    """DCP loads the keys of the fresh loader: Skrull's lacked 'carry', so its
    checkpoint failed under torchtitan's batching ('Missing key ... dataloader.carry')."""
    skrull = SkrullDataLoader.Config(dataset="jsonl", dataset_path="tiny_sft", max_len=128,
                                     global_batch_size=4).build(dp_world_size=1, dp_rank=0, tokenizer=tok)
    packed = _packed(tok, B=4)
    assert set(skrull.state_dict()) == set(packed.state_dict())
    it = iter(packed)
    next(it), next(it)
    skrull.load_state_dict(packed.state_dict())  # rows packing carries nothing
    assert skrull.state_dict() == packed.state_dict()
    fresh = _packed(tok, B=4)
    fresh.load_state_dict(skrull.state_dict())
    assert fresh.state_dict() == packed.state_dict()


def test_a_stream_checkpoint_that_carries_pieces_is_refused_by_skrull(tok):
    stream = _packed(tok, "stream", B=1, S=96)
    it = iter(stream)
    next(it)
    state = stream.state_dict()
    assert json.loads(state["carry"]), "the fixture's first step should carry a piece"
    skrull = SkrullDataLoader.Config(dataset="jsonl", dataset_path="tiny_sft", max_len=128,
                                     global_batch_size=4).build(dp_world_size=1, dp_rank=0, tokenizer=tok)
    with pytest.raises(DataError, match=r"^the checkpoint of step 1 was packed by torchtitan's batching .* carries \d+ piece\(s\) "
                                        r"of sequences into the next step, .*--skrull.no-enable and the same "
                                        r"--dataloader.packing$"):
        skrull.load_state_dict(state)


def test_a_global_batch_over_its_rows_is_refused_before_step_one(tok):
    """Found at the step that overflowed, after earlier steps had trained."""
    loader = _packed(tok, B=1, S=128, batch=4)
    fits = next(s for s in range(1, 50) if sum(min(n, 128) for _, n in loader.step_lengths(s)) > 128)
    with pytest.raises(DataError, match=rf"^step {fits} of 50: global batch \(\d+ tokens, longest \d+\) does not "
                                        r"fit 1 rows of seq_len=128; raise training.seq_len"):
        loader.check_rows(1, 50)
    _packed(tok, B=4, S=128, batch=4).check_rows(1, 50)  # 4 rows hold any 4 samples of <= 128 tokens
    _packed(tok, "stream", B=1, S=128).check_rows(1, 50)  # a stream cuts: nothing to refuse


def _init(spec):
    with torch.device("meta"):
        model = spec.model.build()
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    model.init_states()
    return model.state_dict()


def test_adapters_do_not_change_the_base_draw():
    """Under one seed, adding [lora] drew other base weights (step-1 loss 8.13606
    without, 8.08156 with); lora_a now draws from a generator of its own."""
    spec = load_job(DEBUG).model_spec
    base, lora = _init(spec), _init(with_lora(spec, LoRAConfig(enable=True, rank=4)))
    assert base and all(torch.equal(base[k], lora[k]) for k in base)
    adapters = [v for k, v in lora.items() if k.endswith("lora_a.weight")]
    assert len(adapters) == 30 and all(v.abs().max() > 0 for v in adapters)
    assert not torch.equal(adapters[0], adapters[1][: adapters[0].shape[0], : adapters[0].shape[1]])
    again = _init(with_lora(spec, LoRAConfig(enable=True, rank=4)))
    assert all(torch.equal(again[k], v) for k, v in lora.items())  # deterministic
