"""What a chunked document costs: time on the cost model, bytes on a rank (``overlength = "chunk"``).

A document of T tokens trained in chunks of C (skrull_ext/train/chunked.py)
runs chunk c = [a, b) as a forward of b - a tokens attending over its a
earlier ones, then, in backward, that forward again (recompute) and its
backward. The core's per-layer forward FLOPs are a quadratic without a
constant, flops(s) = lin s + att s^2 (cpp/include/skrull/cost_model.hpp), so
the chunk's own FLOPs, its linear layers plus its queries against the
prefix and itself, are exactly ``flops(b) - flops(a)``, and the chunks' sum
is ``flops(T)``: chunking moves no work, it adds the recomputed forward
(``RECOMPUTE_SHARE`` of a fwd+bwd) of every chunk but the last, which keeps
its activations (its backward runs first), and one call's fixed cost per
chunk. On a
profile fitted on a kernel that skips no masked pair (``dense_fit``: CPU's),
the chunk's attention is priced as the rectangle its masked SDPA computes.

Over a CP group of N ranks each chunk is sharded (each rank computes 1/N of
its FLOPs) and its K/V all-gathered, its gradient reduce-scattered:
``comm_us(kv_bytes(C))`` per layer and chunk, plus one more gather,
``collective_us(kv_bytes(C))``, in backward's recompute (not the last
chunk's), not hidden (the next layer needs it). One chunk pass is the core's
``CostModel.chunk_pass_us`` (cpp/include/skrull/cost_model.hpp), the price a
lockstep pad chunk has too (``pad_chunks_us``).

Bytes: every rank of the group keeps the whole document's K/V until backward
(``layers x kv_bytes(T)``, measured equal by tests/unit_tests/test_chunked.py).
Beyond one chunk's recomputed activations (a chunk of C/N tokens per rank:
what a micro-batch of that many tokens holds, its own K/V among them), the
peak is at the start of the backward of one of the last two chunks, whose
prefixes are the longest (p: the last chunk's prefix, every chunk's K/V but
its own):

- the last chunk's: the kept prefix K/V and its forward's concatenation of
  it (2 x K/V(p); kept from the forward, not recomputed: the same bytes), and the attention's mask over the prefix where the kernel
  keeps one: the CPU reference kernel saves a float L x L mask, the memory
  fit's quadratic term (``mask_bytes_per_token2``), and a chunk's rows run
  over its prefix's keys too. A GPU profile fitted on varlen has that term
  ~0, while a chunk's own masked SDPA (attention/prefix.py) still takes a
  mask over its prefix: not measured (no GPU was lent);
- the one before it: the kept K/V, their gradients (the last chunk's
  backward made them) and its own concatenation (3 x K/V(p) - K/V(C)), the
  mask over its prefix, and one gradient of every trainable parameter
  (``gradient_bytes``): each parameter is used by every chunk's graph, so
  autograd sums its gradient over them before accumulating it into
  ``.grad``, and the sum is held from the last chunk's backward to the
  first's; and every FSDP unit's unsharded parameters (``unsharded_bytes``):
  the chunk is checkpointed, and its recompute runs each unit's forward in
  FSDP's pre-backward state, which gathers the unit and keeps it until that
  unit's backward, so the whole model's unsharded copy is held at the start
  of the chunk's backward. torchtitan wraps one rank in FSDP too (its copy
  there is a cast copy of the float32 parameters): measured at one rank, the
  debug llama3's 23.5 MiB (24,654,848 B), its parameters' float32 bytes.

Measured by ``python -m skrull_ext.profile.check`` (check_chunked.py) on CPU
within 0.97-1.0 of the measured peak for chunks of 128-1,396 tokens;
docs/design/chunked.md, "Memory and time, checked".
"""

from dataclasses import dataclass, field

from skrull_ext import _core
from skrull_ext._core import CostModel
from skrull_ext.scheduler.profile_memory import ProfileMemory

__all__ = ["ChunkCost", "ChunkRule", "ChunkTooLarge", "RECOMPUTE_SHARE", "chunk_cost", "fitting_chunk",
           "peak_bytes_beyond_chunk"]

RECOMPUTE_SHARE = _core.RECOMPUTE_SHARE
"""The core's kRecomputeShare (cost_model.hpp), 1/3: the forward's share of a forward + backward (backward ~ 2 forwards): what recomputing a
chunk's forward adds to its price (the layers' ``line_us`` and host floor and, since the checkpoint
holds the whole forward, the head's ``token_us``). Measured on CPU: 0.33-0.36 (docs/design/chunked.md)."""


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
    """What a rank holds beyond one chunk's activations during backward, at the worse of the last
    two chunks: copies of the prefix K/V, the mask over the prefix, the parameters' summed gradients
    and FSDP's unsharded parameters in a checkpointed chunk's recompute."""


