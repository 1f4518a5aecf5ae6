"""A Skrull job settled once, at start-up: execution, BucketSize, timeline, look-ahead width.

Each decision needs the ones before it. The activation-checkpointing mode
comes first, before the model is built (checkpointing.py, from
``SkrullTrainer.init_distributed``): it sets which of the profile's per-mode
fits every later decision reads (``SkrullConfig.use_checkpointing``). Then
the execution (lockstep or free-running) fixes the BucketSize and the timeline (execution.py); those fix
what a step costs, which is what ``lookahead = "auto"`` prices windows with
(data/steps/lookahead_choice.py). ``settle`` makes them in that order, from the
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
from skrull_ext.data.steps import lookahead_choice
from skrull_ext.data.steps.lookahead_choice import LookaheadChoice
from skrull_ext.scheduler.chunk_cost import ChunkRule
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
    """``lookahead = "auto"``'s pricing; None when the job named its width or the run is too short."""
    note: str | None = None
    """``"auto"`` on a run shorter than every candidate width: why it is 1."""
    capped: str | None = None
    """A named width wider than the run, capped at its steps: the warning."""
    chunk_note: str | None = None
    """Under ``overlength = "chunk"``: how a chunked document's chunk is chosen (``chunk_rule``)."""

    def log(self, logger) -> None:
        """The start-up lines, in the order decided."""
        logger.info(f"Skrull execution: {self.execution.reason}")
        for line in (self.lookahead.line() if self.lookahead else None, self.note, self.chunk_note):
            if line is not None:
                logger.info(line)
        if self.capped is not None:
            logger.warning(self.capped)


def settle(skrull, *, dp: int, cp: int, dp_shard: int, dp_replicate: int, shape: ModelShape, model_name: str,
           unsharded: float | None, training_steps: int, raw_lengths: Callable[[int], Sequence[int]],
           limited_lengths: Callable[[SchedulerJob, int], Sequence[int]],
           check_lengths: Callable[[SchedulerJob, int], object],
           chunked_lengths: Callable[[SchedulerJob, int], Sequence[int]] | None = None,
           gradient_bytes: float = 0.0, unsharded_params: float = 0.0, no_free_running: str | None = None,
           chunk_regather: bool = False) -> Settled:
    """Settle the job (module docstring). ``unsharded``: what free-running would hold per
    rank (None: no FSDP unit); ``raw_lengths(step)``: a step's global batch as drawn (the
    execution's weighing of BucketSize); ``limited_lengths(job, step)``: the same as ``job``'s
    length limit trains it in its micro-batches (what "auto" prices); ``chunked_lengths(job,
    step)``: under ``overlength = "chunk"`` the step's chunked documents, priced with it as
    the loader's windows are; ``check_lengths(job, last_step)``: the
    over-length refusals of steps 1..last_step under ``job``'s limit, run before "auto" prices
    them (under 'error' a bad sample stops the run there, named with the scan's counts; the
    trainer's full pre-scan runs once the checkpoint's windows are known). A named width wider
    than the run is capped at its steps, and "auto" prices only widths within the run
    (lookahead_choice.within_run). Raises ValueError (one line) for a free-running job that
    does not fit. ``gradient_bytes``: one gradient of a rank's trainable parameters, which a
    chunked document holds summed over its chunks (``chunk_rule``); ``unsharded_params``: every
    FSDP unit's unsharded parameters, which a checkpointed chunk's recompute gathers at once
    (scheduler/chunk_cost.py). ``no_free_running``: why
    this job cannot run free at DP > 1 (execution.py). ``chunk_regather``: its chunks are traced,
    their recompute gathering their K/V again (CostModel.chunk_regather, train/chunk_path.py)."""
    weigh = skrull.free_running == AUTO and skrull.bucket_size == FROM_PROFILE
    first = [list(raw_lengths(k)) for k in range(1, min(training_steps, PREDICT_STEPS) + 1)] if weigh else []
    execution = choose_execution(skrull, unsharded=unsharded, dp=dp, cp=cp, dp_shard=dp_shard,
                                 dp_replicate=dp_replicate, shape=shape, model_name=model_name, steps=first,
                                 no_free_running=no_free_running)
    timeline = job_timeline(dp_shard, dp_replicate, execution.free_running, skrull.defer_grad_sync)
    auto = skrull.lookahead == LOOKAHEAD_AUTO
    job = skrull.resolve(dp, cp, shape, model_name, timeline=timeline, free_running=execution.free_running,
                         bucket_size=execution.bucket_size, lookahead=1 if auto else None,
                         chunk_regather=chunk_regather)
    rule, chunk_note = chunk_rule(skrull, job, gradient_bytes, unsharded_params)
    job = dataclasses.replace(job, chunk_rule=rule)
    if not auto:
        width, capped = lookahead_choice.within_run(job.lookahead, training_steps)
        return Settled(dataclasses.replace(job, lookahead=width), execution, None, capped=capped,
                       chunk_note=chunk_note)
    candidates = [w for w in lookahead_choice.CANDIDATES if w <= training_steps]
    if not candidates:
        return Settled(job, execution, None, note=f"skrull.lookahead auto: 1 (the run trains {training_steps} step(s), "
                                             f"fewer than the narrowest width {min(lookahead_choice.CANDIDATES)})",
                       chunk_note=chunk_note)
    steps = lookahead_choice.horizon(training_steps, candidates)
    check_lengths(job, steps)
    chunked = None if chunked_lengths is None or job.overlength != "chunk" else (lambda s: chunked_lengths(job, s))
    choice = lookahead_choice.choose(lambda s: limited_lengths(job, s), lambda b, c=None: plan_window(job, b, c),
                                     steps, candidates, chunked)
    return Settled(dataclasses.replace(job, lookahead=choice.width), execution, choice, chunk_note=chunk_note)


def chunk_rule(skrull, job: SchedulerJob, gradient_bytes: float,
               unsharded_params: float = 0.0) -> tuple[ChunkRule | None, str | None]:
    """Under ``overlength = "chunk"``, the rule that picks each chunked document's chunk (the
    largest whose predicted peak fits a rank: scheduler/chunk_cost.py fitting_chunk) on the
    profile's measured memory model, and the start-up line saying so; without one (a hardware
    preset, or a profile with no [memory]) the chunk stays the group's limit, said once here.
    (None, None) for any other mode."""
    if job.overlength != "chunk":
        return None, None
    limit = job.capacity.group_limit
    memory, why = skrull.measured_memory()
    rule = ChunkRule(job.cost_model, memory, limit, job.cp, gradient_bytes, unsharded_params)
    if memory is None:
        return rule, (f"skrull.overlength chunk: chunks of the limit, {rule.chunk(limit)} tokens, unchecked against "
                      f"memory: {why}, so a chunked document's K/V on top of a chunk's activations may exceed it "
                      "(name a profile file: python -m skrull_ext.profile)")
    unit = f"cp {job.cp}" if rule.unit == job.cp else f"cp {job.cp} x tp {rule.unit // job.cp}"
    return rule, (f"skrull.overlength chunk: each document in the largest chunk (a multiple of {unit}, at most "
                  f"{limit} tokens) whose predicted peak with its K/V fits a rank's memory ({skrull.cost_model})")
