"""Which activation-checkpointing mode a Skrull job runs, chosen at start-up.

The job file sets checkpointing in torchtitan's section, ``[activation_checkpoint]
kind = "none" | "selective" | "full"`` (torchtitan 0.3.0's ActivationCheckpoint
configs; an absent section is torchtitan's default, selective). ``[skrull]
activation_checkpoint`` says whether that kind is the job's choice:

- ``"job"`` (the default): the section's kind runs, as in any torchtitan job;
- ``"auto"``: the mode with the best predicted step time for this job's data
  runs, among the modes the measured profile (``skrull.cost_model``) offers
  (``python -m skrull_ext.profile`` measures each: scheduler/checkpointing.py).

Each mode has its own memory per token, so its own BucketSize (under
``bucket_size = "profile"``; a named bucket_size is allowed to a mode only
when that mode's BucketSize holds it: the memory rule), and its own layer
time (the recompute). A BucketSize with less checkpointing shards more
sequences; the scheduler plans the run's first global batches (the ones
``lookahead = "auto"`` prices, as drawn: each mode has its own length
limit) at each mode's BucketSize and prices them with that mode's cost model,
on the lockstep timeline (the execution is chosen afterwards, at the chosen
mode's BucketSize and against its memory: train/execution.py; the line says
so). The fastest predicted mode runs;
ties go to less recompute. A mode whose BucketSize cannot hold the longest of
those sequences whole or sharded is out; when none can, the mode with the
largest BucketSize runs. One log line says which and why, with the other
modes' predicted times.

Without a measured profile, or with one that measured a single mode, the
section's kind runs and the line says what was assumed and which command
adds the modes. The chosen mode replaces ``config.activation_checkpoint``
before torchtitan builds the model (its parallelize function applies it), and
the job's profile is read under it (``Profile.under_mode``: BucketSize, cost
model and free-running's memory account follow the mode), under "job" too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from skrull_ext._core import ModelShape
from skrull_ext.data.steps.lookahead_choice import HORIZON
from skrull_ext.scheduler.checkpointing import MODES
from skrull_ext.scheduler.config import FROM_PROFILE, job_timeline
from skrull_ext.scheduler.job import SchedulerJob
from skrull_ext.scheduler.model_shape import model_compiled
from skrull_ext.scheduler.profile_file import Profile
from skrull_ext.train.execution import mean_step_us
from skrull_ext.train.job.section_kinds import AC_KINDS, mode_of
from torchtitan_patches import compat

__all__ = ["AC_AUTO", "AC_JOB", "CheckpointChoice", "ac_config", "choose_checkpointing", "first_lengths",
           "mode_of", "settle_checkpointing"]

AC_JOB = "job"
AC_AUTO = "auto"


def ac_config(mode: str, current: Any) -> Any:
    """``config.activation_checkpoint`` for ``mode``: the job's own when it is that mode (its
    options kept), else the mode's defaults."""
    if mode_of(current) == mode:
        return current
    cls = AC_KINDS[mode]
    return None if cls is None else cls()


def _command(profile: Profile) -> str:
    """The profiler command that measures every mode for this profile's job."""
    command = profile.meta.get("command") or "python -m skrull_ext.profile --config-file JOB.toml --out P.toml"
    ranks = profile.meta.get("world_size", 1)
    if isinstance(ranks, int) and ranks > 1:  # [meta] command does not say it ran under torchrun
        command = command.replace("python -m skrull_ext.profile",
                                  f"torchrun --standalone --nproc_per_node {ranks} -m skrull_ext.profile", 1)
    return command if "--ac-modes" in command else f"{command} --ac-modes {','.join(MODES)}"


def _priced_for(profile: Profile | None, mode: str | None) -> str:
    """How the profile prices a job that runs ``mode`` (a clause; '' for a hardware preset)."""
    if profile is None:
        return ""
    if mode in profile.checkpointing_modes:
        return f", priced by the profile's fits for {mode}"
    measured = profile.measured_checkpointing
    if measured is not None and measured != mode:
        return (f"; the profile measured no fits for it, so its BucketSize and prices are {measured}'s "
                f"(measure each mode with: {_command(profile)})")
    return ""


_EXECUTION_NEXT = ("; lockstep or free-running is chosen next, at this mode's BucketSize and with its memory "
                   "(free-running's unsharded copy on top): the 'Skrull execution' line")
"""The auto choice prices each mode lockstep; the execution, chosen after it (train/execution.py,
once the model's unsharded bytes are known), may run free: its line says whether, and under this mode."""


@dataclass(frozen=True)
class CheckpointChoice:
    """The mode a job runs and why."""

    mode: str
    reason: str
    predicted_us: dict[str, float | None]
    """Per mode priced: the mean predicted step time (None: out); {} when nothing was priced."""
    bucket_sizes: dict[str, int]
    """Per mode priced: the BucketSize it would run at."""

    def line(self) -> str:
        return f"Skrull activation checkpointing: {self.mode} ({self.reason})"


