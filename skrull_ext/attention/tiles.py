# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""The segment plan cut into query tiles: document-causal attention on CPU.

SDPA on CPU takes a mask but does not skip what it masks out: a dense
document-causal mask over a 256-token buffer costs the full 256 x 256
whatever the documents (docs/benchmarks.md, section 8), and ``is_causal``
saves nothing below its 512-key block. One SDPA per segment (segments.py)
computes only what the documents need, but pays SDPA's fixed cost per call
(about 0.2 ms forward and backward on the debug model's heads, the price of
~2,300 masked query-key pairs), which loses on many tiny documents.

A tile is one SDPA of at most ``rows`` queries with its own small mask. The
plan's segments (bottom-right causal: query p0 + a sees keys 0..p0 + a of its
document, keys packed by the plan's ``key_index``) are

1. cut into pieces of at most ``rows`` queries, the remainder first: piece j
   of a segment with nq queries and nk keys takes its queries and the keys
   0..(nk - nq + its last query), still bottom-right causal, so a long
   segment no longer pays for the keys its early queries cannot see;
2. packed in order: a piece joins the tile before it while the tile holds at
   most ``rows`` queries and the piece's keys start at or after the tile's
   end, so a tile's mask is block-diagonal (each piece's causal block where
   its keys sit; the gaps between are masked).

The result is the same attention as the dense mask (a row's softmax runs
over the same unmasked keys), computed in tiles of rows x (keys they can
see). Built once per micro-batch from the plan and cached on the meta.
"""

from dataclasses import dataclass

import torch

from skrull_ext.attention.segments import bottom_right_causal_mask, host_to_device, SegmentPlan

__all__ = ["TILE_ROWS", "TilePlan", "build_tile_plan"]

TILE_ROWS = 64
"""Queries per tile: about where SDPA's fixed cost a call (~2,300 query-key
pairs at the debug model's 16 heads of 16, on this project's 2-core CPU)
meets the masked work a wider tile wastes. Chosen in an ad-hoc sweep of 32-96
that no command here repeats; the timings at 64 are docs/benchmarks.md,
section 8."""


@dataclass(frozen=True)
class TilePlan:
    """Tiles of one attention part: tile t is queries ``[qa, qb)`` of the part's
    query buffer over packed keys ``[ka, kb)`` with ``masks[t]``, packed keys being
    ``keys.index_select(token_dim, key_index)`` (the key source itself when None)."""

    bounds: tuple[tuple[int, int, int, int], ...]
    """(qa, qb, ka, kb) per tile; the tiles cover the queries in order."""
    masks: tuple[torch.Tensor, ...]
    """[qb - qa, kb - ka] bool per tile, on the device."""
    key_index: torch.Tensor | None
    """The segment plan's key_index (int64 on the device, or None: identity)."""

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        """Device tensors a kernel reads (for record_stream on a side stream)."""
        return self.masks if self.key_index is None else (*self.masks, self.key_index)


def _pieces(plan: SegmentPlan, rows: int) -> list[tuple[int, int, int, int]]:
    """Each segment cut into bottom-right causal pieces of at most ``rows`` queries."""
    out = []
    for s in range(plan.num_segments):
        qa, qb, ka, kb = plan.cu_q[s], plan.cu_q[s + 1], plan.cu_k[s], plan.cu_k[s + 1]
        nq, first = qb - qa, kb - ka - (qb - qa)  # keys every query of the segment sees
        a = 0
        for size in [nq % rows or rows] + [rows] * ((nq - 1) // rows):
            out.append((qa + a, qa + a + size, ka, ka + first + a + size))
            a += size
    return out


def build_tile_plan(plan: SegmentPlan, rows: int = TILE_ROWS, device: torch.device | None = None) -> TilePlan:
    """The tiles of ``plan`` (see the module docstring), masks on ``device``."""
    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    groups: list[list[tuple[int, int, int, int]]] = []
    for p in _pieces(plan, rows):
        last = groups[-1] if groups else None
        if last and p[0] == last[-1][1] and p[2] >= last[-1][3] and p[1] - last[0][0] <= rows:
            last.append(p)
        else:
            groups.append([p])
    bounds, masks = [], []
    for g in groups:
        qa, ka, qb, kb = g[0][0], g[0][2], g[-1][1], g[-1][3]
        mask = torch.zeros(qb - qa, kb - ka, dtype=torch.bool)
        for pa, pb, pka, pkb in g:
            mask[pa - qa : pb - qa, pka - ka : pkb - ka] = bottom_right_causal_mask(pb - pa, pkb - pka)
        bounds.append((qa, qb, ka, kb))
        masks.append(host_to_device(mask, device))
    return TilePlan(bounds=tuple(bounds), masks=tuple(masks), key_index=plan.key_index)
