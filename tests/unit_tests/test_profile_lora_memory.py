"""The profiler's memory model with and without LoRA (issue 15): a frozen base
saves fewer activations and holds no gradients or optimizer state, while
backward's transient (activation and logit gradients) is the same amount of
bytes, up to the weight-sized gradients that full fine-tuning computes before
adding them into ``.grad`` (with the head in chunks, train/head_loss.py, up to
three of the head weight's: one per chunk, summed in autograd's input buffer; with
its gradients computed in forward, train/head_grad.py, the head's weight gradient
is saved instead, one head weight's bytes less in flight). Fitted to the exact tensor peak, LoRA's BucketSize comes out larger;
the earlier model (saved bytes x a peak/saved margin) gave it the smaller one.
In process, tiny ladder, the debug jobs' own models."""

import gc
import os

import pytest
import torch

from skrull_ext.profile.memory import freeze_heap, profile_memory
from skrull_ext.profile.model import build_job_model
from skrull_ext.profile.options import ProfileOptions
from skrull_ext.train.job.job_file import load_config

# The LoRA model returns a view of its hidden states (the head passed through); FSDP2 warns at each
# root forward that an in-place op on it would skip its pre-backward hook. The trainer's model is
# the same and neither modifies it in place (the loss reads it).
pytestmark = pytest.mark.filterwarnings("ignore:FSDP2-wrapped module .* returned a view tensor:UserWarning")

JOBS = os.path.join(os.path.dirname(__file__), "..", "..", "skrull_ext", "jobs")
LENGTHS = (64, 128, 256, 512)


def _memory(job: str):
    torch.manual_seed(0)
    config = load_config(["--config-file", os.path.join(JOBS, job)], module="skrull_ext.profile", world_size=2)
    jm = build_job_model(config, torch.device("cpu"), max(LENGTHS))
    opts = ProfileOptions(memory_lengths=LENGTHS, memory_limit=256 * 2**20, world_size=2)
    largest = max(p.numel() * p.element_size() for p in jm.model.parameters())
    try:
        return profile_memory(jm, opts, 2, lambda _: None), largest
    finally:
        jm.close()  # the one-rank process group the build made


@pytest.fixture(scope="module")
def full_and_lora():
    # What is alive now stays so through both ladders: out of the meters' garbage collections, as the
    # profiler's command leaves its imports and model (memory.freeze_heap), and back in afterwards.
    freeze_heap()
    try:
        return _memory("debug_cpu.toml"), _memory("debug_cpu_lora.toml")
    finally:
        gc.unfreeze()


def test_lora_saves_less_with_the_same_backward_transient(full_and_lora):
    (full, largest), (lora, _) = full_and_lora
    for f, l in zip(full.points, lora.points):
        assert l.saved < 0.97 * f.saved, (f, l)  # the frozen base's linears keep fewer inputs
        # the same activation gradients in flight, within one head weight's bytes (``largest``) down
        # (LoRA adds its rank-8 adapter activations, and with the head's gradients computed in forward,
        # loss.head_backward "in_forward", full fine-tuning's head gradient is saved, not in flight) and
        # three up (with head_backward "recompute" the head in chunks hands autograd one weight gradient
        # per chunk, summed out of place in its input buffer)
        assert -largest <= (f.peak - f.saved) - (l.peak - l.saved) <= 3 * largest, (f, l, largest)
        assert l.peak < f.peak
    # (Before the head ran in chunks the two transients were equal within 2% at the top point; the
    # head weight's per-chunk gradients, a constant, now sit at full fine-tuning's peak instead.)


def test_lora_bucket_is_larger_and_the_fit_is_the_peak(full_and_lora):
    (full, _), (lora, _) = full_and_lora
    assert lora.static.total < full.static.total
    assert lora.margin == full.margin == ProfileOptions().margin  # no per-job margin from a ratio
    for r in (full, lora):
        assert r.fit.max_rel_error < 0.02
        assert all(r.fit(p.tokens) == pytest.approx(p.peak, rel=0.02) for p in r.points)
    assert lora.bucket_size > full.bucket_size
