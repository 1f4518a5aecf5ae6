"""What a chunked document costs: time on the cost model, bytes on a rank (``overlength = "chunk"``).

A document of T tokens trained in chunks of C (skrull_ext/train/chunked.py)
runs chunk c = [a, b) as a forward of b - a tokens attending over its a
earlier ones, then, in backward, that forward again (recompute) and its
backward. The core's per-layer forward FLOPs are a quadratic without a
constant, flops(s) = lin s + att s^2 (cpp/include/skrull/cost_model.hpp), so
the chunk's own FLOPs, its linear layers plus its queries against the
prefix and itself, are exactly ``flops(b) - flops(a)``, and the chunks' sum
is ``flops(T)``: chunking moves no work, it adds the recomputed forward
(``RECOMPUTE_SHARE`` of a fwd+bwd) and one call's fixed cost per chunk.

Over a CP group of N ranks each chunk is sharded (each rank computes 1/N of
its FLOPs) and its K/V all-gathered once: ``comm_us(kv_bytes(C))`` per layer
and chunk, again in backward's recompute, not hidden (the next layer needs
it).

Bytes: every rank of the group keeps the whole document's K/V until backward
(``layers x kv_bytes(T)``, measured equal by tests/unit_tests/test_chunked.py),
and while chunk c's backward runs, its recomputed activations (a chunk of C/N
tokens per rank: what a micro-batch of that many tokens holds), the gradient
of the K/V of its prefix and, on the reference kernels, its concatenated
prefix K/V: at most three times the document's K/V, whatever its length in
chunks.
"""

from dataclasses import dataclass

from skrull_ext._core import CostModel

__all__ = ["ChunkCost", "RECOMPUTE_SHARE", "chunk_cost"]

RECOMPUTE_SHARE = 1.0 / 3.0
"""The forward's share of a forward + backward (backward ~ 2 forwards): what recomputing a
chunk's forward adds to ``comp_us``, which prices forward + backward."""

KV_COPIES = 3
"""Peak copies of the document's K/V on a rank: kept, its gradient, the recomputed chunk's
concatenation of its prefix."""


@dataclass(frozen=True)
class ChunkCost:
    """One chunked document on one rank of its CP group."""

    chunks: int
    us: float
    """Predicted forward + recompute + backward time, every chunk (what the step waits for)."""
    one_pass_us: float
    """The same document in one pass on the group, were it to fit: what chunking costs beside it."""
    kv_bytes: float
    """The document's K/V a rank keeps until backward (every layer)."""
    peak_bytes_beyond_chunk: float
    """What a rank holds beyond one chunk's activations during backward (``KV_COPIES`` x the K/V)."""


def chunk_cost(model: CostModel, length: int, chunk: int, cp: int = 1) -> ChunkCost:
    """Price a ``length``-token document trained in chunks of ``chunk`` tokens over ``cp`` ranks."""
    if length < 1 or chunk < 1 or cp < 1 or chunk % cp:
        raise ValueError(f"chunked document: length {length}, chunk {chunk} and cp {cp} must be positive, "
                         f"the chunk a multiple of cp")
    layers = model.shape.layers
    us = one_pass = 0.0
    bounds = [(a, min(a + chunk, length)) for a in range(0, length, chunk)]
    for a, b in bounds:
        f = (model.flops(b) - model.flops(a)) / cp
        exchange = model.comm_us(model.kv_bytes(b - a)) if cp > 1 else 0.0
        us += layers * (model.comp_us(f) * (1.0 + RECOMPUTE_SHARE) + 2.0 * exchange)
        us += model.token_us * (b - a) / cp + model.micro_batch_fixed_us
    one_pass = layers * model.comp_us(model.flops(length) / cp) + model.token_us * length / cp \
        + model.micro_batch_fixed_us
    if cp > 1:
        one_pass += layers * model.comm_us(model.kv_bytes(length))
    kv = layers * model.kv_bytes(length)
    return ChunkCost(len(bounds), us, one_pass, kv, KV_COPIES * kv)
