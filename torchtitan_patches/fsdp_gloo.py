"""FSDP2 on gloo: SUM reductions, and its two collectives sent point to point.

Two things FSDP2 does not fit to gloo, both set per unit through FSDP2's own
switches (``set_force_sum_reduction_for_comms``, ``set_custom_all_gather``,
``set_custom_reduce_scatter``), never by editing torch or torchtitan:

- gloo has no ``PREMUL_SUM`` (torchtitan 0.3.0's ``gradient_divide_factor=1.0``
  asks for it) and no ``AVG``: SUM, dividing after, is numerically the same.
- gloo's reduce-scatter is an all-reduce of the whole buffer, each rank keeping
  its slice. The K/V exchange's ``p2p`` transport
  (``skrull_ext.attention.transport.p2p_gather`` and ``p2p_scatter_sum``:
  every rank sends each peer its slice at once, and sums what it receives in
  rank order) reduce-scattered FSDP-sized buffers (0.25-16 MiB) in 0.6-0.8x
  gloo's time at 2 ranks and 0.2-0.7x at 4, and gathered them level with
  gloo at 2 ranks and in 0.5-0.8x at 4, over loopback (``python
  tools/measure_transports.py --world 2 4``; docs/benchmarks.md, section 7).

Each call checks its group's backend: a call the p2p transport does not
cover (another backend, an asynchronous all-gather, a reduction other than
SUM) goes to FSDP's own default, so the comms change nothing off gloo.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter
from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter

from skrull_ext.attention.transport import p2p_gather, p2p_scatter_sum

__all__ = ["P2PAllGather", "P2PReduceScatter", "fit_fsdp_to_gloo"]


def _on_gloo(group: dist.ProcessGroup) -> bool:
    return str(dist.get_backend(group)) == "gloo"


class _PlainBuffers:
    """FSDP's ``Comm.allocate``: a plain ``torch.empty``, as its default comms allocate."""

    def allocate(self, size: Sequence[int], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)


class P2PAllGather(_PlainBuffers, AllGather):
    """FSDP's all-gather by point-to-point sends on gloo; FSDP's default otherwise."""

    def __init__(self) -> None:
        self._default = DefaultAllGather()

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 async_op: bool = False) -> dist.Work | None:
        if async_op or not _on_gloo(group):  # FSDP waits on an async call only if it returns a c10d Work
            return self._default(output_tensor, input_tensor, group, async_op)
        p2p_gather(output_tensor, input_tensor, group).wait()
        return None


class P2PReduceScatter(_PlainBuffers, ReduceScatter):
    """FSDP's gradient reduce-scatter by point-to-point sends on gloo (SUM only,
    as ``set_force_sum_reduction_for_comms`` asks); FSDP's default otherwise."""

    def __init__(self) -> None:
        self._default = DefaultReduceScatter()

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 op, async_op: bool = False) -> dist.Work | None:
        if async_op or op != dist.ReduceOp.SUM or not _on_gloo(group):
            return self._default(output_tensor, input_tensor, group, op, async_op)
        p2p_scatter_sum(output_tensor, input_tensor, group).wait()
        return None


def fit_fsdp_to_gloo(model: nn.Module) -> int:
    """SUM reductions and the p2p collectives on every FSDP unit of ``model``
    (the CPU fix ``fsdp_on_gloo``, and the profiler's own FSDP); returns how
    many units were set."""
    n = 0
    for module in model.modules():
        if not isinstance(module, FSDPModule):
            continue
        module.set_force_sum_reduction_for_comms(True)
        module.set_custom_all_gather(P2PAllGather())
        module.set_custom_reduce_scatter(P2PReduceScatter())
        n += 1
    return n
