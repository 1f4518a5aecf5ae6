"""Lockstep or free-running: how a Skrull job's ranks run a step, chosen once at start-up.

``[skrull] free_running`` is ``"auto"`` (the default), ``true`` or ``false``.
Free-running execution (free_running.py) gathers the FSDP parameters once
per step and reduces the gradients once, where lockstep execution pays both
per micro-batch and makes DP ranks run pad passes; it costs the unsharded
parameters and gradients on every rank for the whole step. So:

- ``true``: free-running; refused (one line: the bytes needed and usable)
  when the measured profile's memory account says it does not fit.
- ``false``: lockstep.
- ``"auto"``: free-running whenever the account says it fits at the job's
  BucketSize, lockstep otherwise. Under ``bucket_size = "profile"`` the two
  choices are made together: lockstep keeps the profile's BucketSize, and
  free-running the largest BucketSize that leaves room for the unsharded
  copy; when that is smaller, the first global batches of the job are
  planned both ways and the faster predicted step wins. Lockstep where
  nothing can be checked (a hardware preset: no measured [memory]) and
  under skrull-pool (its micro-batches exchange K/V across DP groups, which
  free-running ranks reach at different passes).

The memory account is the chosen activation-checkpointing mode's
(train/checkpointing.py chooses it first, priced lockstep, before the model
whose unsharded bytes this needs is built): free-running's fit is that
mode's activations with the unsharded copy on top, and the line names the
mode, so a mode chosen for lockstep never runs free where it does not fit.

The choice is logged with its numbers (``Execution.reason``). Each
execution is priced as it runs (``Profile.cost_model(free_running=...)``:
the profile's free-running fixed costs per step and per micro-batch).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

from skrull_ext._core import ModelShape
from skrull_ext.scheduler.config import FROM_PROFILE, job_timeline
from skrull_ext.scheduler.job import SchedulerJob

__all__ = ["AUTO", "Execution", "choose_execution", "mean_step_us", "PREDICT_STEPS"]

AUTO = "auto"
PREDICT_STEPS = 8
"""Global batches planned both ways when auto weighs a smaller free-running BucketSize."""
_MIB = 2.0**20


@dataclass(frozen=True)
class Execution:
    """The resolved execution: free-running or not, at which BucketSize, and why."""

    free_running: bool
    bucket_size: int
    reason: str
    bucket_from: str = field(default="", compare=False)
    """Where ``bucket_size`` comes from, for the start-up line (``choose_execution`` sets it)."""


def _fits(mem, unsharded: float, bucket: int, mode: str | None) -> tuple[bool, str]:
    """Whether free-running fits at ``bucket`` and the clause that says so. ``mode``: the
    activation-checkpointing mode chosen before (train/checkpointing.py, priced lockstep), whose
    activations ``mem`` holds (``Profile.under_mode``): named, so the line says the mode was
    checked again with the unsharded copy on top."""
    need = mem.free_running_need(unsharded, bucket)
    under = f" under activation checkpointing {mode}" if mode else ""
    text = (f"needs {need / _MIB:.1f} MiB per rank (unsharded parameters and gradients {unsharded / _MIB:.1f} MiB "
            f"+ static and activations of bucket_size {bucket}{under}), usable {mem.usable / _MIB:.1f} MiB")
    return need <= mem.usable, text


def _refuse(skrull, text: str) -> ValueError:
    return ValueError(f"skrull.free_running = true {text} (profile {skrull.cost_model!r}); turn it off, lower "
                      "skrull.bucket_size, or re-profile the job with --skrull.free_running (its BucketSize then "
                      "leaves the room)")


def predicted_step_us(skrull, dp: int, cp: int, shape: ModelShape, model_name: str, steps: Sequence[Sequence[int]],
                      dp_shard: int, dp_replicate: int, free_running: bool, bucket: int) -> float | None:
    """Mean predicted step time of ``steps`` (global batches' lengths) planned and priced for
    one execution; None when BucketSize ``bucket`` cannot hold a sequence of them whole or sharded."""
    timeline = job_timeline(dp_shard, dp_replicate, free_running, skrull.defer_grad_sync)
    job = skrull.resolve(dp, cp, shape, model_name, timeline=timeline, free_running=free_running,
                         bucket_size=bucket, lookahead=1)  # each step planned on its own
    return mean_step_us(job, steps)


def mean_step_us(job: SchedulerJob, steps: Sequence[Sequence[int]]) -> float | None:
    """Mean predicted step time of ``steps`` (global batches' lengths) planned and priced for
    ``job`` one by one; None when its ranks cannot hold a sequence of them whole or sharded
    (``job.capacity``: a CP group, or under skrull-pool the pool's ranks)."""
    from skrull_ext.scheduler import Scheduler  # CP-SAT (ortools) only when a scheduler is built

    limit = job.capacity.limit
    if not steps or any(s > limit for step in steps for s in step):
        return None
    scheduler = Scheduler(job)
    return sum(scheduler.schedule(list(step)).makespan_us for step in steps) / len(steps)


def choose_execution(skrull, *, unsharded: float | None, dp: int, cp: int, dp_shard: int, dp_replicate: int,
                     shape: ModelShape, model_name: str, steps: Sequence[Sequence[int]] = (),
                     no_free_running: str | None = None) -> Execution:
    """The execution of a Skrull job (module docstring). ``unsharded``: the bytes free-running
    would hold per rank (profile_memory.free_running_bytes), None when nothing is sharded (no
    FSDP unit: nothing to hold, nothing to choose). ``steps``: the first global batches'
    lengths, planned both ways when auto weighs BucketSize against execution.
    ``no_free_running``: why this job cannot run free with more than one DP rank (the head in
    chunks, train/head_loss.py): "auto" is then lockstep, ``true`` refused.
    Raises ValueError (one line) when ``free_running = true`` does not fit."""
    bucket = skrull.resolved_bucket_size()  # the one read of the section's BucketSize in a training job
    if no_free_running is not None and dp > 1 and skrull.free_running is not False:
        if skrull.free_running is True:
            raise ValueError(f"skrull.free_running = true: not at DP {dp}: {no_free_running}; set it to 'auto' "
                             "or false")
        out = Execution(False, bucket, f"skrull.free_running = 'auto': lockstep, because {no_free_running}")
    else:
        out = _choose(skrull, bucket, unsharded, dp, cp, dp_shard, dp_replicate, shape, model_name, steps)
    if skrull.bucket_size != FROM_PROFILE:
        origin = "skrull.bucket_size"
    elif out.bucket_size == bucket:
        origin = "the profile's"
    else:
        origin = f"free-running's fit, under the profile's {bucket}"
    return dataclasses.replace(out, bucket_from=origin)


def _choose(skrull, bucket: int, unsharded: float | None, dp: int, cp: int, dp_shard: int, dp_replicate: int,
            shape: ModelShape, model_name: str, steps: Sequence[Sequence[int]]) -> Execution:
    mode = skrull.free_running
    if mode is False:
        return Execution(False, bucket, "skrull.free_running = false: lockstep (parameters gathered per micro-batch)")
    if unsharded is None:
        return Execution(False, bucket, f"skrull.free_running = {mode!r}: nothing is sharded (no FSDP unit), "
                                        "so there is nothing to hold unsharded")
    assert not (mode is True and skrull.policy_spec.pool), "SkrullConfig.check_free_running refuses it"
    if skrull.policy_spec.pool:
        return Execution(False, bucket, "skrull.free_running = 'auto': lockstep, because skrull-pool's "
                                        "micro-batches exchange K/V across DP groups")
    mem, why = skrull.measured_memory()
    if mem is None:
        if mode is True:
            return Execution(True, bucket, f"skrull.free_running = true: memory not checked: {why} "
                                           "(name a profile file: python -m skrull_ext.profile)")
        return Execution(False, bucket, f"skrull.free_running = 'auto': lockstep, because its memory cannot be "
                                        f"checked: {why} (name a profile file: python -m skrull_ext.profile)")
    fits, text = _fits(mem, unsharded, bucket, skrull.checkpointing_mode)
    if mode is True:
        if not fits:
            raise _refuse(skrull, text)
        return Execution(True, bucket, f"skrull.free_running = true: free-running; it {text}")
    if fits:
        return Execution(True, bucket, f"skrull.free_running = 'auto': free-running, because it fits: it {text}")
    if skrull.bucket_size != FROM_PROFILE:
        return Execution(False, bucket, f"skrull.free_running = 'auto': lockstep, because free-running {text} "
                                        f"(a smaller skrull.bucket_size may let it fit)")
    smaller = mem.free_running_bucket_size(unsharded)
    lock_us = predicted_step_us(skrull, dp, cp, shape, model_name, steps, dp_shard, dp_replicate, False, bucket)
    free_us = (predicted_step_us(skrull, dp, cp, shape, model_name, steps, dp_shard, dp_replicate, True, smaller)
               if smaller >= 1 else None)
    head = (f"skrull.free_running = 'auto' with bucket_size = 'profile': free-running {text}; it fits "
            f"at bucket_size {smaller}")
    if free_us is None or lock_us is None:
        if free_us is None:
            return Execution(False, bucket, f"{head}, which cannot hold the first global batches' longest "
                                            f"sequence whole or sharded: lockstep at bucket_size {bucket}")
        return Execution(True, smaller, f"{head}: free-running there (lockstep at {bucket} was not predicted)")
    over = len(steps)
    if free_us < lock_us:
        return Execution(True, smaller, f"{head}: free-running there, predicted {free_us / 1e3:.2f} ms a step "
                                        f"against lockstep's {lock_us / 1e3:.2f} ms at {bucket} (mean of the first "
                                        f"{over} global batches)")
    return Execution(False, bucket, f"{head}; lockstep at {bucket}, predicted {lock_us / 1e3:.2f} ms a step against "
                                    f"free-running's {free_us / 1e3:.2f} ms there (mean of the first {over} global "
                                    "batches)")
