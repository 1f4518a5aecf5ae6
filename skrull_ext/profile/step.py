# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""What a step pays once outside its micro-batches (``[step] fixed_us``).

After its micro-batches a training step clips the gradients (their norm
all-reduced over the shards), steps the optimizer, reads the loss and the
norm to check them finite (one all-reduce and the step's host sync; read
after the optimizer step is queued where a fused optimizer can skip it on
the device: train/optimizer_gate.py), and steps the learning rate; none of it depends on the plan, so the cost model
prices it once a step (``step_fixed_us``: docs/design/cost_model.md,
"The step outside its micro-batches"). It is timed here with the trainer's
own phases and clocks (train/step_phases.py: CUDA events on a GPU, the wall
clock on CPU) on the profile's model (model.py: wrapped in FSDP as the
trainer wraps it, at one rank too), with the job's optimizer and
learning-rate schedule (torchtitan's builders): per round, one micro-batch
gives the gradients (untimed here: it is the micro-batch stage's), then the
per-step phases run as the trainer runs them. The median per phase over the
rounds after the warm-up, the slowest rank's, summed over the phases
``PHASES`` marks ``per_step``.

The plan digests (``skrull.check_plan_hash``, off by default) and the plan
log are per-step checks too, but optional: a job that turns them on pays
more than this.

The clipping and the optimizer run over the model's own parameters: FSDP's
sharded ``training.dtype`` parameters (float32 by default), their gradients
reduced into them in ``mixed_precision_reduce``, exactly what the trainer's
optimizer steps; the compute dtype (``mixed_precision_param``) exists only
in FSDP's unsharded copies. (A bf16 profile model, unwrapped, once stepped
half the trainer's bytes: GPU run 8, H200, opt 4.3 ms profiled against
14 ms a step in training.)

This runs after the micro-batch stage and changes the weights (optimizer
steps): nothing is measured after it.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from skrull_ext.profile.model import JobModel
from skrull_ext.profile.options import ProfileOptions
from skrull_ext.profile.ranks import reduce_floats
from skrull_ext.train.optimizer_gate import gated, not_finite, step_unless
from skrull_ext.train.step_checks import loss_and_norm, summed_loss
from skrull_ext.train.step_phases import PHASES, StepPhases, clock_for

__all__ = ["BACKLOG_CYCLES", "StepResult", "backlog", "profile_step"]

PER_STEP = tuple(p.key for p in PHASES if p.per_step)
"""The phases the per-step term sums, in the order a step runs them."""


@dataclass(frozen=True)
class StepResult:
    phases_us: dict[str, float]
    """Median microseconds per per-step phase (the slowest rank's)."""
    repeats: int
    """Rounds timed (after the warm-up)."""

    @property
    def fixed_us(self) -> float:
        """``[step] fixed_us``: the per-step phases summed."""
        return sum(self.phases_us.values())

    def section(self) -> dict[str, float | int]:
        """The profile's [step] table."""
        return {"fixed_us": self.fixed_us, **{f"{k}_us": v for k, v in self.phases_us.items()},
                "repeats": self.repeats}


BACKLOG_CYCLES = 100_000_000
"""Device clock cycles of queued work ahead of the phases on a GPU (about 50 ms at 2 GHz): longer
than the host takes to launch them."""


def backlog(device: torch.device) -> None:
    """On a GPU, queue ``BACKLOG_CYCLES`` of device work ahead of the phases, as a step's last
    backward leaves it queued when the host reaches the clipping: the phases' CUDA events then time
    the device's work, as the trainer's do (GPU run 9: clip 1.8 + opt 4.1 ms a step in training; the
    profile, its queue drained by the barrier, timed the host launching them, 4.6 + 7.5 ms). A no-op
    elsewhere: the CPU's clock is the wall's, host and device one."""
    if device.type == "cuda":
        torch.cuda._sleep(BACKLOG_CYCLES)


def _loss_mesh(jm: JobModel):
    """The mesh the loss is summed over: every rank of this launch (None: one process)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return None
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(jm.device.type, (dist.get_world_size(),), mesh_dim_names=("loss",))


def profile_step(jm: JobModel, opts: ProfileOptions, tick: Callable[[str], None]) -> StepResult:
    """Time the per-step phases over warmup + micro_batch_repeats rounds (module docstring)."""
    config = jm.config
    optimizers = config.optimizer.build(model_parts=[jm.model])
    schedulers = config.lr_scheduler.build(optimizers=optimizers, training_steps=config.training.steps)
    mesh = _loss_mesh(jm)
    gate = gated(optimizers)  # queued ahead of the check's read where it can be skipped (optimizer_gate.py)
    buf = jm.buffer([opts.micro_batch_doc] * 4, seed=opts.seed)
    params = list(jm.model.parameters())
    from torchtitan.distributed import utils as dist_utils

    phases = StepPhases(clock_for(jm.device))
    rounds = opts.warmup + opts.micro_batch_repeats
    spent: dict[str, list[float]] = {k: [] for k in PER_STEP}
    for r in range(rounds):
        tick(f"step outside its micro-batches ({r + 1}/{rounds})")
        optimizers.zero_grad(set_to_none=True)
        out = jm.model(buf["tokens"], buf["positions"], buf["attention_masks"])
        loss, _ = jm.loss_fn(out, buf["labels"])
        loss.backward()
        if dist.is_initialized():
            dist.barrier()  # every rank starts the phases together, as after a step's last backward
        backlog(jm.device)
        phases.begin(r)
        with phases.phase("clip"):
            norm = dist_utils.clip_grad_norm_(params, config.training.max_norm, foreach=True, pp_mesh=None,
                                              ep_enabled=False)
        with phases.phase("checks"):  # the trainer's order (trainer.py train_step)
            total = summed_loss(loss.detach(), mesh)
        if gate:
            with phases.phase("opt"):
                step_unless(optimizers, not_finite(total, norm))
        with phases.phase("checks"):
            loss_and_norm(total, norm)
        with phases.phase("opt"):
            if not gate:
                optimizers.step()
            schedulers.step()
        phases.end(0.0)
        times = phases.take(wait=True)
        if r >= opts.warmup:
            for k in PER_STEP:
                spent[k].append(times.phases.get(k, 0.0) * 1e3)
    optimizers.zero_grad(set_to_none=True)
    medians = reduce_floats([statistics.median(spent[k]) for k in PER_STEP], "max", jm.device)
    return StepResult(dict(zip(PER_STEP, medians)), opts.micro_batch_repeats)