def chunk_cost(model: CostModel, length: int, chunk: int, cp: int = 1, *, mask_bytes_per_token2: float = 0.0,
               gradient_bytes: float = 0.0, unsharded_bytes: float = 0.0, dense_fit: bool = False) -> ChunkCost:
    """Price a ``length``-token document trained in chunks of ``chunk`` tokens over ``cp`` ranks.

    ``mask_bytes_per_token2``: bytes the attention keeps per (query, key) pair, the memory fit's
    quadratic coefficient (``ProfileMemory.c``: the CPU kernel's float mask).
    ``gradient_bytes``: one gradient of the rank's trainable parameters, held summed over the
    chunks while their backward runs (0 leaves it out).
    ``unsharded_bytes``: every FSDP unit's unsharded parameters on the rank (the parameters in
    ``mixed_precision_param``), gathered at once by a checkpointed chunk's recompute (0 leaves it out).
    ``dense_fit``: the model's attention rate was fitted on a kernel that computes every (query,
    key) pair of a sequence, masked or not (a masked SDPA over it: the ``dense`` and ``segments``
    kernels, CPU's), so it is a rate per pair; a chunk's attention, a masked SDPA of its queries
    over its prefix and itself (attention/prefix.py) that skips nothing either, then costs its
    (b - a) x b rectangle at that rate, not ``flops(b) - flops(a)`` (its (b - a) x (a + b) at the
    same rate: up to 2x more for late chunks). Fitted on a causal kernel (varlen, tiles) the rate
    is per pair of half the square, and ``flops(b) - flops(a)`` prices the rectangle."""
    if length < 1 or chunk < 1 or cp < 1 or chunk % cp:
        raise ValueError(f"chunked document: length {length}, chunk {chunk} and cp {cp} must be positive, "
                         f"the chunk a multiple of cp")
    layers = model.shape.layers
    us = one_pass = 0.0
    bounds = [(a, min(a + chunk, length)) for a in range(0, length, chunk)]
    for a, b in bounds:
        # One chunk pass (cost_model.hpp chunk_pass_us, the price a lockstep pad chunk has too): its
        # FLOPs over its prefix (the rectangle its masked SDPA computes where dense_fit), its K/V
        # gathered and its gradient reduce-scattered at CP > 1, and, checkpointed (every chunk but the
        # last, which keeps its activations), its forward again in backward, and its gather where the
        # recompute gathers again (model.chunk_regather: traced chunks; eager ones reuse the forward's).
        us += model.chunk_pass_us(a, b - a, cp, b != length, dense_fit)
    one_exchange = model.comm_us(model.kv_bytes(length)) if cp > 1 else 0.0
    one_pass = layers * model.layer_us(one_exchange, 0.0, model.flops(length) / cp) + model.token_us * length / cp \
        + model.micro_batch_fixed_us
    kv = layers * model.kv_bytes(length)
    beyond = peak_bytes_beyond_chunk(model, length, chunk, cp, mask_bytes_per_token2=mask_bytes_per_token2,
                                     gradient_bytes=gradient_bytes, unsharded_bytes=unsharded_bytes)
    return ChunkCost(len(bounds), us, one_pass, kv, beyond)


def peak_bytes_beyond_chunk(model: CostModel, length: int, chunk: int, cp: int = 1, *,
                            mask_bytes_per_token2: float = 0.0, gradient_bytes: float = 0.0,
                            unsharded_bytes: float = 0.0) -> float:
    """``ChunkCost.peak_bytes_beyond_chunk`` alone (the module docstring says what it counts): what a
    rank holds beyond one chunk's activations, at the worse of the last two chunks' backward."""
    layers = model.shape.layers
    p = (length - 1) // chunk * chunk  # the last chunk's prefix

    def kv_of(tokens: int) -> float:
        return layers * model.kv_bytes(tokens)

    def mask_over(tokens: int) -> float:  # this rank's chunk/cp queries against ``tokens`` prefix keys
        return mask_bytes_per_token2 * (chunk / cp) * tokens

    beyond = 2.0 * kv_of(p) + mask_over(p)  # the last chunk's backward
    if p > 0:  # the one before it
        beyond = max(beyond, 3.0 * kv_of(p) - kv_of(chunk) + mask_over(p - chunk) + gradient_bytes + unsharded_bytes)
    return beyond


