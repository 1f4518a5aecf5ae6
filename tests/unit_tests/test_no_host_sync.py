"""A Skrull training step makes one host synchronisation: the finiteness check's read.

On a GPU the host queues a micro-batch's kernels ahead of the device; any call that reads the
device's data on the host (``.item()``, ``nonzero``, ``.tolist()`` of a device tensor, a blocking
host-to-device copy...) makes it wait until the device has run everything queued, and the
device then idles while the host catches up. skrull_ext/bench/host_syncs.py records those calls
on CPU with their call sites; here around one whole step of the debug job (torchtitan's loop
body: gc, train_step, checkpoint save), in one process, on the attention kernels' paths (dense;
segments and tiles, whose plans are copied to the device; the head in chunks, lockstep FSDP,
full checkpointing; the all-local LocalOnlyBatch path a compiled job takes, run eager, since
torch.compile does not trace under a dispatch mode). The only waits are the two reads of ``loss_and_norm`` (step_checks.py):
the loss summed over the ranks (``summed_loss``, on the device) and the gradient norm, read
right after it at no further cost. Anything else in the step fails here.
"""

import json

import pytest
import torch

from skrull_ext.bench.host_syncs import HostSyncs
from tests.integration_tests.launch import REPO, torchrun

EXPECTED = {
    ("item", "skrull_ext/train/step_checks.py:loss_and_norm", ""),
}
"""The finiteness check's reads (trainer.py ``_check_finite``: the loss summed over the ranks on
the device, then its norm): the step's one host sync, after the optimizer step is queued
(tests/unit_tests/test_optimizer_gate.py checks the order)."""


def _waits(tmp_path, *flags: str) -> set[tuple[str, str, str]]:
    """tools/host_syncs.py in a process of its own, forked from the suite's warm launcher
    (tests/integration_tests/forked.py: torch and the trainer imported once, not per case)."""
    out = tmp_path / "syncs.json"
    torchrun(1, "tools.host_syncs", ["--steps", "3", "--json", str(out), "--dump_folder", str(tmp_path / "run"),
                                     *flags], cwd=REPO)
    return {(r["op"], r["site"], r["via"]) for r in json.loads(out.read_text()) if r["device"]}


@pytest.mark.slow
@pytest.mark.parametrize("flags", [  # the default (dense) job: in process, with the optimizer's order,
    # tests/unit_tests/test_optimizer_gate.py::test_a_trainer_step_queues_the_optimizer_before_its_one_read
    ("--skrull.attention_kernel", "segments", "--loss.chunk_tokens", "64", "--skrull.free_running", "false"),
    ("--skrull.attention_kernel", "tiles", "--activation_checkpoint.kind", "full",
     "--skrull.activation_checkpoint", "job"),
    ("--local-only", "dense", "--loss.chunk_tokens", "64"),
], ids=["segments-head-chunks-lockstep", "tiles-full-ac", "compiled-path-eager"])
def test_a_step_waits_for_the_device_once(tmp_path, flags):
    assert _waits(tmp_path, *flags) == EXPECTED


# ---- the recorder itself (in process, no trainer) ----------------------------

def test_reads_of_device_values_are_recorded_with_their_call_site():
    w = torch.ones(3, requires_grad=True)
    with HostSyncs([w]) as rec:
        loss = (w * 2).sum()
        loss.backward()
        float(loss.detach())  # item
        w.grad.tolist()
        torch.nonzero(w.grad)
        if loss.detach() > 0:  # bool(): an item too
            pass
    name = "tests/unit_tests/test_no_host_sync.py:test_reads_of_device_values_are_recorded_with_their_call_site"
    assert [(s.op, s.site, s.device) for s in rec.syncs] == [
        ("item", name, True), ("tolist", name, True), ("nonzero", name, True), ("item", name, True)]


def test_host_tensors_and_async_copies_are_not_waits():
    host = torch.arange(4)
    dev = torch.device("cpu")  # the job's device: on CPU, the host
    with HostSyncs() as rec:
        int(host.sum())  # a host-built tensor's value: read on the host, no device involved
        copied = host.to(dev, non_blocking=True)  # as the trainer copies its (pinned) buffers
        made = torch.zeros(2, device=dev)
        assert not rec.waits()
        copied.sum().item()  # now a device value
        made.tolist()
        host.to(dev)  # blocking host-to-device copy
        torch.tensor([1, 2], device=dev)
    assert [(s.op, s.device) for s in rec.syncs] == [
        ("item", False), ("item", True), ("tolist", True), ("to(device) blocking", True),
        ("torch.tensor(device=)", True)]


def test_patches_are_undone():
    originals = (torch.Tensor.tolist, torch.Tensor.to, torch.tensor, torch.zeros, torch.cuda.synchronize)
    with HostSyncs():
        assert torch.Tensor.tolist is not originals[0]
    assert (torch.Tensor.tolist, torch.Tensor.to, torch.tensor, torch.zeros, torch.cuda.synchronize) == originals
