# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""What one CP rank holds for one DACP micro-batch, and the zigzag layout.

The layout is the contract in docs/design/buffer_layout.md:

    buffer = [local sequences of this rank, whole]
           + [for each distributed sequence: its zigzag shard]

A distributed sequence of true length L is padded to Lp, a multiple of 2N
(N = CP size), cut into 2N chunks of c = Lp / (2N) tokens, and rank r holds
chunk r followed by chunk 2N-1-r. Pairing an early chunk with a late one gives
every rank the same causal-attention work. With N == 1 nothing is padded or
cut: a "distributed" sequence is simply a whole sequence.

Under policy ``skrull-pool`` a distributed sequence is sharded over its own
*rank set* (``DacpBatchMeta.dist_sets``: first rank and count k, ranks of the
world) instead of the whole CP group; it is then padded to a multiple of 2k
and zigzag-cut over those k ranks, and a rank's buffer holds the shards of the
sequences whose set contains it (rank_sets.py builds such buffers). The
CP-group layout above is the case where every set is the whole group.

Everything here is plain data and index arithmetic; the masks that the
attention needs are derived from (document id, true position) per token, so
that padding and zigzag order never have to be special-cased downstream.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._opaque_base import OpaqueBase

from skrull_ext.attention.segments import build_segment_plan, SegmentPlan

__all__ = [
    "DISTRIBUTED",
    "DacpBatchMeta",
    "build_meta",
    "document_causal_mask",
    "padded_length",
    "shard_buffer",
    "unshard_buffer",
    "zigzag_positions",
    "zigzag_shard",
    "zigzag_unshard",
]

DISTRIBUTED = -1
"""Placement value of a sequence sharded over the whole CP group (as in the plan)."""


