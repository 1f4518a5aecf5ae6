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

The rule lives in the core (cpp/include/skrull/chunked.hpp: lockstep_passes, lockstep_pads,
lockstep_pad_us, chunked_after), where the assignment, the step's time and the look-ahead's estimate
price each pad chunk as the chunk it is, ``CostModel.pad_chunks_us()`` (one token a CP rank after its
document's tokens: its queries over them, its K/V gathered at CP > 1, recomputed but at its
position's last pass), and a padded document's last chunk's recompute. This module reads it
for the trainer (train/passes.py: what each rank runs) and the plan (``Plan.chunked_pads``), from
the chunk counts ``chunk_passes`` gives: the trainer's.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from skrull_ext import _core

__all__ = ["PaddedDocument", "chunk_passes", "lockstep_chunks", "lockstep_documents", "lockstep_pads"]


@dataclass(frozen=True)
class PaddedDocument:
    """What one DP rank runs at one position of the step's chunked documents under lockstep."""

    document: int | None
    """Its index in the plan's ``chunked`` (None: an all-pad document, the rank holds no k-th)."""
    chunks: int
    """The document's own chunks (0 for an all-pad one)."""
    pad_chunks: int
    """Pad chunks after them, so that chunks + pad_chunks is the position's pass count on every rank."""


def chunk_passes(length: int, chunk: int) -> int:
    """The chunk passes a document of ``length`` tokens takes in chunks of ``chunk``
    (``len(train/chunked.py chunk_bounds(length, chunk))``): what the core pads to."""
    if length < 0 or chunk <= 0:
        raise ValueError(f"chunked document of {length} tokens in chunks of {chunk}: both must be positive")
    return -(-length // chunk)


def _counts(lengths: Sequence[int], groups: Sequence[int], chunk_for: Callable[[int], int]) -> list[int]:
    """Each document's chunk passes, in the plan's order."""
    if len(lengths) != len(groups):
        raise ValueError(f"{len(lengths)} chunked lengths but {len(groups)} groups")
    return [chunk_passes(n, chunk_for(n)) for n in lengths]


def lockstep_chunks(lengths: Sequence[int], groups: Sequence[int], dp: int,
                    chunk_for: Callable[[int], int]) -> list[int]:
    """n_k for each position k: the most chunks any DP rank's k-th document takes (``lengths``,
    ``groups``: the plan's ``chunked`` and ``chunked_group``; ``chunk_for``: each length's chunk,
    ``SchedulerJob.chunk_for``). As many positions as the most documents one rank holds."""
    return _core.lockstep_passes(_counts(lengths, groups, chunk_for), list(groups), dp)


def lockstep_pads(lengths: Sequence[int], groups: Sequence[int], dp: int,
                  chunk_for: Callable[[int], int]) -> list[int]:
    """Per DP rank: the pad chunks it runs in all (``lockstep_documents``' ``pad_chunks`` summed),
    every rank's passes, the n_k summed, less its own chunks: what the plan prices."""
    return _core.lockstep_pads(_counts(lengths, groups, chunk_for), list(groups), dp)


def lockstep_documents(lengths: Sequence[int], groups: Sequence[int], dp: int, dp_rank: int,
                       chunk_for: Callable[[int], int]) -> list[PaddedDocument]:
    """What DP rank ``dp_rank`` runs at each position (``lockstep_chunks``): its own k-th
    document padded to n_k passes, or an all-pad document of n_k."""
    if not 0 <= dp_rank < dp:
        raise ValueError(f"dp_rank must be in [0, {dp}), got {dp_rank}")
    counts = _counts(lengths, groups, chunk_for)
    mine = [k for k, g in enumerate(groups) if g == dp_rank]
    out = []
    for k, n in enumerate(_core.lockstep_passes(counts, list(groups), dp)):
        if k < len(mine):
            out.append(PaddedDocument(mine[k], counts[mine[k]], n - counts[mine[k]]))
        else:
            out.append(PaddedDocument(None, 0, n))
    return out
