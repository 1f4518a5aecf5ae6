"""One rank's token buffer for one micro-batch, in the agreed layout.

    buffer = [local sequences of this rank, whole, in .seqs order]
           + [for each sharded sequence whose rank set holds it, in .seqs order: its zigzag shard]

(docs/design/buffer_layout.md, attention/rank_sets.py). A sequence sharded
over k ranks is padded to Lp, a multiple of 2k, with id 0, label
IGNORE_INDEX and positions continuing
L, L+1, ...; positions restart at 0 per sequence, so RoPE and the masks see
true positions. A rank that would hold nothing (every sequence local
elsewhere, or a DP rank with fewer micro-batches than the slowest one) gets
one ignored pad token instead: every rank then runs the same number of
forward/backward passes (FSDP's collectives need that) and the pad token
adds nothing to loss or gradients.

Under tensor parallelism a buffer is padded to a multiple of the TP degree
(``pad_to_multiple``): sequence parallelism shards its tokens over the TP
ranks between blocks, and a compiled block whose input is an uneven shard
failed in backward (torch 2.13, gloo, the debug job at TP 2: a RecursionError
in step 2, after dynamo recompiled for an AsyncCollectiveTensor input with
the uneven split's size guard); with even shards the compiled run trains the
eager run's losses. The pad is one more local sequence of ignored tokens
after the local ones, so the layout above holds.
"""

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from skrull_ext.attention.meta import DacpBatchMeta, padded_length
from skrull_ext.attention.rank_sets import build_set_meta, shard_set_buffer
from skrull_ext.data.sources.synthetic import IGNORE_INDEX, Sample


@dataclass
class MicroBatchBuffer:
    """What one (DP rank, CP rank) feeds the model for one micro-batch."""

    input: torch.Tensor  # int64 [1, T]
    labels: torch.Tensor  # int64 [1, T]
    positions: torch.Tensor  # int64 [1, T]
    meta: DacpBatchMeta
    seqs: list[int]
    """Global indices of the micro-batch's sequences (all CP ranks), buffer order."""
    cu_seqlens: torch.Tensor | None = None
    """Staged (``staged``): the local part's int32 sequence starts, pinned, when every
    sequence of the micro-batch is local on this rank (what a traced varlen call takes)."""

    def staged(self) -> "MicroBatchBuffer":
        """This buffer in pinned host memory, with the all-local varlen starts built:
        the trainer's copies to the GPU are then asynchronous. A copy from pageable
        memory waits for the GPU's queue first, so the next micro-batch's kernels
        could not be launched while the last one computes. Built on the prefetch
        thread, off the training loop (data/steps/loader.py), with the meta's segment
        plans on the host (the varlen, segments and tiles kernels' Python, which the first
        layer's call would otherwise run: only their copy to the device is left to it)."""
        cu = None
        if self.meta.local_lens:  # the segment plans' host work done here, not at the first layer (meta.memo)
            local = self.meta.local_plan(None)
            if not self.meta.dist_lens:
                cu = local.cu_seq_q.pin_memory()
        if self.meta.num_held:
            self.meta.dist_plan(None)
        return MicroBatchBuffer(self.input.pin_memory(), self.labels.pin_memory(), self.positions.pin_memory(),
                                meta=self.meta, seqs=self.seqs, cu_seqlens=cu)

    @property
    def num_tokens(self) -> int:
        return self.input.size(1)

    @property
    def valid_labels(self) -> int:
        return int((self.labels != IGNORE_INDEX).sum())


def _pad(t: torch.Tensor, n: int, value: int) -> torch.Tensor:
    return torch.cat([t, t.new_full((n - t.numel(),), value)]) if n > t.numel() else t


def set_buffer(
    samples: Sequence[Sample],
    lengths: Sequence[int],
    first_rank: Sequence[int],
    num_ranks: Sequence[int],
    rank: int,
    world: int,
    group: bool = False,
    seqs: Sequence[int] = (),
    cp_coords: tuple[int, int] | None = None,
) -> MicroBatchBuffer:
    """Rank ``rank``'s buffer of one micro-batch.

    Args:
        samples: the micro-batch's samples in buffer (``.seqs``) order.
        lengths: effective lengths (a truncated sample is cut to its length).
        first_rank, num_ranks: each sample's rank set, ranks of [0, world).
        group: [0, world) is this rank's CP group and every sharded set is all of
            it (rank_sets.build_set_meta): the exchange takes the group's transport.
        seqs: the samples' global indices, kept on the buffer.
        cp_coords: (CP rank, CP size) of this rank, for the pad buffer it gets when it
            holds nothing of the micro-batch; default (rank, world), right when ``group``.
    """
    if not samples:
        raise ValueError("a micro-batch needs at least one sequence")
    inputs, labels, positions = [], [], []
    for s, n, k in zip(samples, lengths, num_ranks, strict=True):
        lp = padded_length(n, k) if k > 1 else n
        inputs.append(_pad(s.input[:n], lp, 0))
        labels.append(_pad(s.labels[:n], lp, IGNORE_INDEX))
        positions.append(torch.arange(lp))
    parts = [shard_set_buffer(x, first_rank, num_ranks, rank, world) for x in (inputs, labels, positions)]
    meta = build_set_meta(lengths, first_rank, num_ranks, rank, world, group=group)
    if meta.num_tokens == 0:
        return pad_buffer(*(cp_coords or (rank, world)), seqs)
    return MicroBatchBuffer(*(t.unsqueeze(0) for t in parts), meta=meta, seqs=list(seqs))


def pad_buffer(cp_rank: int, cp_size: int, seqs: Sequence[int] = ()) -> MicroBatchBuffer:
    """One ignored pad token, local: a no-op micro-batch for this rank."""
    one = torch.zeros(1, 1, dtype=torch.long)
    return MicroBatchBuffer(
        input=one,
        labels=torch.full_like(one, IGNORE_INDEX),
        positions=one.clone(),
        meta=DacpBatchMeta(cp_rank=cp_rank, cp_size=cp_size, local_lens=[1], dist_lens=[]),
        seqs=list(seqs),
    )


def pad_to_multiple(buf: MicroBatchBuffer, multiple: int) -> MicroBatchBuffer:
    """``buf`` with ignored pad tokens (id 0, positions from 0) after its local sequences, as one
    more local sequence, up to a multiple of ``multiple`` tokens (module docstring); ``buf`` itself
    when it is one already or ``multiple`` <= 1."""
    extra = -buf.num_tokens % multiple if multiple > 1 else 0
    if not extra:
        return buf
    at = sum(buf.meta.local_lens)

    def insert(t: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        return torch.cat([t[:, :at], pad[None].to(t.dtype), t[:, at:]], dim=1)

    pad_labels = torch.full((extra,), IGNORE_INDEX)
    return MicroBatchBuffer(insert(buf.input, torch.zeros(extra)), insert(buf.labels, pad_labels),
                            insert(buf.positions, torch.arange(extra)),
                            meta=replace(buf.meta, local_lens=[*buf.meta.local_lens, extra]), seqs=buf.seqs)