def padded_length(length: int, cp_size: int) -> int:
    """Lp: ``length`` rounded up to a multiple of 2 * cp_size (unchanged for cp_size 1)."""
    if length < 1:
        raise ValueError(f"length must be >= 1, got {length}")
    if cp_size < 1:
        raise ValueError(f"cp_size must be >= 1, got {cp_size}")
    if cp_size == 1:
        return length
    m = 2 * cp_size
    return -(-length // m) * m


def _chunk_starts(padded_len: int, cp_rank: int, cp_size: int) -> tuple[int, int, int]:
    """(start of chunk r, start of chunk 2N-1-r, chunk size c) in the padded sequence."""
    c = padded_len // (2 * cp_size)
    return cp_rank * c, (2 * cp_size - 1 - cp_rank) * c, c


def zigzag_positions(
    padded_len: int, cp_rank: int, cp_size: int, device: torch.device | None = None
) -> torch.Tensor:
    """True positions (int64) of the tokens of rank ``cp_rank``'s shard."""
    if cp_size == 1:
        return torch.arange(padded_len, device=device)
    a, b, c = _chunk_starts(padded_len, cp_rank, cp_size)
    return torch.cat(
        [torch.arange(a, a + c, device=device), torch.arange(b, b + c, device=device)]
    )


def zigzag_shard(x: torch.Tensor, cp_rank: int, cp_size: int, dim: int = 0) -> torch.Tensor:
    """Rank ``cp_rank``'s shard of an already padded sequence ``x`` (tokens on ``dim``)."""
    n = x.size(dim)
    if cp_size == 1:
        return x
    if n % (2 * cp_size):
        raise ValueError(f"sequence length {n} is not a multiple of 2*cp_size={2 * cp_size}")
    a, b, c = _chunk_starts(n, cp_rank, cp_size)
    return torch.cat([x.narrow(dim, a, c), x.narrow(dim, b, c)], dim=dim)


def pad_and_shard(x: torch.Tensor, cp_rank: int, cp_size: int, dim: int = 0, pad_value=0) -> torch.Tensor:
    """Rank ``cp_rank``'s zigzag shard of one sequence, padded with ``pad_value``
    to :func:`padded_length` first."""
    n = x.size(dim)
    lp = padded_length(n, cp_size)
    if lp > n:
        shape = list(x.shape)
        shape[dim] = lp - n
        x = torch.cat([x, x.new_full(shape, pad_value)], dim=dim)
    return zigzag_shard(x, cp_rank, cp_size, dim)


def zigzag_unshard(shards: Sequence[torch.Tensor], dim: int = 0) -> torch.Tensor:
    """Inverse of :func:`zigzag_shard`: ``shards[r]`` is rank r's shard; returns the padded sequence."""
    cp_size = len(shards)
    if cp_size == 1:
        return shards[0]
    c = shards[0].size(dim) // 2
    chunks: list[torch.Tensor | None] = [None] * (2 * cp_size)
    for r, s in enumerate(shards):
        chunks[r] = s.narrow(dim, 0, c)
        chunks[2 * cp_size - 1 - r] = s.narrow(dim, c, c)
    return torch.cat(chunks, dim=dim)  # pyrefly: ignore[bad-argument-type]


def document_causal_mask(
    q_doc: torch.Tensor, q_pos: torch.Tensor, k_doc: torch.Tensor, k_pos: torch.Tensor
) -> torch.Tensor:
    """Dense bool mask [Tq, Tk]: True where query i may attend key j.

    A query attends a key of the same document at the same or an earlier true
    position. Working from true positions (not buffer indices) is what makes
    the zigzag order and the end-of-sequence padding need no special case:
    pad tokens sit after every real token, so no real query ever sees one.
    """
    same_doc = q_doc[:, None] == k_doc[None, :]
    return same_doc & (k_pos[None, :] <= q_pos[:, None])


@dataclass(frozen=True)
class DacpBatchMeta(OpaqueBase):
    """One rank's view of one DACP micro-batch (see docs/design/buffer_layout.md).

    ``cp_rank`` and ``cp_size`` are this rank and the size of the group the
    K/V are exchanged over: the CP group under skrull, the world under
    skrull-pool (then ``dist_sets`` names each sequence's ranks).

    ``dist_lens`` holds the *padded* lengths Lp and is identical on every
    rank of the group; ``local_lens`` is this rank's own. Masks and segment
    plans (segments.py) are built on first use per device and cached here,
    because every attention layer of the micro-batch shares them.

    Under torch.compile it is an opaque object of the DACP custom op
    (compiled.py: hence ``OpaqueBase``), which keeps each layer's autograd
    tape here until that layer's backward.
    """

    cp_rank: int
    cp_size: int
    local_lens: list[int]
    """Lengths of this rank's whole (local) sequences, in buffer order."""
    dist_lens: list[int]
    """Padded lengths Lp of the distributed sequences, in buffer order (same on every rank);
    with ``dist_sets``, those of the whole micro-batch, including ones this rank holds no part of."""
    dist_sets: list[tuple[int, int]] | None = None
    """Per distributed sequence: (first rank, k) of its rank set [first, first + k), ranks of
    the group (skrull-pool: world ranks; Lp a multiple of 2k). None: every one is sharded over
    the whole group [0, cp_size) (skrull); the exchange then takes the group's transport."""
    _masks: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.cp_size < 1:
            raise ValueError(f"cp_size must be >= 1, got {self.cp_size}")
        if not 0 <= self.cp_rank < self.cp_size:
            raise ValueError(f"cp_rank must be in [0, {self.cp_size}), got {self.cp_rank}")
        if any(n < 1 for n in self.local_lens):
            raise ValueError(f"local_lens must be positive, got {self.local_lens}")
        if any(n < 1 for n in self.dist_lens):
            raise ValueError(f"dist_lens must be positive, got {self.dist_lens}")
        if self.dist_sets is not None:
            if len(self.dist_sets) != len(self.dist_lens):
                raise ValueError(f"dist_sets has {len(self.dist_sets)} entries for {len(self.dist_lens)} dist_lens")
            for n, (a, k) in zip(self.dist_lens, self.dist_sets):
                if not (k >= 2 and 0 <= a and a + k <= self.cp_size):
                    raise ValueError(f"rank set [{a}, {a + k}) must hold 2 or more ranks of [0, {self.cp_size})")
                if n % (2 * k):
                    raise ValueError(f"dist length {n} over {k} ranks must be a multiple of {2 * k}")
        elif self.cp_size > 1 and any(n % (2 * self.cp_size) for n in self.dist_lens):
            raise ValueError(
                f"dist_lens must be padded to multiples of 2*cp_size={2 * self.cp_size}, "
                f"got {self.dist_lens}"
            )

    @property
    def sets(self) -> list[tuple[int, int]]:
        """(first rank, k) of each distributed sequence's rank set (the whole group without dist_sets)."""
        if self.dist_sets is not None:
            return [tuple(s) for s in self.dist_sets]
        return [(0, self.cp_size)] * len(self.dist_lens)

    def held(self, rank: int | None = None) -> list[int]:
        """Indices into dist_lens of the sequences ``rank`` (default this rank) holds a shard of."""
        rank = self.cp_rank if rank is None else rank
        return [i for i, (a, k) in enumerate(self.sets) if a <= rank < a + k]

    @property
    def peers(self) -> list[int]:
        """Ranks (this one included) sharing a distributed sequence with this rank, ascending:
        whose shards the exchange gathers, in that order."""
        sets = self.sets
        return sorted({r for i in self.held() for r in range(sets[i][0], sets[i][0] + sets[i][1])})

    def shared_with(self, peer: int) -> list[int]:
        """Indices into dist_lens of the sequences held by both this rank and ``peer``."""
        return [i for i in self.held() if i in self.held(peer)]

    @property
    def num_local_tokens(self) -> int:
        """Tokens of the local part; the distributed part starts at this offset (once per
        micro-batch: every layer's call reads it)."""
        return self.memo(("num_local_tokens",), lambda: sum(self.local_lens))

    @property
    def shard_lens(self) -> list[int]:
        """Tokens this rank holds of each distributed sequence it holds (2c = Lp / k)."""
        sets = self.sets
        return [self.dist_lens[i] // sets[i][1] for i in self.held()]

    @property
    def num_dist_tokens(self) -> int:
        """Tokens of the distributed part on this rank (without dist_sets, the same on every rank)."""
        return self.memo(("num_dist_tokens",), lambda: sum(self.shard_lens))

    @property
    def num_held(self) -> int:
        """How many distributed sequences this rank holds a shard of (``len(held())``, once)."""
        return self.memo(("num_held",), lambda: len(self.held()))

    @property
    def num_tokens(self) -> int:
        """Length of this rank's buffer."""
        return self.num_local_tokens + self.num_dist_tokens

    @property
    def local_offsets(self) -> list[int]:
        """Buffer offset of each local sequence, plus the end (cu_seqlens style)."""
        return _cumsum(self.local_lens, 0)

    @property
    def dist_offsets(self) -> list[int]:
        """Buffer offset of each distributed shard, plus the end (cu_seqlens style)."""
        return _cumsum(self.shard_lens, self.num_local_tokens)

    def local_doc_positions(
        self, device: torch.device | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(document index, true position) of each local token."""
        return _doc_positions(self.local_lens, device)

    def dist_doc_positions(
        self, cp_rank: int, device: torch.device | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(distributed-sequence index, true position) of each token of rank ``cp_rank``'s
        distributed part; without dist_sets, concatenated over ranks this describes the
        gathered K/V."""
        return self._shard_doc_positions(cp_rank, self.held(cp_rank), device)

    def _shard_doc_positions(
        self, rank: int, seqs: Sequence[int], device: torch.device | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        sets, docs, pos = self.sets, [], []
        for i in seqs:
            a, k = sets[i]
            p = zigzag_positions(self.dist_lens[i], rank - a, k, device)
            pos.append(p)
            docs.append(torch.full_like(p, i))
        return _cat_or_empty(docs, device), _cat_or_empty(pos, device)

    def memo(self, key: tuple, build: Callable[[], Any]) -> Any:
        """``build()``, once per micro-batch under ``key``: the masks and plans below, and
        what a kernel derives from them (kernels.py), shared by every layer."""
        if key not in self._masks:
            self._masks[key] = build()
        return self._masks[key]

    def local_mask(self, device: torch.device | None = None) -> torch.Tensor:
        """[Tl, Tl] document-causal mask of the local part."""
        def build() -> torch.Tensor:
            d, p = self.local_doc_positions(device)
            return document_causal_mask(d, p, d, p)

        return self.memo(("local", torch.device(device or "cpu")), build)

    def dist_mask(self, device: torch.device | None = None) -> torch.Tensor:
        """[Td, N*Td] mask of this rank's distributed queries over the gathered K/V.

        The gathered K/V is rank-major: rank 0's distributed part, then rank 1's, ...
        """
        def build() -> torch.Tensor:
            qd, qp = self.dist_doc_positions(self.cp_rank, device)
            kd, kp = self.gathered_doc_positions(device)
            return document_causal_mask(qd, qp, kd, kp)

        return self.memo(("dist", torch.device(device or "cpu")), build)

    def gathered_doc_positions(
        self, device: torch.device | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(distributed-sequence index, true position) of each token of the gathered
        K/V: every rank's distributed part, rank-major. With dist_sets: for each of
        ``peers`` in order, its tokens of the sequences it shares with this rank."""
        if self.dist_sets is None:
            ks = [self.dist_doc_positions(r, device) for r in range(self.cp_size)]
        else:
            ks = [self._shard_doc_positions(r, self.shared_with(r), device) for r in self.peers]
        return _cat_or_empty([d for d, _ in ks], device), _cat_or_empty([p for _, p in ks], device)

    def local_plan(self, device: torch.device | None = None) -> SegmentPlan:
        """Varlen segments of the local part: one causal segment per local sequence."""
        def build() -> SegmentPlan:
            d, p = self.local_doc_positions()
            return build_segment_plan(d, p, d, p)

        return self._plan_on("local_plan", build, device)

    def dist_plan(self, device: torch.device | None = None) -> SegmentPlan:
        """Varlen segments of this rank's distributed queries over the gathered K/V:
        one per query chunk (two per sequence, one if the chunks are adjacent),
        keys picked out of the rank-major gathered K/V by the plan's key_index."""
        def build() -> SegmentPlan:
            qd, qp = self.dist_doc_positions(self.cp_rank)
            kd, kp = self.gathered_doc_positions()
            return build_segment_plan(qd, qp, kd, kp)

        return self._plan_on("dist_plan", build, device)

    def _plan_on(self, name: str, build: Callable[[], SegmentPlan], device: torch.device | None) -> SegmentPlan:
        """The plan built once on the host (where the dataloader's prefetch thread builds it ahead:
        MicroBatchBuffer.staged), and once per other device as its copy there (SegmentPlan.to)."""
        host = self.memo((name, torch.device("cpu")), build)
        dev = torch.device(device or "cpu")
        return host if dev.type == "cpu" else self.memo((name, dev), lambda: host.to(dev))


def _cumsum(lens: Sequence[int], start: int) -> list[int]:
    out = [start]
    for n in lens:
        out.append(out[-1] + n)
    return out


def _cat_or_empty(ts: list[torch.Tensor], device: torch.device | None) -> torch.Tensor:
    return torch.cat(ts) if ts else torch.empty(0, dtype=torch.long, device=device)


def _doc_positions(
    lens: Sequence[int], device: torch.device | None
) -> tuple[torch.Tensor, torch.Tensor]:
    docs, pos = [], []
    for i, n in enumerate(lens):
        pos.append(torch.arange(n, device=device))
        docs.append(torch.full((n,), i, dtype=torch.long, device=device))
    return _cat_or_empty(docs, device), _cat_or_empty(pos, device)


def build_meta(
    lengths: Sequence[int], placement: Sequence[int], cp_rank: int, cp_size: int
) -> DacpBatchMeta:
    """Meta of rank ``cp_rank`` from a micro-batch's sequences in buffer (``.seqs``) order.

    Args:
        lengths: true length of each sequence of the micro-batch.
        placement: per sequence, the CP rank holding it whole, or ``DISTRIBUTED``.
    """
    if len(lengths) != len(placement):
        raise ValueError(f"lengths ({len(lengths)}) and placement ({len(placement)}) differ")
    bad = [p for p in placement if p != DISTRIBUTED and not 0 <= p < cp_size]
    if bad:
        raise ValueError(f"placement values must be DISTRIBUTED or in [0, {cp_size}), got {bad}")
    return DacpBatchMeta(
        cp_rank=cp_rank,
        cp_size=cp_size,
        local_lens=[n for n, p in zip(lengths, placement) if p == cp_rank],
        dist_lens=[padded_length(n, cp_size) for n, p in zip(lengths, placement) if p == DISTRIBUTED],
    )


def shard_buffer(
    seqs: Sequence[torch.Tensor],
    placement: Sequence[int],
    cp_rank: int,
    cp_size: int,
    dim: int = 0,
    pad_value: float = 0,
) -> torch.Tensor:
    """Rank ``cp_rank``'s buffer from a micro-batch's whole sequences (tokens on ``dim``).

    Distributed sequences shorter than Lp are padded with ``pad_value``; pass
    them already padded to control the pad content (positions, labels).
    """
    if len(seqs) != len(placement):
        raise ValueError(f"seqs ({len(seqs)}) and placement ({len(placement)}) differ")
    local = [s for s, p in zip(seqs, placement) if p == cp_rank]
    dist = []
    for s, p in zip(seqs, placement):
        if p != DISTRIBUTED:
            continue
        dist.append(pad_and_shard(s, cp_rank, cp_size, dim, pad_value))
    if not seqs:
        raise ValueError("a micro-batch needs at least one sequence")
    parts = local + dist
    return torch.cat(parts, dim=dim) if parts else seqs[0].narrow(dim, 0, 0)


def unshard_buffer(
    buffers: Sequence[torch.Tensor],
    lengths: Sequence[int],
    placement: Sequence[int],
    dim: int = 0,
) -> list[torch.Tensor]:
    """Inverse of :func:`shard_buffer`: ``buffers[r]`` is rank r's buffer.

    Returns the micro-batch's sequences in buffer order, cut to true length.
    """
    cp_size = len(buffers)
    metas = [build_meta(lengths, placement, r, cp_size) for r in range(cp_size)]
    local_next = [0] * cp_size  # index of the next local sequence per rank
    dist_next = 0
    out = []
    for n, p in zip(lengths, placement):
        if p != DISTRIBUTED:
            off = metas[p].local_offsets[local_next[p]]
            local_next[p] += 1
            out.append(buffers[p].narrow(dim, off, n))
            continue
        shards = [
            buffers[r].narrow(dim, metas[r].dist_offsets[dist_next], metas[r].shard_lens[dist_next])
            for r in range(cp_size)
        ]
        dist_next += 1
        out.append(zigzag_unshard(shards, dim).narrow(dim, 0, n))
    return out
