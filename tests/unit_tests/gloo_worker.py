"""What a spawned gloo test worker does first, and call counting inside it.

Shared by the multi-process tests that start their own ranks with
``torch.multiprocessing`` over a file store (DACP's pool and replay, FSDP's
free-running switches and its gloo collectives)."""

import os

import torch
import torch.distributed as dist


def join_gloo(store: str, rank: int, world: int) -> None:
    """One torch thread (the ranks share the machine's cores), loopback, and the
    gloo group of ``world`` ranks rendezvousing at the file ``store``."""
    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)


def count_calls(module, attrs: dict[str, str]) -> dict[str, int]:
    """Replace ``module.<attr>`` for each ``label: attr`` with a wrapper that counts
    its calls under ``label``, then calls the original; returns the live counts."""
    calls = dict.fromkeys(attrs, 0)
    for label, attr in attrs.items():
        real = getattr(module, attr)

        def counted(*a, _real=real, _label=label, **k):
            calls[_label] += 1
            return _real(*a, **k)

        setattr(module, attr, counted)
    return calls
