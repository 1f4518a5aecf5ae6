# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""Each activation-checkpointing mode's compute and memory (``--ac-modes``).

A job chooses its mode at start-up by predicted step time under the memory
rule (train/checkpointing.py), so the profile needs, per mode, what
``[compute]`` and ``[memory]`` hold for the job's own: the layer's
forward+backward time fitted as compute.py fits it (a checkpointed block
recomputes its forward in backward: the recompute is in the fit) and the
memory ladder fitted as memory.py fits it, with the BucketSize it gives
against the same static account, usable bytes and margin.

The job's own mode is the main measurement, taken once. Every other mode is
the job's model built again with ``--activation_checkpoint.kind MODE`` added
to the job's flags (the one flag parser; model.py applies it as the trainer's
parallelize function does, before compile) and measured over the same
ladders. The profile's BucketSize check (check.py) runs for the job's mode
only. Written as the profile's ``[activation_checkpoint]`` section
(scheduler/checkpointing.py).
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from skrull_ext.profile.compute import ComputeResult, profile_compute
from skrull_ext.profile.memory import MemoryResult, profile_memory
from skrull_ext.profile.model import build_job_model
from skrull_ext.profile.options import ProfileOptions
from skrull_ext.scheduler.checkpointing import MODES, ModeCost
from skrull_ext.train.checkpointing import mode_of

__all__ = ["ModeRun", "mode_cost", "profile_modes"]


@dataclass(frozen=True)
class ModeRun:
    """One mode measured: its compute and memory results."""

    mode: str
    compute: ComputeResult
    memory: MemoryResult

    @property
    def cost(self) -> ModeCost:
        return mode_cost(self.mode, self.compute, self.memory)


def mode_cost(mode: str, compute: ComputeResult, memory: MemoryResult) -> ModeCost:
    """What the profile file keeps of a mode's measurement."""
    return ModeCost(mode, compute.fit.slope, compute.fit.intercept, compute.attention_weight, memory.fit.slope,
                    memory.fit.intercept, memory.fit.quadratic, memory.bucket_size,
                    host_floor_us=compute.floor.us if compute.floor is not None else 0.0)


def steps_per_mode(opts: ProfileOptions) -> int:
    """Progress-bar steps one extra mode takes (build, compute rounds, memory ladder)."""
    buffers = len(opts.lengths) + len(opts.held_out) + len(opts.packed or ())
    return 1 + buffers * (opts.warmup + opts.repeats) + len(opts.memory_lengths)


def profile_modes(job_config: Any, config_of: Callable[[str], Any], modes: Sequence[str], compute: ComputeResult,
                  memory: MemoryResult, device: torch.device, max_len: int, opts: ProfileOptions, world_size: int,
                  tick: Callable[[str], None]) -> tuple[str | None, dict[str, ModeRun]]:
    """(the job's mode, each mode measured) for ``modes`` and the job's own: the job's from
    ``compute`` and ``memory`` (its main measurement), every other one on the model of
    ``config_of(mode)`` (the job's config with that kind), built for ``max_len`` tokens.
    A job whose kind no profile measures (torchtitan's memory-budget) gets none: (None, {})."""
    measured = mode_of(job_config.activation_checkpoint)
    if measured is None:
        return None, {}
    runs = {measured: ModeRun(measured, compute, memory)}
    for mode in MODES:
        if mode not in modes or mode in runs:
            continue
        tick(f"build model ({mode} checkpointing)")
        jm = build_job_model(config_of(mode), device, max_len)
        assert mode_of(jm.config.activation_checkpoint) == mode, "the flag sets the kind"
        runs[mode] = ModeRun(mode, profile_compute(jm, opts, tick), profile_memory(jm, opts, world_size, tick))
        del jm
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return measured, {m: runs[m] for m in MODES if m in runs}
