# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""Communication: time the DACP exchange over the process group and fit
the piecewise latency model (docs/design/cost_model.md: t0 below V_threshold, a*V + b above).

DACP's distributed path (skrull_ext/attention/exchange.py) gathers K/V in
forward and reduce-scatters dK/dV in backward, once each per layer, with the
job's transport (``[skrull] kv_exchange``: the all-gather / reduce-scatter
collectives, or point-to-point sends; transport.py). This times the same
functions the attention calls. A message size here is what the cost model
calls Volume: the gathered tensor, all ranks' shards together (each rank
sends size/N). The table written to the profile is the fit to the mean of
the two directions, charged ``collectives_per_layer = 2`` times.

Each call is timed on its own after a barrier, in rounds over all sizes;
per rank the median, then the slowest rank (an exchange ends when its
last rank does).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from skrull_ext.attention.transport import resolve_transport, Transport
from skrull_ext.profile.fit import PiecewiseFit, fit_piecewise
from skrull_ext.profile.options import ProfileOptions
from skrull_ext.profile.ranks import reduce_floats, time_call

__all__ = ["CommResult", "exchange_calls", "profile_comm"]


def exchange_calls(t: Transport) -> dict[str, Callable[[torch.Tensor, torch.Tensor], None]]:
    """One DACP layer's two directions over transport ``t``, called as
    fn(gathered, shard) and waited on; named as the profile records them
    (``all_gather+reduce_scatter`` for the collectives)."""
    gather, scatter = ("all_gather", "reduce_scatter") if t.name == "all_gather" else \
        (f"{t.name}_gather", f"{t.name}_reduce_scatter")
    return {
        gather: lambda total, shard: t.gather(total, shard, None).wait(),  # forward: K/V
        scatter: lambda total, shard: t.scatter_sum(shard, total, None).wait(),  # backward: dK/dV
    }


@dataclass(frozen=True)
class CommResult:
    sizes: list[int]
    """Message bytes (gathered size) actually moved, after rounding to whole elements."""
    us: dict[str, list[float]]
    """Per collective, latency at each size (median per rank, slowest rank)."""
    fit: PiecewiseFit
    backend: str
    world_size: int

    @property
    def mean_us(self) -> list[float]:
        cols = list(self.us.values())
        return [sum(c[i] for c in cols) / len(cols) for i in range(len(self.sizes))]


def profile_comm(device: torch.device, dtype: torch.dtype, opts: ProfileOptions,
                 tick: Callable[[str], None], exchange: str = "auto") -> CommResult:
    """Time both directions of the ``exchange`` transport at every size of the ladder:
    ``comm_warmup`` untimed rounds, then ``comm_repeats`` timed rounds, each
    round one call per (size, collective) after a barrier, so a burst of
    load from other processes spreads over all sizes."""
    n = dist.get_world_size()
    dev = device if dist.get_backend() == "nccl" else torch.device("cpu")
    elem = dtype.itemsize
    bufs = []
    for size in sorted(set(opts.comm_sizes)):
        shard_elems = max(1, size // (n * elem))
        bufs.append((shard_elems * n * elem, torch.empty(shard_elems * n, device=dev, dtype=dtype),
                     torch.randn(shard_elems, device=dev).to(dtype)))
    sizes = sorted({b[0] for b in bufs})
    bufs = [next(b for b in bufs if b[0] == s) for s in sizes]
    calls = exchange_calls(resolve_transport(exchange, None))
    samples = {name: [[] for _ in sizes] for name in calls}
    rounds = opts.comm_warmup + opts.comm_repeats
    for r in range(rounds):
        tick(f"collectives round {r + 1}/{rounds}")
        for i, (_, total, shard) in enumerate(bufs):
            for name, fn in calls.items():
                dist.barrier()
                wall, _ = time_call(lambda: fn(total, shard), dev)
                if r >= opts.comm_warmup:
                    samples[name][i].append(wall)
    us = {name: reduce_floats([statistics.median(s) for s in v], "max", dev) for name, v in samples.items()}
    mean = [sum(v[i] for v in us.values()) / len(us) for i in range(len(sizes))]
    return CommResult(sizes, us, fit_piecewise(sizes, mean), dist.get_backend(), n)
