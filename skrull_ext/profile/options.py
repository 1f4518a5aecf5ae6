# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""What the profiler measures and how often: one plain dataclass.

The defaults profile the CPU debug job in well under five minutes on two
shared cores for each activation-checkpointing mode measured (the job's own
and ``ac_modes``: three, so up to about seven minutes on a loaded box;
``--ac-modes ''`` measures the job's only); a GPU run passes longer ladders on the command line. Values are
checked in ``__post_init__`` and errors name the option.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

from skrull_ext.scheduler.checkpointing import MODES

__all__ = ["ProfileOptions", "parse_bytes", "parse_ints"]

_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9, "t": 1e12, "tb": 1e12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str) -> int:
    """'1GiB', '512MiB', '80GB', '1e9' -> bytes."""
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"not a byte size: {text!r} (e.g. 1GiB, 512MiB, 80GB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def parse_ints(text: str) -> tuple[int, ...]:
    """'128,256,512' or '128:4096' (powers of two from 128 to 4096) -> ints."""
    text = text.strip()
    if ":" in text:
        lo, hi = (parse_bytes(t) for t in text.split(":", 1))
        if not 1 <= lo <= hi:  # 0 doubled never passes hi (the ladder never ended); lo > hi is empty
            raise ValueError(f"the range {text!r} must run from a first value >= 1 up to a last one >= it")
        out, v = [], lo
        while v <= hi:
            out.append(v)
            v *= 2
        return tuple(out)
    try:
        return tuple(parse_bytes(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise ValueError(f"not a list of positive integers: {text!r} (e.g. 128,256,512 or 128:4096; KiB/MiB "
                         "suffixes allowed)") from None


@dataclass(kw_only=True, slots=True)
class ProfileOptions:
    lengths: tuple[int, ...] = ()
    """Sequence lengths (tokens, one sequence per buffer) the compute fit uses; () derives them from the job."""
    held_out: tuple[int, ...] = ()
    """Lengths timed but left out of the fit, to test its predictions; () derives them."""
    packed: tuple[tuple[int, ...], ...] | None = None
    """Buffers of several documents, timed against the summed per-document prediction; None derives them."""
    warmup: int = 1
    """Untimed rounds over all compute buffers (allocator, caches, compile)."""
    repeats: int = 5
    """Timed rounds over all compute buffers; the median per buffer is kept."""
    clock: str = "auto"
    """Compute clock: wall, cpu (process time, immune to other processes on a
    shared host), or auto (cpu for single-threaded CPU runs, else wall)."""
    layers: int = 0
    """Transformer layers timed per pass (0: all); time per layer = total / layers."""
    memory_lengths: tuple[int, ...] = ()
    """Tokens per buffer for the activation-memory ladder (whole model + loss); () derives them."""
    memory_limit: int = 0
    """Bytes one rank may use (0: device total, on CPU physical RAM / local ranks)."""
    margin: float = 0.05
    """Safety margin on BucketSize: the share of the activation budget left free for what the fit misses."""
    world_size: int = 0
    """Ranks of the job the profile is for (resolves FSDP degree -1); 0: this launch's."""
    comm_sizes: tuple[int, ...] = tuple(2**k for k in range(12, 25))
    """Message sizes (bytes of the gathered K/V, all ranks together) for the collectives."""
    comm_warmup: int = 2
    """Untimed rounds of collectives (one call per size and collective each)."""
    comm_repeats: int = 11
    """Timed rounds; per size the median per rank, then the slowest rank, is kept."""
    threads: int = 0
    """torch intra-op threads (0: leave torch's default; torchrun sets 1 per rank)."""
    micro_batch_counts: tuple[int, ...] = (1, 2, 4)
    """Micro-batches per step for the fixed-cost fit (micro_batch.py): the same tokens split this many ways."""
    micro_batch_doc: int = 32
    """Tokens of each document of that step (max(micro_batch_counts) documents)."""
    micro_batch_repeats: int = 11
    """Timed rounds of those steps (after ``warmup`` untimed ones); the median per count is kept."""
    ac_modes: tuple[str, ...] = MODES
    """Activation-checkpointing modes measured besides the job's own (checkpointing.py); () none."""
    check: bool = True
    """Run a forward+backward over a buffer of BucketSize tokens and measure its memory."""
    seed: int = 0
    """Seed of the random tokens and of the check buffer's document lengths."""
    extra_meta: dict = field(default_factory=dict)
    """Free-form provenance added to [meta] (e.g. the command line)."""

    def __post_init__(self) -> None:
        for name in ("lengths", "memory_lengths", "comm_sizes"):
            v = getattr(self, name)
            if (v or name == "comm_sizes") and (len(v) < 2 or any(x < 1 for x in v)):
                raise ValueError(f"--{name.replace('_', '-')}: need at least 2 positive values, got {v}")
        if set(self.held_out) & set(self.lengths):
            raise ValueError(f"--held-out: {sorted(set(self.held_out) & set(self.lengths))} also in --lengths")
        if any(x < 1 for x in self.held_out):
            raise ValueError(f"--held-out: lengths must be positive, got {self.held_out}")
        for name in ("warmup", "comm_warmup", "layers", "threads", "world_size", "memory_limit"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name.replace('_', '-')}: must be >= 0, got {getattr(self, name)}")
        if len(set(self.micro_batch_counts)) < 2 or any(m < 1 for m in self.micro_batch_counts):
            raise ValueError(f"--micro-batch-counts: need at least 2 distinct positive counts, "
                             f"got {self.micro_batch_counts}")
        if self.micro_batch_doc < 1:
            raise ValueError(f"--micro-batch-doc: must be >= 1, got {self.micro_batch_doc}")
        for name in ("repeats", "comm_repeats", "micro_batch_repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')}: must be >= 1, got {getattr(self, name)}")
        if any(m not in MODES for m in self.ac_modes):
            raise ValueError(f"--ac-modes: {[m for m in self.ac_modes if m not in MODES]} not among {list(MODES)}")
        if not 0 <= self.margin < 1:
            raise ValueError(f"--margin: must be in [0, 1), got {self.margin}")

    def for_job(self, longest: int, cap: int) -> ProfileOptions:
        """These options with every ladder left empty derived from the job.

        ``longest`` is the longest sequence the job feeds (its dataloader's
        max_len, else training.seq_len): compute lengths run to twice that
        (a rank's local part sums several sequences' FLOPs), held-out lengths
        sit between the fit points, and the memory ladder runs to four times
        it, where BucketSize usually lands. ``cap`` is the model's context.
        """
        top = min(2 * longest, cap)
        scaled = lambda fracs, t: tuple(sorted({max(16, min(cap, int(t * f) // 16 * 16)) for f in fracs}))  # noqa: E731
        lengths = self.lengths or scaled((1 / 16, 1 / 8, 1 / 4, 3 / 8, 1 / 2, 3 / 4, 1), top)
        held_out = self.held_out or tuple(
            v for v in scaled((3 / 16, 5 / 16, 5 / 8, 7 / 8), top) if v not in lengths)
        packed = self.packed if self.packed is not None else (
            (top // 4,) * 4, (top // 2, 3 * top // 8, top // 8))
        memory = self.memory_lengths or scaled((1 / 16, 1 / 8, 1 / 4, 1 / 2, 3 / 4, 1), min(4 * longest, cap))
        return dataclasses.replace(self, lengths=lengths, held_out=held_out, packed=packed, memory_lengths=memory)

    @property
    def max_length(self) -> int:
        """Longest buffer any step builds (sets the model's RoPE cache)."""
        return max(*self.lengths, *self.held_out, *self.memory_lengths, *(sum(p) for p in self.packed or ()))
