"""Per-rank counters for ``python -m skrull_ext.bench cp``.

    torchrun ... -m torchtitan_patches.cp_probe skrull_ext.train --config-file JOB.toml ...

Runs the training entry point unchanged and measures, per training step and
per rank, the same three things for both CP implementations:

- K/V bytes this rank receives in the attention exchange: torchtitan's CP
  all-gathers K and V (``flex_cp_allgather``) and reduce-scatters their
  gradients (``flex_cp_allgather_backward``); DACP all-gathers the distributed
  sequences' K/V and reduce-scatters their gradients (collectives or
  point-to-point: ``skrull_ext.attention.transport``). Counted at those call sites, so FSDP's
  parameter traffic over the same ranks is not mixed in;
- time blocked on that exchange: torchtitan's all-gather returns only when
  the data has landed, so its whole call is blocked time; DACP's is the time
  spent in ``wait`` (``DacpStats.fwd_wait_s + bwd_wait_s``), and the local
  attention computed while the exchange was in flight (``local_s``) is the
  overlap;
- step wall time, between consecutive optimizer steps.

Rank r writes ``$SKRULL_BENCH_PROBE_OUT/rank{r}.json``. The product code
carries no switch for this: the probe wraps functions from outside.
"""

import json
import os
import runpy
import sys
import time
from collections import defaultdict


def record_trainers() -> list:
    """Make every torchtitan Trainer built from now on append itself to the returned list
    (probes reach the running trainer through it)."""
    from torchtitan.trainer import Trainer

    trainers: list = []
    init = Trainer.__init__

    def recording_init(self, *args, **kwargs):
        trainers.append(self)
        init(self, *args, **kwargs)

    Trainer.__init__ = recording_init
    return trainers


def _install(out_dir: str):
    """Wrap the exchange call sites and the optimizer step; return the function that writes the counters."""
    import torch.distributed.distributed_c10d as c10d
    from torch.distributed.tensor.experimental._context_parallel import _attention as cp_attention
    from torch.distributed.tensor.experimental._context_parallel import _cp_custom_ops as cp_ops
    from torch.optim.optimizer import register_optimizer_step_pre_hook
    from torchtitan.components.optimizer import OptimizersContainer
    from torchtitan.distributed.context_parallel import api as titan_cp

    from skrull_ext.attention import transport

    now = {"fwd_bytes": 0, "bwd_bytes": 0, "fwd_calls": 0, "bwd_calls": 0, "blocked_s": 0.0}
    steps: list[dict] = []
    last = [None]

    def nbytes(*tensors) -> int:
        return sum(t.numel() * t.element_size() for t in tensors)

    # torchtitan's CP (flex path): forward all-gather of K and V shards...
    gather_kv = cp_attention.flex_cp_allgather

    def counted_gather_kv(k, v, seq_dim, pg_name):
        now["fwd_bytes"] += (c10d._get_group_size_by_name(pg_name) - 1) * nbytes(k, v)
        now["fwd_calls"] += 1
        t0 = time.perf_counter()
        out = gather_kv(k, v, seq_dim, pg_name)
        now["blocked_s"] += time.perf_counter() - t0
        return out

    # Patched where it is called from, whatever was imported first: torchtitan's CP
    # wrapper binds the name at import (``from ..._attention import flex_cp_allgather``).
    cp_attention.flex_cp_allgather = counted_gather_kv
    titan_cp.flex_cp_allgather = counted_gather_kv

    # ...and the backward reduce-scatter of dK, dV (looked up by the op's autograd).
    scatter_grads = cp_ops.flex_cp_allgather_backward

    def counted_scatter_grads(gk, gv, seq_dim, pg_name):
        n = c10d._get_group_size_by_name(pg_name)
        now["bwd_bytes"] += (n - 1) * nbytes(gk, gv) // n
        now["bwd_calls"] += 1
        t0 = time.perf_counter()
        out = scatter_grads(gk, gv, seq_dim, pg_name)
        now["blocked_s"] += time.perf_counter() - t0
        return out

    cp_ops.flex_cp_allgather_backward = counted_scatter_grads

    # DACP: the asynchronous exchange of the distributed sequences' K/V, whichever
    # transport the job runs (all-gather collectives or point-to-point sends).
    def counted_transport(t: transport.Transport) -> transport.Transport:
        def gather(out, shard, group):
            now["fwd_bytes"] += (out.numel() - shard.numel()) * shard.element_size()
            now["fwd_calls"] += 1
            return t.gather(out, shard, group)

        def scatter_sum(out, full, group):
            now["bwd_bytes"] += (full.numel() - out.numel()) * out.element_size()
            now["bwd_calls"] += 1
            return t.scatter_sum(out, full, group)

        return transport.Transport(t.name, gather, scatter_sum)

    for name, t in list(transport.TRANSPORTS.items()):
        transport.TRANSPORTS[name] = counted_transport(t)

    def dump() -> None:
        # After every step, so a run that dies in teardown keeps its measurements.
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, f"rank{os.environ.get('RANK', '0')}.json"), "w") as f:
            json.dump(steps, f)

    trainers = record_trainers()

    def hook(optimizer, args, kwargs):
        # Fires for the container and for each optimizer inside it; once is enough.
        if not isinstance(optimizer, OptimizersContainer) or not trainers:
            return
        t = time.perf_counter()
        dacp = defaultdict(float)
        modules = getattr(trainers[-1], "dacp_attention", None) or []
        for m in modules:
            for name, value in m.stats.as_dict(prefix="").items():
                dacp[name] += value
        blocked = now["blocked_s"] + dacp["fwd_wait_s"] + dacp["bwd_wait_s"]
        steps.append({
            "step": trainers[-1].step,
            "wall_s": None if last[0] is None else t - last[0],
            "kv_bytes": now["fwd_bytes"] + now["bwd_bytes"],
            **{k: now[k] for k in ("fwd_bytes", "bwd_bytes", "fwd_calls", "bwd_calls")},
            "blocked_s": blocked,
            "overlapped_s": dacp["local_s"],
            # The attention's own count, to cross-check the one taken here.
            "dacp_stats_bytes": int(dacp["fwd_bytes"] + dacp["bwd_bytes"]) if modules else None,
            "local_tokens": dacp["local_tokens"],
            "dist_tokens": dacp["dist_tokens"],
            # Real tokens of the step over all ranks (the loader's count, padding excluded).
            "step_tokens": getattr(trainers[-1].dataloader, "last_tokens", None),
        })
        last[0] = t
        now.update(fwd_bytes=0, bwd_bytes=0, fwd_calls=0, bwd_calls=0, blocked_s=0.0)
        dump()

    register_optimizer_step_pre_hook(hook)

    return dump


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit("usage: python -m torchtitan_patches.cp_probe ENTRY_MODULE [ARGS...]")
    out_dir = os.environ.get("SKRULL_BENCH_PROBE_OUT")
    if not out_dir:
        raise SystemExit("set SKRULL_BENCH_PROBE_OUT to the folder for the per-rank counters")
    entry, args = sys.argv[1], sys.argv[2:]
    dump = _install(out_dir)
    sys.argv = [entry, *args]
    runpy.run_module(entry, run_name="__main__", alter_sys=True)
    dump()


if __name__ == "__main__":
    main()
