"""LoRA under Skrull matches one-process LoRA training, and leaves the base alone.

From one seed checkpoint of the LoRA debug job (float32, gloo): the same job
in one process with torchtitan's batching (``--skrull.no-enable``) vs Skrull
at CP=2 (2 processes) and at DP=2 x CP=2 (4 processes, FSDP over both).
Same standard as test_parity_skrull.py: the 5 losses within 1e-4 and every
trainable parameter's gradient (the adapters; the frozen base has none) at
the check step. After the 5 steps each Skrull run's base weights are
bitwise those of the seed and its adapters have moved; the CP=2 run wrote
its peft adapter folder. The seed checkpoint and the 1-process reference
are made once for the module.
"""

import os

import pytest
import torch

from skrull_ext.lora.config import HF_TO_TITAN
from tests.integration_tests.conftest import CHECK_STEP, STEPS
from tests.integration_tests.launch import REPO, assert_same_grads, torchrun, train_from_seed
from tests.integration_tests.test_parity_skrull import GRAD, _check_exact_and_mixed

LORA = ["--config-file", os.path.join(REPO, "skrull_ext", "jobs", "debug_cpu_lora.toml"), "--skrull.lookahead", "1"]
"""Look-ahead off: each step is compared with the reference's step of the same samples."""


def _model_tensors(checkpoint: str, out: str) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(checkpoint, out)
    state = torch.load(out, weights_only=False)
    return {k: v for k, v in state.items() if isinstance(v, torch.Tensor) and k.startswith(("layers.", "tok_", "norm", "lm_head"))}


@pytest.fixture(scope="module")
def lora_reference(tmp_path_factory):
    """(workdir, seed checkpoint, the 1-process LoRA run), shared by every parity run here."""
    workdir = str(tmp_path_factory.mktemp("lora"))
    torchrun(1, "skrull_ext.train", [*LORA, "--dump_folder", os.path.join(workdir, "seed"),
             "--checkpoint.enable", "--checkpoint.create_seed_checkpoint"], cwd=workdir)
    seed = os.path.join(workdir, "seed", "checkpoint", "step-0")
    ref = train_from_seed(workdir, "ref", 1, "skrull_ext.train", LORA, seed, STEPS,
                          extra=["--skrull.no-enable"], grads_at=CHECK_STEP)
    return workdir, seed, ref


def _skrull_run(lora_reference, name: str, nproc: int, extra: list[str]):
    workdir, seed, _ = lora_reference
    return train_from_seed(workdir, name, nproc, "skrull_ext.train", LORA, seed, STEPS, extra=extra,
                           grads_at=CHECK_STEP, save_every=STEPS)


@pytest.fixture(scope="module")
def lora_cp2(lora_reference):
    return _skrull_run(lora_reference, "cp2", 2, ["--parallelism.context_parallel_degree", "2"])


@pytest.fixture(scope="module")
def lora_dp2_cp2(lora_reference):
    return _skrull_run(lora_reference, "dp2cp2", 4, ["--parallelism.context_parallel_degree", "2",
                                                     "--parallelism.data_parallel_shard_degree", "2"])


@pytest.fixture(scope="module")
def lora_cp2_head_chunks(lora_reference):
    """The head and loss in chunks of 48 tokens (train/head_loss.py); the reference's head is unchunked."""
    return _skrull_run(lora_reference, "cp2_head_chunks", 2, ["--parallelism.context_parallel_degree", "2",
                                                              "--loss.chunk_tokens", "48"])


def _matches_reference(run, ref, name: str) -> None:
    print(f"1-proc LoRA  {ref.losses}\nskrull {name:6s}{run.losses}")
    # each step is another batch and the adapters start near zero: five losses need not fall;
    # that training moved the adapters (and nothing else) is _base_unchanged
    assert len(run.losses) == STEPS == len(ref.losses)
    assert max(abs(a - b) for a, b in zip(ref.losses, run.losses)) < 1e-4, f"{ref.losses} vs {run.losses}"
    _check_exact_and_mixed(run)
    grads = torch.load(run.grads)
    assert grads and all(".lora_a." in k or ".lora_b." in k for k in grads), sorted(grads)[:5]
    assert len(grads) == 2 * 6 * len(set(HF_TO_TITAN.values()))  # A and B, 6 layers, 5 linears each
    worst, rel = assert_same_grads(run.grads, ref.grads, **GRAD)
    print(f"step {CHECK_STEP} {name} adapter gradients vs 1-proc: max |diff| {worst:.3g}, relative norm {rel:.3g}")


def _base_unchanged(lora_reference, run, name: str) -> None:
    workdir, seed, _ = lora_reference
    before = _model_tensors(seed, os.path.join(workdir, "seed.pt"))
    after = _model_tensors(os.path.join(run.dump, "checkpoint", f"step-{STEPS}"), os.path.join(workdir, f"{name}.pt"))
    assert before.keys() == after.keys()
    base = [k for k in before if ".lora_" not in k]
    assert len(base) > 50
    changed = [k for k in base if not torch.equal(before[k], after[k])]
    assert not changed, f"{name}: base weights changed: {changed[:5]}"
    moved = [k for k in before if ".lora_b." in k and not torch.equal(before[k], after[k])]
    assert len(moved) == 6 * len(set(HF_TO_TITAN.values()))


@pytest.mark.slow
def test_lora_parity_cp2(lora_reference, lora_cp2):
    _matches_reference(lora_cp2, lora_reference[2], "cp2")


@pytest.mark.slow
def test_lora_parity_cp2_base_unchanged_and_adapter_written(lora_reference, lora_cp2):
    _base_unchanged(lora_reference, lora_cp2, "cp2")
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        assert os.path.isfile(os.path.join(lora_cp2.dump, "lora_adapter", name)), name


@pytest.mark.slow
def test_lora_parity_dp2_cp2(lora_reference, lora_dp2_cp2):
    """4 processes: FSDP shards the frozen base and the adapters over DP x CP; Skrull
    plans each DP rank's share of the global batch over its CP pair."""
    _matches_reference(lora_dp2_cp2, lora_reference[2], "dp2cp2")
    _base_unchanged(lora_reference, lora_dp2_cp2, "dp2cp2")


@pytest.mark.slow
def test_lora_parity_cp2_head_chunks(lora_reference, lora_cp2_head_chunks):
    assert "head and loss in chunks of 48 tokens" in lora_cp2_head_chunks.output
    _matches_reference(lora_cp2_head_chunks, lora_reference[2], "cp2 chunked head")
