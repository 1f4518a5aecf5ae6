"""The optimizer step queued ahead of the finiteness check's read, and skipped on the device if it fails.

A step stops before the optimizer changes anything when its loss or gradient norm is not finite
(trainer.py ``_check_finite``, packed_trainer.py's pre-step hook). Read first, that check is the
step's one host sync: it drains the device's queue, and the optimizer's host work (a fused AdamW
over FSDP's DTensor parameters: every parameter, gradient and moment unwrapped) then runs with the
device idle. On the eighth GPU run (docs/results/gpu.md) the ``opt`` phase took 14 ms a step, in
both batchings, for an update that moves about 14 GB (3-4 ms at the H200's bandwidth).

PyTorch's fused Adam and AdamW take a device flag, ``found_inf`` (GradScaler's): where it is not
zero the kernel leaves the parameters and both moments as they were and takes the step count back.
So the step is queued behind a flag computed on the device from the same loss and norm, and the
check is read after it: the optimizer's host work overlaps the device's backward, and a step that
is not finite still ends with the weights, moments and step count of the step before, as when the
check was read first. The learning-rate schedule steps only after a finite check, as before.

Optimizers that take no flag (not fused, or another class) keep the check first: ``gated`` says
which way a trainer runs.
"""

from __future__ import annotations

import torch

__all__ = ["GATED", "arm", "disarm", "gated", "not_finite", "step_unless"]

GATED = (torch.optim.Adam, torch.optim.AdamW)
"""The optimizers whose fused step reads ``found_inf`` (torch.optim.adam/adamw ``_fused_adam``)."""


def gated(optimizers) -> bool:
    """Whether every optimizer of ``optimizers`` (torchtitan's container) can skip a step on the
    device: a fused Adam or AdamW in every parameter group."""
    inner = list(getattr(optimizers, "optimizers", ()))
    return bool(inner) and all(isinstance(o, GATED) and all(g.get("fused") for g in o.param_groups) for o in inner)


def not_finite(*values: torch.Tensor) -> torch.Tensor:
    """1.0 where any of the scalar ``values`` is not finite, else 0.0: float32, on their device, no
    host read (GradScaler's ``found_inf``)."""
    finite = torch.isfinite(values[0])
    for v in values[1:]:
        finite = finite & torch.isfinite(v)
    return torch.logical_not(finite).to(torch.float32)


def arm(optimizers, flag: torch.Tensor) -> None:
    """Every optimizer's fused kernel reads ``flag`` (``not_finite``) at its next step: where it is
    1, that step changes nothing."""
    for o in optimizers.optimizers:
        o.found_inf = flag


def disarm(optimizers) -> None:
    """The flag taken off again, so that no later step reads it."""
    for o in optimizers.optimizers:
        o.found_inf = None


def step_unless(optimizers, flag: torch.Tensor) -> None:
    """``optimizers.step()`` with ``flag`` armed for it (a trainer that calls the step itself;
    torchtitan's own step is armed and disarmed by hooks: packed_trainer.py)."""
    arm(optimizers, flag)
    try:
        optimizers.step()
    finally:
        disarm(optimizers)
