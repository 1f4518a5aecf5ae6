"""LoRA under Skrull matches one-process LoRA training, and leaves the base alone.

From one seed checkpoint of the LoRA debug job (float32, gloo): the same job
in one process with torchtitan's batching (``--skrull.no-enable``) vs Skrull
at CP=2 (2 processes, FSDP over the CP ranks). Every run adapts the head too
(``lm_head`` besides the seven decoder linears). The second run puts the LoRA
head under tensor parallelism: TP 2 x CP 2 (4 processes) with the head and
loss in chunks of 48 tokens, where
torchtitan shards the head by vocabulary rows and its ``lora_b`` the same
(``lora_a`` replicated), and each chunk applies base weight and adapters as
DTensors (train/head_loss.py pass_head_through). Same standard as
test_parity_skrull.py: every step's loss within 1e-4 and every trainable
parameter's gradient (the adapters; the frozen base has none) at the check
step. After the STEPS steps each Skrull run's base weights are bitwise those of
the seed and its adapters have moved; the CP=2 run wrote its peft adapter
folder; the TP run's merged model, gathered from the TP shards as it ends,
is the export of its own last checkpoint (skrull_ext.export, one process)
to the bit, and the CP=2 run's to float rounding; its peft adapter folder
is the CP=2 run's to float rounding. The seed checkpoint and the
1-process reference are made once for the module.

No DP=2 x CP=2 LoRA run: what it added to these two is FSDP over 4 ranks
instead of 2 and each DP rank's share planned over its CP pair, neither of
which touches the adapters (the frozen base and the adapters are sharded over
the CP ranks here, over 4 ranks in no LoRA run; DP x CP planning and parity:
test_parity_skrull.py's dp2cp2).
"""

import dataclasses
import functools
import os

import pytest
import torch

from skrull_ext.lora.config import HEAD, HF_TO_TITAN
from tests.integration_tests.launch import REPO, assert_same_grads, torchrun, train_from_seed
from tests.integration_tests.test_parity_skrull import GRAD, _check_exact_and_mixed

JOB = os.path.join(REPO, "skrull_ext", "jobs", "debug_cpu_lora.toml")
TARGETS = [*HF_TO_TITAN, HEAD]
"""The job's seven decoder linears and the head."""
LORA = ["--config-file", JOB, "--skrull.lookahead", "1", "--lora.target_modules", *TARGETS]
"""Look-ahead off: each step is compared with the reference's step of the same samples."""
ADAPTED = 6 * len(set(HF_TO_TITAN.values())) + 1
"""LoRA linears: 6 layers x 5 (wqkv, wo, w1, w2, w3), and the head."""
STEPS = CHECK_STEP = 2
"""Steps of every run here, the last one's adapter gradients compared (after one optimizer step,
whose result they and its loss show): on the debug data both Skrull runs' rank 0 places some
sequences local and some distributed at step 2 (_check_exact_and_mixed). The shared parity runs' 5
steps (conftest.STEPS) are not needed: this module has its own seed and reference, and each step of
the 4-rank TP run costs much (its DTensor ops take most of the module's time)."""
MERGED_TOL = 1e-5
"""Merged weights of two layouts' runs: their adapters differ by the training's float rounding."""


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
def lora_tp2_cp2_head_chunks(lora_reference):
    """The LoRA head under TP 2 (x CP 2), the head and loss in chunks of 48 tokens (train/head_loss.py;
    the reference's head is unchunked), writing the merged model as it ends."""
    return _skrull_run(lora_reference, "tp2cp2_head_chunks", 4, [
        "--parallelism.context_parallel_degree", "2", "--parallelism.tensor_parallel_degree", "2",
        "--loss.chunk_tokens", "48", "--lora.save_merged"])


def _matches_reference(run, ref, name: str) -> None:
    print(f"1-proc LoRA  {ref.losses}\nskrull {name:6s}{run.losses}")
    # each step is another batch and the adapters start near zero: the losses need not fall;
    # that training moved the adapters (and nothing else) is _base_unchanged
    assert len(run.losses) == STEPS == len(ref.losses)
    assert max(abs(a - b) for a, b in zip(ref.losses, run.losses)) < 1e-4, f"{ref.losses} vs {run.losses}"
    _check_exact_and_mixed(run, CHECK_STEP)
    grads = torch.load(run.grads)
    assert grads and all(".lora_a." in k or ".lora_b." in k for k in grads), sorted(grads)[:5]
    assert len(grads) == 2 * ADAPTED and "lm_head.lora_b.weight" in grads  # A and B of each
    worst, rel = assert_same_grads(run.grads, ref.grads, **GRAD)
    print(f"step {CHECK_STEP} {name} adapter gradients vs 1-proc: max |diff| {worst:.3g}, relative norm {rel:.3g}")


@functools.cache
def _seed_tensors(seed: str, workdir: str) -> dict[str, torch.Tensor]:
    """The seed checkpoint's model tensors, converted once for the runs that compare with them."""
    return _model_tensors(seed, os.path.join(workdir, "seed.pt"))


