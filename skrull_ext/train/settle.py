"""A Skrull job settled once, at start-up: execution, BucketSize, timeline, look-ahead width.

Each decision needs the ones before it: the execution (lockstep or
free-running) fixes the BucketSize and the timeline (execution.py); those fix
what a step costs, which is what ``lookahead = "auto"`` prices windows with
(data/lookahead_choice.py). ``settle`` makes them in that order, from the
section, the job's dims and shape, and the data's lengths (read as training
limits them, no loader attached), and hands back the one ``SchedulerJob``
the trainer builds its one Scheduler from and reads afterwards. Nothing
after start-up reads the raw ``[skrull] lookahead`` or ``bucket_size``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from skrull_ext._core import ModelShape
from skrull_ext.data import lookahead_choice
from skrull_ext.data.lookahead_choice import LookaheadChoice
from skrull_ext.scheduler.config import FROM_PROFILE, LOOKAHEAD_AUTO, job_timeline
from skrull_ext.scheduler.job import SchedulerJob
from skrull_ext.scheduler.scheduler import plan_window
from skrull_ext.train.execution import AUTO, PREDICT_STEPS, Execution, choose_execution

__all__ = ["Settled", "settle"]


@dataclass(frozen=True)
class Settled:
    """What start-up decided, and why (each decision's log line)."""

    job: SchedulerJob
    """The job, final: its BucketSize, timeline, execution and look-ahead width."""
    execution: Execution
    lookahead: LookaheadChoice | None
    """``lookahead = "auto"``'s pricing; None when the job named its width."""

    def lines(self) -> list[str]:
        out = [f"Skrull execution: {self.execution.reason}"]
        if self.lookahead is not None:
            out.append(self.lookahead.line())
        return out


def settle(skrull, *, dp: int, cp: int, dp_shard: int, dp_replicate: int, shape: ModelShape, model_name: str,
           unsharded: float | None, training_steps: int, raw_lengths: Callable[[int], Sequence[int]],
           limited_lengths: Callable[[SchedulerJob, int], Sequence[int]],
           check_lengths: Callable[[SchedulerJob, int], object]) -> Settled:
    """Settle the job (module docstring). ``unsharded``: what free-running would hold per
    rank (None: no FSDP unit); ``raw_lengths(step)``: a step's global batch as drawn (the
    execution's weighing of BucketSize); ``limited_lengths(job, step)``: the same as ``job``'s
    length limit trains it (what "auto" prices); ``check_lengths(job, last_step)``: the
    over-length pre-scan of steps 1..last_step under ``job``'s limit, run before anything is
    priced (under 'error' a bad sample stops the run there, named with the scan's counts): to
    the end of the last window any width this job may take reads. Raises ValueError (one
    line) for a free-running job that does not fit."""
    weigh = skrull.free_running == AUTO and skrull.bucket_size == FROM_PROFILE
    first = [list(raw_lengths(k)) for k in range(1, min(training_steps, PREDICT_STEPS) + 1)] if weigh else []
    execution = choose_execution(skrull, unsharded=unsharded, dp=dp, cp=cp, dp_shard=dp_shard,
                                 dp_replicate=dp_replicate, shape=shape, model_name=model_name, steps=first)
    timeline = job_timeline(dp_shard, dp_replicate, execution.free_running, skrull.defer_grad_sync)
    auto = skrull.lookahead == LOOKAHEAD_AUTO
    job = skrull.resolve(dp, cp, shape, model_name, timeline=timeline, free_running=execution.free_running,
                         bucket_size=execution.bucket_size, lookahead=1 if auto else None)
    widest = max(lookahead_choice.CANDIDATES) if auto else job.lookahead
    check_lengths(job, -(-training_steps // widest) * widest)
    if not auto:
        return Settled(job, execution, None)
    choice = lookahead_choice.choose(lambda s: limited_lengths(job, s), lambda b: plan_window(job, b),
                                     lookahead_choice.horizon(training_steps))
    return Settled(dataclasses.replace(job, lookahead=choice.width), execution, choice)
