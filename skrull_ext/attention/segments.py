# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""Document-causal attention as a varlen problem: the segment plan.

A dense document-causal mask (meta.document_causal_mask) is block-sparse: a
query attends only the earlier tokens of its own document. Varlen kernels
(flash attention's ``varlen_attn``) take that structure directly as a list of
segments, each a contiguous query range attending a contiguous key range
with *bottom-right aligned* causal masking: the last query sees every key of
its range, the one before it all but the last key, and so on.

The plan is derived from the same (document, true position) per token that
the dense masks are built from, so there is no second copy of the mask logic:

- a segment is a maximal run of queries of one document at consecutive true
  positions p0..P (a local sequence is one run; a zigzag shard of a
  distributed sequence is two runs, chunk r and chunk 2N-1-r, or one when
  they are adjacent);
- its keys are that document's positions 0..P in position order, picked out
  of the key source (the gathered K/V, rank-major) by ``key_index``; they are
  copied once per segment, so a key that two query chunks need appears twice
  in the packed keys;
- bottom-right alignment then lets query p0 + a see keys 0..p0 + a, which is
  exactly ``k_pos <= q_pos`` within the document: the dense mask's result.

Padding of a distributed sequence needs nothing special, as in the dense
mask: pad tokens sit at true positions after every real one, so a real query
never reaches a pad key, and a pad query (whose output gradient is zero)
sends exactly zero gradient anywhere.

Built once per micro-batch and cached on the meta (every layer shares it).
"""

import dataclasses
from dataclasses import dataclass

import torch

__all__ = ["SegmentPlan", "bottom_right_causal_mask", "build_segment_plan", "host_to_device"]


def host_to_device(t: torch.Tensor, device: torch.device | None) -> torch.Tensor:
    """``t``, built in host memory, on ``device`` (None: where it is) without the host waiting
    for the device.

    On CUDA a copy from pageable memory (``torch.tensor(..., device=)``, ``.to(device)``)
    synchronises with the stream (copy_'s cudaStreamSynchronize; with ``non_blocking`` the
    driver stages pageable memory synchronously), so the host could not queue the next layers'
    kernels while the device works: the copy goes through pinned memory, asynchronously (the
    caching host allocator keeps the pinned block until the copy has run). On CPU, ``t``."""
    if device is None:
        return t
    if torch.device(device).type == "cuda":
        t = t.pin_memory()
    return t.to(device, non_blocking=True)


@dataclass(frozen=True)
class SegmentPlan:
    """Segments of one attention part, in the shapes varlen kernels take.

    Segment s has queries ``[cu_q[s], cu_q[s+1])`` of the part's query buffer
    and keys ``[cu_k[s], cu_k[s+1])`` of the *packed* keys, which are
    ``keys.index_select(token_dim, key_index)`` (or the key source itself when
    ``key_index`` is None: local sequences attend their own range).
    """

    cu_seq_q: torch.Tensor
    """int32 [S+1] on the device, cumulative query counts."""
    cu_seq_k: torch.Tensor
    """int32 [S+1] on the device, cumulative packed-key counts."""
    max_q: int
    max_k: int
    key_index: torch.Tensor | None
    """int64 [cu_k[-1]] on the device: key-source token of each packed key; None = identity."""
    cu_q: tuple[int, ...]
    """Host copy of cu_seq_q (loops over segments need no device sync)."""
    cu_k: tuple[int, ...]
    """Host copy of cu_seq_k."""

    @property
    def num_segments(self) -> int:
        return len(self.cu_q) - 1

    def to(self, device: torch.device | None) -> "SegmentPlan":
        """This plan with its tensors on ``device`` (``host_to_device``: no wait for the device),
        the host copies and sizes as they are."""
        if device is None or torch.device(device).type == "cpu":
            return self
        return dataclasses.replace(
            self, cu_seq_q=host_to_device(self.cu_seq_q, device), cu_seq_k=host_to_device(self.cu_seq_k, device),
            key_index=None if self.key_index is None else host_to_device(self.key_index, device))

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        """Device tensors a kernel reads (for record_stream on a side stream)."""
        ts = (self.cu_seq_q, self.cu_seq_k)
        return ts if self.key_index is None else (*ts, self.key_index)


def bottom_right_causal_mask(nq: int, nk: int, device: torch.device | None = None) -> torch.Tensor:
    """[nq, nk] bool: query i sees keys 0..nk-nq+i (the last query sees all nk keys),
    flash attention's causal convention when nq < nk."""
    return torch.ones(nq, nk, dtype=torch.bool, device=device).tril(nk - nq)


def build_segment_plan(
    q_doc: torch.Tensor,
    q_pos: torch.Tensor,
    k_doc: torch.Tensor,
    k_pos: torch.Tensor,
    device: torch.device | None = None,
) -> SegmentPlan:
    """Plan of queries (q_doc, q_pos) over a key source (k_doc, k_pos).

    Args:
        q_doc, q_pos: document index and true position of each query, in buffer order.
        k_doc, k_pos: the same for each token of the key source (the K/V the kernel
            receives). Every document must hold each position 0..n-1 exactly once.
        device: where the plan's tensors live (the attention's device).

    Returns the plan whose bottom-right causal segments give
    ``document_causal_mask(q_doc, q_pos, k_doc, k_pos)``'s attention.
    """
    q_doc, q_pos, k_doc, k_pos = (t.detach().to("cpu", torch.long) for t in (q_doc, q_pos, k_doc, k_pos))
    nq = q_doc.numel()

    # Query runs: a new segment where the document changes or the position does not step by one.
    brk = torch.ones(nq, dtype=torch.bool)
    if nq > 1:
        brk[1:] = (q_doc[1:] != q_doc[:-1]) | (q_pos[1:] != q_pos[:-1] + 1)
    starts = brk.nonzero().flatten().tolist()
    ends = starts[1:] + [nq]

    # Key source sorted by (document, position): document d's keys in position order.
    span = int(k_pos.max()) + 1 if k_pos.numel() else 1
    order = torch.argsort(k_doc * span + k_pos, stable=True)
    sorted_doc, sorted_pos = k_doc[order], k_pos[order]
    n_docs = int(max(k_doc.max() if k_doc.numel() else -1, q_doc.max() if nq else -1)) + 1
    counts = torch.bincount(sorted_doc, minlength=n_docs) if k_doc.numel() else torch.zeros(n_docs, dtype=torch.long)
    doc_start = torch.cumsum(counts, 0) - counts
    expected = torch.arange(sorted_pos.numel()) - doc_start[sorted_doc]
    if not torch.equal(sorted_pos, expected):
        raise ValueError("the key source must hold positions 0..n-1 of every document exactly once")

    pieces, cu_q, cu_k = [], [0], [0]
    for a, b in zip(starts, ends):
        d, last = int(q_doc[a]), int(q_pos[b - 1])
        if last >= counts[d]:
            raise ValueError(f"document {d}: query position {last} has no key at that position")
        s = int(doc_start[d])
        pieces.append(order[s : s + last + 1])
        cu_q.append(cu_q[-1] + b - a)
        cu_k.append(cu_k[-1] + last + 1)

    key_index = torch.cat(pieces) if pieces else torch.empty(0, dtype=torch.long)
    identity = key_index.numel() == k_doc.numel() and torch.equal(key_index, torch.arange(k_doc.numel()))
    sizes_q = [b - a for a, b in zip(cu_q, cu_q[1:])]
    sizes_k = [b - a for a, b in zip(cu_k, cu_k[1:])]
    return SegmentPlan(
        cu_seq_q=torch.tensor(cu_q, dtype=torch.int32),
        cu_seq_k=torch.tensor(cu_k, dtype=torch.int32),
        max_q=max(sizes_q, default=0),
        max_k=max(sizes_k, default=0),
        key_index=None if identity else key_index,
        cu_q=tuple(cu_q),
        cu_k=tuple(cu_k),
    ).to(device)
