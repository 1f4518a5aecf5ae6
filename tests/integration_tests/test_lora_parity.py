"""LoRA under Skrull matches one-process LoRA training, and leaves the base alone.

From one seed checkpoint of the LoRA debug job (float32, gloo): the same job
in one process with torchtitan's batching (``--skrull.no-enable``) vs Skrull
at CP=2 (2 processes). Same standard as test_parity_skrull.py: the 5 losses
within 1e-4 and every trainable parameter's gradient (the adapters; the
frozen base has none) at the check step. After the 5 steps the CP=2 run's
base weights are bitwise those of the seed, the adapters have moved, and
the run wrote its peft adapter folder.
"""

import os

import pytest
import torch

from skrull_ext.lora.config import HF_TO_TITAN
from tests.integration_tests.conftest import CHECK_STEP, STEPS
from tests.integration_tests.launch import REPO, assert_same_grads, torchrun, train_from_seed
from tests.integration_tests.test_parity_skrull import GRAD, _check_exact_and_mixed

LORA = ["--config-file", os.path.join(REPO, "skrull_ext", "jobs", "debug_cpu_lora.toml")]


def _model_tensors(checkpoint: str, out: str) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(checkpoint, out)
    state = torch.load(out, weights_only=False)
    return {k: v for k, v in state.items() if isinstance(v, torch.Tensor) and k.startswith(("layers.", "tok_", "norm", "lm_head"))}


@pytest.fixture(scope="module")
def lora_runs(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("lora"))
    torchrun(1, "skrull_ext.train", [*LORA, "--dump_folder", os.path.join(workdir, "seed"),
             "--checkpoint.enable", "--checkpoint.create_seed_checkpoint"], cwd=workdir)
    seed = os.path.join(workdir, "seed", "checkpoint", "step-0")
    ref = train_from_seed(workdir, "ref", 1, "skrull_ext.train", LORA, seed, STEPS,
                          extra=["--skrull.no-enable"], grads_at=CHECK_STEP)
    cp2 = train_from_seed(workdir, "cp2", 2, "skrull_ext.train", LORA, seed, STEPS,
                          extra=["--parallelism.context_parallel_degree", "2"],
                          grads_at=CHECK_STEP, save_every=STEPS)
    return workdir, seed, ref, cp2


@pytest.mark.slow
def test_lora_parity_cp2(lora_runs):
    workdir, seed, ref, cp2 = lora_runs
    print(f"1-proc LoRA {ref.losses}\nskrull cp2  {cp2.losses}")
    # each step is another batch and the adapters start near zero: five losses need not fall;
    # that training moved the adapters (and nothing else) is the next test
    assert len(cp2.losses) == STEPS == len(ref.losses)
    assert max(abs(a - b) for a, b in zip(ref.losses, cp2.losses)) < 1e-4
    _check_exact_and_mixed(cp2)
    grads = torch.load(cp2.grads)
    assert grads and all(".lora_a." in k or ".lora_b." in k for k in grads), sorted(grads)[:5]
    assert len(grads) == 2 * 6 * len(set(HF_TO_TITAN.values()))  # A and B, 6 layers, 5 linears each
    worst, rel = assert_same_grads(cp2.grads, ref.grads, **GRAD)
    print(f"step {CHECK_STEP} adapter gradients vs 1-proc: max |diff| {worst:.3g}, relative norm {rel:.3g}")


@pytest.mark.slow
def test_lora_parity_cp2_base_unchanged_and_adapter_written(lora_runs):
    workdir, seed, ref, cp2 = lora_runs
    before = _model_tensors(seed, os.path.join(workdir, "seed.pt"))
    after = _model_tensors(os.path.join(cp2.dump, "checkpoint", f"step-{STEPS}"), os.path.join(workdir, "cp2.pt"))
    assert before.keys() == after.keys()
    base = [k for k in before if ".lora_" not in k]
    assert len(base) > 50
    changed = [k for k in base if not torch.equal(before[k], after[k])]
    assert not changed, f"base weights changed: {changed[:5]}"
    moved = [k for k in before if ".lora_b." in k and not torch.equal(before[k], after[k])]
    assert len(moved) == 6 * len(set(HF_TO_TITAN.values()))
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        assert os.path.isfile(os.path.join(cp2.dump, "lora_adapter", name)), name