def choose_checkpointing(skrull, job_mode: str | None, *, dp: int, cp: int, dp_shard: int, dp_replicate: int,
                         shape: ModelShape, model_name: str,
                         steps: Callable[[], Sequence[Sequence[int]]] = tuple) -> CheckpointChoice:
    """The mode a Skrull job runs (module docstring). ``job_mode``: the job section's
    (``mode_of``); ``steps()``: the first global batches' lengths as drawn (called only under
    "auto" with a profile of several modes). Raises ValueError (one line) when "auto" finds
    no mode whose BucketSize holds a bucket_size the job names."""
    kind = f"the job's [activation_checkpoint] kind {job_mode!r}"
    profile = skrull.measured_profile()
    if skrull.activation_checkpoint == AC_JOB:
        return CheckpointChoice(job_mode or "", f"skrull.activation_checkpoint = 'job': {kind}"
                                + _priced_for(profile, job_mode), {}, {})
    if profile is None:
        return CheckpointChoice(job_mode or "", f"skrull.activation_checkpoint = 'auto', but skrull.cost_model "
                                f"{skrull.cost_model!r} is a hardware preset that measured no mode: assumed {kind} "
                                "(python -m skrull_ext.profile --config-file JOB.toml --out P.toml measures each)",
                                {}, {})
    modes = profile.checkpointing_modes
    if len(modes) < 2:
        measured = profile.measured_checkpointing or "unrecorded"
        return CheckpointChoice(job_mode or "", f"skrull.activation_checkpoint = 'auto', but the profile "
                                f"{profile.path!r} measured one mode ({measured}): assumed {kind}; measure each "
                                f"mode with: {_command(profile)}", {}, {})
    steps = steps()
    timeline = job_timeline(dp_shard, dp_replicate, False, skrull.defer_grad_sync)
    predicted: dict[str, float | None] = {}
    buckets: dict[str, int] = {}
    why_out: dict[str, str] = {}
    for mode in modes:
        view = profile.under_mode(mode)
        fits = view.bucket_size
        if skrull.bucket_size == FROM_PROFILE:
            bucket = fits
        else:
            bucket = skrull.bucket_size
            if bucket > fits:
                why_out[mode] = f"bucket_size {bucket} over its {fits}"
                predicted[mode] = None
                continue
        buckets[mode] = bucket
        job = SchedulerJob.of(skrull, dp=dp, cp=cp, timeline=timeline, bucket_size=bucket, lookahead=1,
                              cost_model=view.cost_model(shape, model_name))
        predicted[mode] = mean_step_us(job, steps)
        if predicted[mode] is None:
            why_out[mode] = f"bucket_size {bucket} cannot hold the longest sequence"
    over = f"the first {len(steps)} global batch{'' if len(steps) == 1 else 'es'}"
    priced = {m: t for m, t in predicted.items() if t is not None}

    def say(m: str) -> str:
        t = predicted[m]
        return (f"{m} {t / 1e3:.2f} ms at bucket_size {buckets[m]}" if t is not None
                else f"{m} out: {why_out[m]}")

    others = "; ".join(say(m) for m in predicted)

    def unused(best: str) -> str:  # a kind the job names and auto does not run: said, and how to force it
        return (f"; the job's kind {job_mode!r} is its fallback only (skrull.activation_checkpoint = 'job' runs it)"
                if job_mode is not None and job_mode != best else "")

    if priced:
        best = min(priced, key=lambda m: (priced[m], MODES.index(m)))
        return CheckpointChoice(best, f"skrull.activation_checkpoint = 'auto': the best predicted step time "
                                f"on {over} (mean; each mode at its own BucketSize, priced lockstep by the profile's "
                                f"per-mode fits): {others}{unused(best)}{_EXECUTION_NEXT}", predicted, buckets)
    if buckets:
        best = max(buckets, key=lambda m: (buckets[m], -MODES.index(m)))
        return CheckpointChoice(best, f"skrull.activation_checkpoint = 'auto': no mode's BucketSize holds the "
                                f"longest sequence of {over}, so the largest BucketSize: {others}{unused(best)}"
                                f"{_EXECUTION_NEXT}", predicted, buckets)
    raise ValueError(f"skrull.activation_checkpoint = 'auto': no mode the profile {profile.path!r} measured fits "
                     f"skrull.bucket_size {skrull.bucket_size}: {others}; lower skrull.bucket_size or set it to "
                     f"'{FROM_PROFILE}'")


def first_lengths(config, dp: int) -> list[list[int]]:
    """The lengths of the run's first global batches as drawn (at most lookahead's HORIZON),
    before torchtitan builds the dataloader: from a loader of the job's own, built early for
    this and dropped (its source is read twice at start-up)."""
    tokenizer = config.tokenizer.build(tokenizer_path=config.hf_assets_path)
    loader = config.dataloader.build(dp_world_size=dp, dp_rank=0, tokenizer=tokenizer)
    steps = min(HORIZON, config.training.steps)
    return [[n for _, n in loader.step_lengths(k)] for k in range(1, steps + 1)]


def settle_checkpointing(config, dims, shape: ModelShape, model_name: str,
                         lengths: Callable[[Any, int], list[list[int]]] = first_lengths) -> CheckpointChoice:
    """Choose the mode of a Skrull job (``choose_checkpointing``) once its dims are known
    (torchtitan's ParallelDims) and before its model is built, and apply it: the mode's
    torchtitan config in ``config.activation_checkpoint`` (the model's parallelize function
    applies it) and the profile read under it from here on (``SkrullConfig.use_checkpointing``).
    ``lengths(config, dp)``: the first global batches' lengths (``first_lengths``)."""
    skrull = config.skrull
    dp = dims.get_mesh("batch").size() if dims.dp_enabled else 1  # as torchtitan sizes its dataloader
    choice = choose_checkpointing(skrull, mode_of(config.activation_checkpoint), dp=dp, cp=dims.cp,
                                  dp_shard=dims.dp_shard, dp_replicate=dims.dp_replicate, shape=shape,
                                  model_name=model_name, steps=lambda: lengths(config, dp))
    if choice.mode:
        skrull.use_checkpointing(choice.mode)
        config.activation_checkpoint = ac_config(choice.mode, config.activation_checkpoint)
    if skrull.activation_checkpoint == AC_AUTO:  # the job's own kind was checked with the job (job_checks)
        compat.check_checkpointed_compile(config, model_compiled(config),
                                          f"skrull.activation_checkpoint = 'auto' chose {choice.mode!r}")
    return choice