class ChunkTooLarge(ValueError):
    """No chunk of a document fits a rank's memory: its K/V alone (and the rest beyond a chunk)
    exceed what the rank has for activations."""


def fitting_chunk(model: CostModel, memory: ProfileMemory, length: int, limit: int, cp: int = 1, *,
                  gradient_bytes: float = 0.0, unsharded_bytes: float = 0.0, unit: int | None = None) -> int:
    """The largest chunk C (a multiple of ``unit``, default ``cp``; under TP cp x tp, so each TP
    rank's sequence-parallel share is whole: train/chunked.py; at most ``limit``) a ``length``-token document can
    be trained in whose predicted peak fits one rank: ``memory.activation_any(C / cp)`` (one
    chunk's share, as BucketSize is derived) + ``peak_bytes_beyond_chunk`` (the prefix's K/V
    copies, the mask over it at the fit's ``c``, ``gradient_bytes``, ``unsharded_bytes``) within the activation room
    ``(usable - static) x (1 - margin)``: the rule ``budget`` and BucketSize's derivation keep,
    and the arithmetic profile.check's chunked case measures (profile/check_chunked.py).

    At the limit a chunk's activations alone fill that room (the limit is BucketSize a rank),
    so a document longer than it is chunked smaller, by the bytes its K/V take. The peak is not
    monotone in C (the last chunk's prefix jumps as C crosses a divisor of the length), so every
    multiple of ``cp`` is tried from the limit down; it is monotone in ``length`` for a fixed C,
    so the chosen C never grows with the length. Raises ChunkTooLarge when not even a chunk of
    ``cp`` tokens (one a rank) fits."""
    unit = cp if unit is None else unit
    if length < 1 or cp < 1 or unit % cp or limit < unit:
        raise ValueError(f"fitting_chunk: length {length}, limit {limit}, cp {cp} and unit {unit} must be positive, "
                         f"the unit a multiple of cp, the limit at least the unit")
    room = (memory.usable - memory.static) * (1.0 - memory.margin)

    def peak(c: int) -> float:
        return memory.activation_any(c // cp) + peak_bytes_beyond_chunk(
            model, length, c, cp, mask_bytes_per_token2=memory.c, gradient_bytes=gradient_bytes,
            unsharded_bytes=unsharded_bytes)

    for c in range(limit - limit % unit, 0, -unit):
        if peak(c) <= room:
            return c
    kv = model.shape.layers * model.kv_bytes(length)
    mib = lambda v: f"{v / 2**20:.1f} MiB" if v >= 2**20 else f"{v:.0f} B"  # noqa: E731
    raise ChunkTooLarge(
        f"a sample of {length} tokens cannot be trained in chunks on one rank: its K/V alone take {mib(kv)}, "
        f"and even in chunks of {unit} token(s) its predicted peak is {mib(peak(unit))}, over the "
        f"{mib(room)} a rank has for activations (memory.usable_bytes - static_bytes, less the margin); "
        f"the limit is {limit} tokens. Cut such samples shorter (dataloader.max_len, or skrull.overlength "
        f"'truncate' or 'drop'), or give each document more memory (more CP ranks, LoRA, a larger device)")


@dataclass
class ChunkRule:
    """The chunk each chunked document trains in, one rule for the scheduler's price
    (``SchedulerJob.chunk_for``) and the trainer's run (train/passes.py): ``fitting_chunk`` on the
    job's measured memory model, or the limit when there is none (a hardware preset: the peak is
    then not checked, ``note`` says so). Remembers each length's chunk."""

    cost: CostModel
    memory: ProfileMemory | None
    limit: int
    """What a CP group holds (``Capacity.group_limit``): the largest chunk."""
    cp: int = 1
    gradient_bytes: float = 0.0
    """One gradient of a rank's trainable parameters (held summed over the chunks in backward)."""
    unsharded_bytes: float = 0.0
    """Every FSDP unit's unsharded parameters (gathered at once by a checkpointed chunk's recompute)."""
    _chunks: dict[int, int] = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def unit(self) -> int:
        """A chunk is a multiple of it: cp x the TP degree the cost model prices (train/chunked.py)."""
        return self.cp * self.cost.shape.tp

    def chunk(self, length: int) -> int:
        """The chunk of a ``length``-token document (ChunkTooLarge when none fits)."""
        if self.memory is None:
            return self.limit - self.limit % self.unit
        if length not in self._chunks:
            self._chunks[length] = fitting_chunk(self.cost, self.memory, length, self.limit, self.cp,
                                                 gradient_bytes=self.gradient_bytes,
                                                 unsharded_bytes=self.unsharded_bytes, unit=self.unit)
        return self._chunks[length]
