"""The profile's head memory (profile/head_memory.py) measures the head module alone, its FSDP unit
unsharded whether or not the unit's pre-forward hook runs for a lone head call.

torchtitan shards the final norm and the head as one FSDP group (with a tied head, the embedding
too). Up to torch 2.12 a group's pre-forward hook runs only at the first of its modules in a pass,
so after a whole pass of the model the head called alone kept its sharded DTensor weight: the
profile on GPU run 9 (torch 2.11) stopped there ("aten.mm.default got mixed torch.Tensor and
DTensor"). Torch 2.13 runs the hook at each module; the case is reproduced there by removing the
head's FSDP pre-forward hook after resharding its group, and on torch 2.11 (the compat lane) by
leaving the group as that pass did, the head "to run". Every call of the measure must run in the
same state, so the peaks lie on a line. In process, the debug job at one rank."""

import os

import pytest
import torch
from torch.distributed.tensor import DTensor

from skrull_ext.profile.head_memory import measure_head
from skrull_ext.profile.memory import PEAK_METERS
from skrull_ext.profile.model import build_job_model
from skrull_ext.train.job.job_file import load_config

JOBS = os.path.join(os.path.dirname(__file__), "..", "..", "skrull_ext", "jobs")
TOKENS = (64, 128, 256)


def _drop_fsdp_pre_forward(module: torch.nn.Module) -> int:
    """Remove FSDP's pre-forward hook from ``module`` (as torch < 2.13 skips it); how many were removed."""
    keys = [k for k, hook in module._forward_pre_hooks.items() if getattr(hook, "__name__", "") == "_pre_forward"]
    for k in keys:
        del module._forward_pre_hooks[k]
    return len(keys)


def _leave_head_to_run(head: torch.nn.Module) -> None:
    """Leave the head's FSDP group as a pass of the model that skipped the head leaves it (GPU run 9):
    the head "to run", where torch < 2.13 skips the head's next pre-forward."""
    state = head._get_fsdp_state()
    state._modules_to_run_forward.clear()
    state._modules_to_run_forward.add(head)


def _pre_forward_at_every_module(head: torch.nn.Module) -> bool:
    """Whether this torch runs an FSDP group's pre-forward at each module (torch >= 2.13) or only at the
    first of its modules to run in a pass (torch 2.11-2.12): the head called when left "to run" sees its
    weight unsharded only in the first case."""
    sharded = []
    head.reshard()
    _leave_head_to_run(head)
    probe = head.register_forward_pre_hook(lambda m, args: sharded.append(isinstance(m.weight, DTensor)))
    with torch.no_grad():
        head(torch.zeros(1, 1, head.weight.shape[-1]))
    probe.remove()
    head.reshard()
    head._get_fsdp_state()._modules_to_run_forward.clear()
    return not sharded[0]


@pytest.fixture(scope="module")
def job_model():
    torch.manual_seed(0)
    config = load_config(["--config-file", os.path.join(JOBS, "debug_cpu.toml")], module="skrull_ext.profile",
                         world_size=1)
    jm = build_job_model(config, torch.device("cpu"), max(TOKENS))
    yield jm
    jm.close()


def test_the_head_alone_is_measured_with_its_unit_unsharded(job_model):
    jm = job_model
    head = jm.model.lm_head
    assert jm.loss_fn.head_backward == "in_forward"  # the path GPU run 9 took
    meter = PEAK_METERS["cpu"](jm.device)
    hooked = measure_head(jm, TOKENS, meter)
    # the meter is exact and every call runs in the same state: the peaks lie on a line (on torch 2.11
    # they did not before each call closed the group's pass: the all-gather counted in one call of three)
    assert hooked.max_rel_error < 1e-9
    assert isinstance(head.weight, DTensor)  # resharded after the measure, the model as it was
    assert all(p.grad is None for p in jm.model.parameters())
    # no pass of the head's group left open (torch 2.11 would skip the next pass's pre-forward)
    assert not head._get_fsdp_state()._modules_to_run_forward

    if _pre_forward_at_every_module(head):  # torch >= 2.13: the skip reproduced by removing the hook
        head.reshard()
        assert _drop_fsdp_pre_forward(head) == 1
    else:  # torch 2.11: as GPU run 9 left it (removing the hook would leave its group post-forward resharding)
        _leave_head_to_run(head)
    bare = measure_head(jm, TOKENS, meter)  # raised "mixed torch.Tensor and DTensor" before the unshard
    assert bare.max_rel_error < 1e-9
    assert isinstance(head.weight, DTensor)
    assert all(p.grad is None for p in jm.model.parameters())
    assert not head._get_fsdp_state()._modules_to_run_forward
    # what a token of a chunk takes does not depend on which call unsharded the weight
    assert bare.slope == pytest.approx(hooked.slope, rel=1e-3)
    assert bare.slope > 0
