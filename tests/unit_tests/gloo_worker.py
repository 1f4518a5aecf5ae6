"""What a spawned gloo test worker does first, and call counting inside it.

Shared by the multi-process tests that start their own ranks with
``torch.multiprocessing`` over a file store (DACP's pool and replay, FSDP's
free-running switches and its gloo collectives)."""

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist


def join_gloo(store: str, rank: int, world: int) -> None:
    """One torch thread (the ranks share the machine's cores), loopback, and the
    gloo group of ``world`` ranks rendezvousing at the file ``store``."""
    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)


@contextmanager
def gloo_group(store: str, rank: int, world: int) -> Iterator[None]:
    """The gloo group for the body (``join_gloo``), left together: after a body
    that succeeded every rank meets in a barrier before any rank destroys the
    group, so none shuts gloo down while a peer still exchanges with it (a
    3-rank FSDP test aborted one rank with "terminate called without an active
    exception" in CI once). After a failure the group is destroyed at once:
    a barrier would wait for the ranks that went on."""
    join_gloo(store, rank, world)
    try:
        yield
        dist.barrier()
    finally:
        dist.destroy_process_group()


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
