"""Chunked documents under lockstep DP ranks: every rank runs as many chunk passes as the others.

Under lockstep (``skrull.free_running = false``, or "auto" settled there) FSDP all-gathers each
unit over every DP rank in each forward, again in each recompute and backward, and a syncing
backward reduce-scatters over them: every DP rank must run the same sequence of passes. A chunked
document (train/chunked.py) is one DP rank's passes, one per chunk, so ranks holding documents of
different chunk counts (or none) would leave each other's collectives unmatched.

So every rank derives, from the step's plan (the same on every rank), how many chunk passes each
position runs: for k in 0..(the most chunked documents any DP rank holds), n_k = the most chunks
any rank's k-th document takes. A rank runs its k-th document extended with pad chunks to n_k
passes, or, holding no k-th document, an all-pad document of n_k passes. A pad chunk holds one
token per CP rank (only the pass count must match), comes after every real token of its document
(causality hides it from them) and has its labels ignored: the loss and every gradient are the
document's own (tests/unit_tests/test_chunk_lockstep.py; the trainer's run,
tests/integration_tests/test_chunk_dp_run.py). Every rank's last pass of a position is a chunk
that is not checkpointed (chunked.py: the document's last pass, real or pad), the ones before it
are: the same forward / recompute / backward order of FSDP calls on every rank.

A pure function of the plan, here beside it: the trainer runs it (train/passes.py) and the plan
prices it (``Plan.chunked_pads``): a pad chunk costs about one micro-batch's fixed time (its tokens
are a handful; its FSDP calls and launches are a pass's), ``micro_batch_fixed_us`` each.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["PaddedDocument", "lockstep_chunks", "lockstep_documents", "lockstep_pads"]


@dataclass(frozen=True)
class PaddedDocument:
    """What one DP rank runs at one position of the step's chunked documents under lockstep."""

    document: int | None
    """Its index in the plan's ``chunked`` (None: an all-pad document, the rank holds no k-th)."""
    chunks: int
    """The document's own chunks (0 for an all-pad one)."""
    pad_chunks: int
    """Pad chunks after them, so that chunks + pad_chunks is the position's pass count on every rank."""


def _counts(lengths: Sequence[int], groups: Sequence[int], dp: int,
            chunk_for: Callable[[int], int]) -> list[list[int]]:
    """Per DP rank: the chunk count of each document it runs, in the plan's order."""
    if len(lengths) != len(groups):
        raise ValueError(f"{len(lengths)} chunked lengths but {len(groups)} groups")
    out: list[list[int]] = [[] for _ in range(dp)]
    for n, g in zip(lengths, groups):
        if not 0 <= g < dp:
            raise ValueError(f"chunked document's group {g} is outside DP {dp}")
        c = chunk_for(n)
        if n < 0 or c <= 0:
            raise ValueError(f"chunked document of {n} tokens in chunks of {c}: both must be positive")
        out[g].append(-(-n // c))  # len(train/chunked.py chunk_bounds(n, c))
    return out


def lockstep_chunks(lengths: Sequence[int], groups: Sequence[int], dp: int,
                    chunk_for: Callable[[int], int]) -> list[int]:
    """n_k for each position k: the most chunks any DP rank's k-th document takes (``lengths``,
    ``groups``: the plan's ``chunked`` and ``chunked_group``; ``chunk_for``: each length's chunk,
    ``SchedulerJob.chunk_for``). As many positions as the most documents one rank holds."""
    return _passes(_counts(lengths, groups, dp, chunk_for))


def _passes(per_rank: list[list[int]]) -> list[int]:
    """n_k from each rank's chunk counts (``_counts``)."""
    width = max(map(len, per_rank), default=0)
    return [max(c[k] for c in per_rank if len(c) > k) for k in range(width)]


def lockstep_pads(lengths: Sequence[int], groups: Sequence[int], dp: int,
                  chunk_for: Callable[[int], int]) -> list[int]:
    """Per DP rank: the pad chunks it runs in all (``lockstep_documents``' ``pad_chunks`` summed),
    every rank's passes, the n_k summed, less its own chunks: what the plan prices."""
    per_rank = _counts(lengths, groups, dp, chunk_for)
    total = sum(_passes(per_rank))
    return [total - sum(c) for c in per_rank]


def lockstep_documents(lengths: Sequence[int], groups: Sequence[int], dp: int, dp_rank: int,
                       chunk_for: Callable[[int], int]) -> list[PaddedDocument]:
    """What DP rank ``dp_rank`` runs at each position (``lockstep_chunks``): its own k-th
    document padded to n_k passes, or an all-pad document of n_k."""
    if not 0 <= dp_rank < dp:
        raise ValueError(f"dp_rank must be in [0, {dp}), got {dp_rank}")
    per_rank = _counts(lengths, groups, dp, chunk_for)
    counts = per_rank[dp_rank]
    mine = [k for k, g in enumerate(groups) if g == dp_rank]
    out = []
    for k, n in enumerate(_passes(per_rank)):
        if k < len(mine):
            out.append(PaddedDocument(mine[k], counts[k], n - counts[k]))
        else:
            out.append(PaddedDocument(None, 0, n))
    return out
