"""The profile times the model the trainer trains, wrapped the same way (profile/model.py).

torchtitan 0.3.0's llama3/qwen3 parallelize functions apply FSDP at every data-parallel degree,
one included ("Always run apply_fsdp_to_decoder -- with shard_degree=1 it is a no-op for the
all-gather but still installs the MixedPrecisionPolicy"; ParallelDims keeps the "fsdp" mesh at
size 1), so a one-process job trains float32 DTensor parameters that FSDP copies, and casts to
``mixed_precision_param``, before each unit runs. The profile at one rank once timed an unwrapped
model built in the compute dtype instead, leaving those copies and hooks out of every term."""

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
JOBS = REPO / "skrull_ext" / "jobs"
WORKER = "tests.unit_tests.wrapping_worker"
UNITS = ["", "tok_embeddings", *(f"layers.{i}" for i in range(6)), "norm", "lm_head"]


def _built(tmp_path, job: str, *flags: str) -> dict:
    """wrapping_worker.py's JSON line: a world of one, forked from the suite's warm process
    (tests/integration_tests/forked.py: torch and the trainer imported once, not per job)."""
    from tests.integration_tests import forked
    from tests.integration_tests.launch import _env

    args = [str(tmp_path / "dump"), "--config-file", str(JOBS / job), *flags]
    rc, out = forked.launch(1, WORKER, args, str(tmp_path), _env(), 600)
    assert rc == 0, out[-8000:]
    return json.loads([line for line in out.splitlines() if line.startswith('{"trainer": ')][-1])


@pytest.mark.slow
@pytest.mark.parametrize("job, flags, compute, reshard", [
    ("debug_cpu.toml", (), "torch.float32", True),  # as shipped
    # adapters on a frozen base, bf16 compute over float32 masters, and the reshard policy carried through
    ("debug_cpu_lora.toml", ("--training.mixed_precision_param", "bfloat16",
                             "--parallelism.fsdp_reshard_after_forward", "never"), "torch.bfloat16", False),
])
def test_the_profile_wraps_the_model_as_the_trainer_does_at_one_rank(tmp_path, job, flags, compute, reshard):
    built = _built(tmp_path, job, *flags)
    trainer, profile = built["trainer"], built["profile"]
    # what the trainer does at world 1: FSDP on the root, each block, the embedding, norm + head
    assert list(trainer["units"]) == UNITS
    for name, unit in trainer["units"].items():
        assert unit["param_dtype"] == compute and unit["reduce_dtype"] == "torch.float32", name
        assert unit["cast_forward_inputs"] is False, name
        if name.startswith("layers.") or name == "tok_embeddings":
            assert unit["reshard_after_forward"] is reshard and unit["mesh_size"] == 1, name
    assert {v.split(" frozen")[0] for v in trainer["params"].values()} == {"torch.float32 DTensor"}
    assert any(v.endswith(" frozen") for v in trainer["params"].values()) == (job == "debug_cpu_lora.toml")
    # and the profile's model is wrapped the same way, unit for unit and parameter for parameter
    assert profile == trainer


@pytest.mark.slow
def test_a_tied_qwen2_5_is_wrapped_alike(tmp_path):
    """The GPU jobs' Qwen2.5-0.5B ties its head to its embedding: torchtitan then shards the
    embedding, the final norm and the head as one unit, kept unsharded from the forward to the
    backward (reshard_after_forward only under "always"). A tiny random one (HF folder, bf16)."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.Qwen2Config(vocab_size=2048, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                                      rms_norm_eps=1e-6, tie_word_embeddings=True, rope_theta=1e6)
    transformers.Qwen2ForCausalLM(config).save_pretrained(tmp_path / "hf")
    built = _built(tmp_path, "debug_cpu.toml", "--model.hf_path", str(tmp_path / "hf"), "--checkpoint.enable",
                   "--skrull.cost_model", "h100-assumed", "--training.mixed_precision_param", "bfloat16")
    trainer = built["trainer"]
    assert list(trainer["units"]) == ["", "tok_embeddings", "layers.0", "layers.1", "norm", "lm_head"]
    assert trainer["units"]["tok_embeddings"]["reshard_after_forward"] is False  # one unit with the head
    assert trainer["units"]["layers.0"]["reshard_after_forward"] is True
    assert {u["param_dtype"] for u in trainer["units"].values()} == {"torch.bfloat16"}
    assert built["profile"] == trainer


def test_wrapping_of_a_plain_model_has_no_units():
    import torch

    from skrull_ext.profile.model import wrapping, wrapping_line

    model = torch.nn.Linear(2, 3).to(torch.bfloat16)
    model.bias.requires_grad_(False)
    assert wrapping(model) == {"units": {}, "params": {"weight": "torch.bfloat16", "bias": "torch.bfloat16 frozen"}}
    assert wrapping_line(model) == "no FSDP"


def test_a_one_process_profile_on_cuda_makes_an_nccl_group(monkeypatch):
    """The resolved CUDA setting, checked here without a GPU: a one-process profile (no launcher) on a
    CUDA device makes the one-rank group over NCCL, as the trainer's torchrun launch of one GPU does
    (gloo cannot gather CUDA tensors); on CPU over gloo; and none where a launch already made one."""
    import torch
    import torch.distributed as dist

    from skrull_ext.profile import model

    made = []
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kwargs: made.append(
        (backend, kwargs["rank"], kwargs["world_size"])))
    assert model._process_group(torch.device("cuda", 0)) and model._process_group(torch.device("cpu"))
    assert made == [("nccl", 0, 1), ("gloo", 0, 1)]
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    assert not model._process_group(torch.device("cuda", 0)) and len(made) == 2
