# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""Training FLOPs from the documents a step really trained.

torchtitan's MFU prices every token's attention at ``training.seq_len``
(``6 * params + 12 * layers * heads * head_dim * seq_len`` a token): right
for one full-length document a row, wrong for variable lengths. A 500-token
chat is priced as if it attended over 32K tokens (the shipped GPU job logged
an MFU of 85-114%), and a batching that cuts documents at row boundaries
is priced the same as one that keeps them whole although it trains less
attention. Here a step is priced from its documents:

    linear    = 6 * P * tokens                    (every matmul weight, the head included)
    attention = 12 * layers * H_q * sum_d S_d (S_d + 1) / 2

``P`` is the number of matmul weights a token passes (the built model's
``nn.Linear`` weights: projections, MLP, output head; the embedding is a
lookup), ``H_q = n_heads * head_dim``, and ``S_d`` each document's length,
or each piece's for a batching that cuts documents (a piece attends only
within itself). Causal attention computes ``S (S + 1) / 2`` query-key pairs
a head, each 2 FLOPs in ``Q K^T`` and 2 in ``P V`` (4 forward), and the
backward twice the forward (12 in all, as ``6 * P`` for the linear layers).
Padding is not counted: useful FLOPs only. Activation recomputation is not
counted either (it is not useful work), as in torchtitan's figure.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from skrull_ext.scheduler.model_shape import q_width

__all__ = ["DocumentFlops", "DocumentMeter", "compiled_graphs", "linear_weights"]


def linear_weights(model_parts: Iterable[torch.nn.Module]) -> int:
    """Matmul weights a token passes: every ``nn.Linear`` weight's elements (a
    DTensor's whole tensor), the output head included; a tied head counted once,
    as the one matmul it is."""
    seen: set[int] = set()
    total = 0
    for part in model_parts:
        for m in part.modules():
            if isinstance(m, torch.nn.Linear) and id(m.weight) not in seen:
                seen.add(id(m.weight))
                total += m.weight.numel()
    return total


@dataclass(frozen=True)
class DocumentFlops:
    """A model's training FLOPs for a set of documents (module docstring)."""

    linear_weights: int
    layers: int
    attention_width: int
    """``n_heads * head_dim``: the query heads' width."""

    @classmethod
    def of_model(cls, model_config, model_parts: Iterable[torch.nn.Module]) -> "DocumentFlops":
        return cls(linear_weights(model_parts), len(model_config.layers),
                   q_width(model_config.first_attention, int(model_config.dim)))

    def linear(self, tokens: int) -> float:
        return 6.0 * self.linear_weights * tokens

    def attention(self, lengths: Iterable[int]) -> float:
        pairs = sum(s * (s + 1) // 2 for s in lengths)
        return 12.0 * self.layers * self.attention_width * pairs

    def __call__(self, lengths: Iterable[int]) -> float:
        """Training FLOPs of documents (or cut pieces) of these lengths."""
        lengths = list(lengths)
        return self.linear(sum(lengths)) + self.attention(lengths)


def compiled_graphs() -> int:
    """Graphs dynamo has compiled in this process so far (a recompile adds one)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


class DocumentMeter:
    """What the steps since the last logged one trained, by document: FLOPs, the
    documents a batching cut and the tokens that lost their context, and the
    compiled graphs. Both trainers ``add`` each step; the metrics processor asks
    for ``metrics`` when it logs (torchtitan_patches/metrics.py)."""

    def __init__(self, flops: DocumentFlops, world_size: int, peak_flops: float | None, seq_len: int):
        self.flops = flops
        self.world_size = world_size
        self.peak_flops = peak_flops
        """The device's dense bf16 peak (torchtitan's table); None on CPU (no MFU)."""
        self.seq_len = seq_len
        self.since_log = 0.0
        self.cut_documents = 0
        self.context_lost_tokens = 0

    def add(self, lengths: Iterable[int], cut_documents: int = 0, context_lost_tokens: int = 0) -> None:
        """One step over all ranks: the documents (or cut pieces) it trained, how many
        of them were pieces that start mid-document and their tokens."""
        self.since_log += self.flops(lengths)
        self.cut_documents += cut_documents
        self.context_lost_tokens += context_lost_tokens

    def metrics(self, seconds: float) -> dict[str, float]:
        """TensorBoard scalars for the steps since the last log, which took ``seconds``:
        their FLOPs over all ranks and the rate a device; resets the FLOPs (the cut
        counts and graphs are the run's totals)."""
        per_gpu = self.since_log / max(seconds, 1e-9) / self.world_size
        out = {"documents/flops": self.since_log, "documents/tflops": per_gpu / 1e12,
               "documents/cut_documents": float(self.cut_documents),
               "documents/context_lost_tokens": float(self.context_lost_tokens),
               "compile/graphs": float(compiled_graphs())}
        if self.peak_flops:
            out["documents/mfu(%)"] = 100.0 * per_gpu / self.peak_flops
        self.since_log = 0.0
        return out

    def line(self, step: int, m: dict[str, float]) -> str:
        mfu = (f", MFU {m['documents/mfu(%)']:.1f}% of {self.peak_flops / 1e12:,.0f} TFLOP/s"
               if "documents/mfu(%)" in m else "")
        return (f"step {step}: document-aware {m['documents/tflops']:.3g} TFLOP/s a device{mfu} (attention "
                f"from each trained document; torchtitan's tflops/mfu above price every token at seq_len "
                f"{self.seq_len}); cut documents {m['documents/cut_documents']:,.0f}, compiled graphs "
                f"{m['compile/graphs']:,.0f}")