def _base_unchanged(lora_reference, run, name: str) -> None:
    workdir, seed, _ = lora_reference
    before = _seed_tensors(seed, workdir)
    after = _model_tensors(os.path.join(run.dump, "checkpoint", f"step-{STEPS}"), os.path.join(workdir, f"{name}.pt"))
    assert before.keys() == after.keys()
    base = [k for k in before if ".lora_" not in k]
    assert len(base) > 50
    changed = [k for k in base if not torch.equal(before[k], after[k])]
    assert not changed, f"{name}: base weights changed: {changed[:5]}"
    moved = [k for k in before if ".lora_b." in k and not torch.equal(before[k], after[k])]
    assert len(moved) == ADAPTED


@pytest.mark.slow
def test_lora_parity_cp2(lora_reference, lora_cp2):
    _matches_reference(lora_cp2, lora_reference[2], "cp2")


@pytest.mark.slow
def test_lora_parity_cp2_base_unchanged_and_adapter_written(lora_reference, lora_cp2):
    _base_unchanged(lora_reference, lora_cp2, "cp2")
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        assert os.path.isfile(os.path.join(lora_cp2.dump, "lora_adapter", name)), name


def _export(step_dir: str, out: str) -> dict[str, torch.Tensor]:
    """The merged model ``python -m skrull_ext.export STEP_DIR OUT --config-file JOB`` writes of a
    run's DCP checkpoint, in this process (the job's [lora] with TARGETS, as the runs had)."""
    from safetensors.torch import load_file

    from skrull_ext.export import export
    from skrull_ext.train.job.job_file import load_job

    config = load_job(JOB)
    config.lora = dataclasses.replace(config.lora, target_modules=TARGETS)
    export(step_dir, out, config)
    return load_file(os.path.join(out, "model.safetensors"))


@pytest.mark.slow
def test_lora_parity_tp2_cp2_head_chunks(lora_reference, lora_tp2_cp2_head_chunks, lora_cp2, tmp_path):
    """The LoRA head under TP trains as in one process; the merged model it writes gathers the
    vocabulary-sharded base weight and lora_b whole (the export of its last checkpoint, to the bit,
    and the CP=2 run's to float rounding), as does its peft adapter folder, and its base weights are
    untouched."""
    from safetensors.torch import load_file

    run = lora_tp2_cp2_head_chunks
    assert "DP 1 x CP 2 x TP 2" in run.output
    assert "head and loss in chunks of up to 48 tokens" in run.output
    _matches_reference(run, lora_reference[2], "tp2cp2 chunked head")
    _base_unchanged(lora_reference, run, "tp2cp2")
    merged = load_file(os.path.join(run.dump, "lora_merged", "model.safetensors"))
    base_head = torch.load(os.path.join(lora_reference[0], "tp2cp2.pt"), weights_only=False)["lm_head.weight"]
    assert merged["lm_head.weight"].shape == base_head.shape == (2048, 256)
    assert (merged["lm_head.weight"] - base_head).abs().max() > 100 * MERGED_TOL, "the head's adapter is not in"
    own = _export(os.path.join(run.dump, "checkpoint", f"step-{STEPS}"), str(tmp_path / "tp"))
    assert own.keys() == merged.keys()
    assert all(torch.equal(own[k], merged[k]) for k in own), [k for k in own if not torch.equal(own[k], merged[k])][:5]
    cp2 = _export(os.path.join(lora_cp2.dump, "checkpoint", f"step-{STEPS}"), str(tmp_path / "cp2"))
    worst = max((cp2[k] - merged[k]).abs().max().item() for k in cp2)
    head = (cp2["lm_head.weight"] - merged["lm_head.weight"]).abs().max().item()
    print(f"TP 2 x CP 2 merged vs CP 2 merged: max |diff| {worst:.3g} (lm_head {head:.3g})")
    assert worst < MERGED_TOL
    # the peft adapter folder it wrote (lora_b gathered the same way) is the CP=2 run's too
    tp_adapter, cp2_adapter = (load_file(os.path.join(r.dump, "lora_adapter", "adapter_model.safetensors"))
                               for r in (run, lora_cp2))
    assert tp_adapter.keys() == cp2_adapter.keys() and "base_model.model.lm_head.lora_B.weight" in tp_adapter
    # the adapters themselves, after the Adam steps, carry the runs' rounding further than B @ A (2.2e-5 at
    # most in lora_A's values up to 0.07): as the gradients, by the relative norm of the difference
    diff = sum(((tp_adapter[k] - cp2_adapter[k]).double() ** 2).sum() for k in tp_adapter) ** 0.5
    rel = (diff / sum((v.double() ** 2).sum() for v in cp2_adapter.values()) ** 0.5).item()
    print(f"TP 2 x CP 2 peft adapter vs CP 2: relative norm of the difference {rel:.3g}")
    assert rel < GRAD["max_rel_norm"]
