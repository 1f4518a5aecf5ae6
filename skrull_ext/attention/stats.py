# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""Counters of what DACP attention did, for the trainer's metrics.

Every field is a sum over attention calls (one call = one layer of one
micro-batch) since the last :meth:`DacpStats.reset`; divide by ``calls`` for
per-layer values. Byte counts are what this rank must receive for the
collective to complete, (N-1)/N of the gathered size, whatever algorithm
the backend uses; that is the quantity DACP is meant to shrink.

Times are host wall-clock seconds (``time.perf_counter``). On CPU/gloo they
measure the overlap directly: ``local_s`` is compute done while the all-gather
was in flight, ``fwd_wait_s``/``bwd_wait_s`` is time still blocked on it
afterwards. On CUDA they only measure kernel launch and host blocking; use a
profiler trace there.
"""

from dataclasses import asdict, dataclass, fields

__all__ = ["DacpStats"]


@dataclass(slots=True)
class DacpStats:
    calls: int = 0
    """Attention calls of the forward pass (one per layer per micro-batch)."""
    recomputes: int = 0
    """Calls re-run inside backward by activation checkpointing."""
    local_seqs: int = 0
    local_tokens: int = 0
    dist_seqs: int = 0
    dist_tokens: int = 0
    """This rank's tokens of distributed sequences (its shards, padding included)."""
    fwd_bytes: int = 0
    """K/V bytes received by this rank in the forward all-gathers (recomputation included)."""
    bwd_bytes: int = 0
    """dK/dV bytes received by this rank in the backward reduce-scatters."""
    all_gathers: int = 0
    """K/V all-gathers issued (forward and recomputation together; with
    DacpAttention under AC a recomputation replays instead). Under skrull-pool,
    a rank-set exchange (routes.py) counts as one, and its reverse as one
    reduce-scatter."""
    replays: int = 0
    """Recomputations that reused their forward's gathered K/V instead of gathering."""
    reduce_scatters: int = 0
    """dK/dV reduce-scatters issued in backward."""
    local_s: float = 0.0
    fwd_wait_s: float = 0.0
    bwd_wait_s: float = 0.0

    def reset(self) -> None:
        for f in fields(self):
            setattr(self, f.name, f.default)

    def as_dict(self, prefix: str = "dacp/") -> dict[str, float]:
        """Flat dict ready for a metrics logger."""
        return {prefix + k: v for k, v in asdict(self).items()}
