"""One rank's memory model, as a profile's ``[memory]`` section states it, and BucketSize.

Apart from profile_file.py (which reads, checks and interprets the whole
file) because the memory model is used on its own: by the profiler that
fits and writes it, the trainer's start-up (execution, free-running, the
activation-checkpointing choice) and the checks that re-measure it. The
formulas: docs/design/cost_model.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from skrull_ext import _core

__all__ = ["MEMORY_KEYS", "MemoryKey", "ProfileMemory", "derive_bucket_size", "free_running_bytes", "head_bytes",
           "per_rank_coefficients"]


@dataclass(frozen=True)
class MemoryKey:
    """One key of a profile's ``[memory]`` section. ``MEMORY_KEYS`` is the one list of them: the
    file check (``_check``), the reader (``ProfileMemory.of``, ``Profile.bucket_size``, ``.cp``) and
    the writer (``ProfileMemory.section``) all go through it."""

    key: str
    """The TOML key."""
    field: str
    """``ProfileMemory``'s field for it."""
    doc: str
    """What it means."""
    default: int | float | None = None
    """Its value when absent; None: reading the memory model needs it."""
    integer: bool = False
    """A positive integer (else any number)."""
    written_at_default: bool = True
    """False: the writer leaves it out at its default (a file then reads as it did before the key)."""

    def check(self, value: Any, where: str) -> Any:
        """``value`` as given, or a ValueError naming the key, the value and what it must be."""
        if self.integer:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{where}: memory.{self.key} must be a positive integer, got {value!r}")
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{where}: memory.{self.key} must be a number, got {value!r}")
        return value

    def read(self, table: dict[str, Any], where: str) -> Any:
        """Its checked value in a [memory] table, or its default; a missing needed key is an error."""
        if self.key not in table:
            if self.default is None:
                raise ValueError(f"{where}: missing field memory.{self.key} (needed to check BucketSize)")
            return self.default
        return self.check(table[self.key], where)


MEMORY_KEYS: tuple[MemoryKey, ...] = (
    MemoryKey("bucket_size", "bucket_size", "BucketSize, tokens one rank holds (derive_bucket_size)", integer=True),
    MemoryKey("a_bytes_per_token", "a", "activation bytes per token of whole sequences (the fit's slope)"),
    MemoryKey("b_bytes", "b", "activation bytes of any buffer (the fit's intercept)"),
    MemoryKey("c_bytes_per_token2", "c", "a quadratic term per token squared: dense-mask attention", 0.0),
    MemoryKey("usable_bytes", "usable", "what one rank may use"),
    MemoryKey("static_bytes", "static", "the static account: sharded parameters, gradients, optimizer state"),
    MemoryKey("margin", "margin", "the share of the room for activations BucketSize leaves free", 0.0),
    MemoryKey("cp", "cp", "the CP degree BucketSize was derived for (older profiles: 1)", 1, integer=True),
    MemoryKey("kv_bytes_per_token", "kv", "K/V bytes per token a shard keeps from each other CP rank", 0.0),
    MemoryKey("free_running_bytes", "free_running", "the unsharded parameters and gradients of [skrull] "
              "free_running (free_running_bytes) included in static_bytes; 0: measured for a lockstep job", 0.0,
              written_at_default=False),
    MemoryKey("logits_bytes_per_token", "logits", "peak bytes per token of the head and loss ([loss], "
              "train/head_loss.py), outside a_bytes_per_token; 0: older profiles, the logits counted in "
              "a_bytes_per_token", 0.0, written_at_default=False),
    MemoryKey("head_chunk_tokens", "head_chunk", "tokens a chunk of the head and loss BucketSize was derived "
              "with: the logits take logits_bytes_per_token x min(tokens, head_chunk_tokens); 0: older profiles",
              0, integer=True, written_at_default=False),
    MemoryKey("head_grad_bytes", "head_grad", "bytes the head's chunks hold from forward to backward with their "
              "gradients computed in forward ([loss] head_backward = \"in_forward\", train/head_grad.py): the "
              "head's weight gradient in float32, vocab x dim x 4 B, counted in b_bytes as measured; 0: the "
              "chunks measured with head_backward \"recompute\" (or older profiles)", 0.0, written_at_default=False),
)
"""The ``[memory]`` keys, in the order the writer puts them."""
_MEMORY = {k.key: k for k in MEMORY_KEYS}
_MEMORY = {k.key: k for k in MEMORY_KEYS}



def per_rank_coefficients(a_bytes_per_token: float, c_bytes_per_token2: float, cp: int = 1,
                          kv_bytes_per_token: float = 0.0) -> tuple[float, float]:
    """(a', c') of a rank of the cp group holding tokens whole or as shards: a shard
    also keeps the K/V gathered from the other cp - 1 ranks and (dense CPU mask)
    attends cp times as many keys, so a' = a + (cp - 1) * kv and c' = c * cp."""
    return a_bytes_per_token + (cp - 1) * kv_bytes_per_token, c_bytes_per_token2 * cp


def head_bytes(tokens: int, logits_bytes_per_token: float, head_chunk_tokens: int) -> float:
    """Peak bytes of the head and loss ([loss], train/head_loss.py) over ``tokens``: one chunk's
    logits at most, ``logits_bytes_per_token`` each (0 when a profile counts them in ``a``)."""
    if head_chunk_tokens <= 0:
        return 0.0
    return logits_bytes_per_token * min(tokens, head_chunk_tokens)


def derive_bucket_size(usable_bytes: float, static_bytes: float, a_bytes_per_token: float, b_bytes: float = 0.0,
                       margin: float = 0.05, c_bytes_per_token2: float = 0.0, cp: int = 1,
                       kv_bytes_per_token: float = 0.0, logits_bytes_per_token: float = 0.0,
                       head_chunk_tokens: int = 0) -> int:
    """BucketSize C: tokens one rank holds, the largest C with
    a'*C + c'*C^2 <= (usable - static - b) * (1 - margin).

    a and c are measured on whole sequences. With cp > 1 a rank may hold C
    tokens that are all shards of distributed sequences (DACP), and that
    costs more than C whole tokens: it keeps the K/V gathered from the other
    cp - 1 ranks (kv_bytes_per_token each: K and V of every layer), and its
    attention spans cp times as many keys as queries (the dense CPU mask's
    quadratic term). So a' = a + (cp - 1) * kv_bytes_per_token and
    c' = c * cp, the worst case, which a rank of whole sequences only
    undershoots (measured in docs/profile.md, "BucketSize in training").

    The head and loss in chunks of ``head_chunk_tokens`` (train/head_loss.py) hold one
    chunk's logits, ``logits_bytes_per_token`` each, whatever C is: they join b as
    head_chunk_tokens x logits_bytes_per_token when C exceeds a chunk, else they are
    C x logits_bytes_per_token and join a (a BucketSize that never fills a chunk)."""
    if logits_bytes_per_token < 0 or not math.isfinite(logits_bytes_per_token):
        raise ValueError(f"logits_bytes_per_token must be finite and >= 0, got {logits_bytes_per_token}")
    if logits_bytes_per_token > 0 and head_chunk_tokens > 0:
        rest = (usable_bytes, static_bytes)
        tail = (margin, c_bytes_per_token2, cp, kv_bytes_per_token)
        try:
            chunked = derive_bucket_size(*rest, a_bytes_per_token,
                                         b_bytes + head_chunk_tokens * logits_bytes_per_token, *tail)
        except ValueError:  # no room for a whole chunk: BucketSize is below one
            chunked = 0
        if chunked >= head_chunk_tokens:
            return chunked
        return derive_bucket_size(*rest, a_bytes_per_token + logits_bytes_per_token, b_bytes, *tail)
    if not isinstance(cp, int) or cp < 1:
        raise ValueError(f"cp must be an integer >= 1, got {cp!r}")
    if kv_bytes_per_token < 0 or not math.isfinite(kv_bytes_per_token):
        raise ValueError(f"kv_bytes_per_token must be finite and >= 0, got {kv_bytes_per_token}")
    if a_bytes_per_token <= 0 or not math.isfinite(a_bytes_per_token):
        raise ValueError(f"a_bytes_per_token must be finite and > 0, got {a_bytes_per_token}")
    if c_bytes_per_token2 < 0 or not math.isfinite(c_bytes_per_token2):
        raise ValueError(f"c_bytes_per_token2 must be finite and >= 0, got {c_bytes_per_token2}")
    if not 0 <= margin < 1:
        raise ValueError(f"margin must be in [0, 1), got {margin}")
    free = (usable_bytes - static_bytes - b_bytes) * (1.0 - margin)
    if free < a_bytes_per_token + c_bytes_per_token2:
        raise ValueError(
            f"no room for activations: usable {usable_bytes:.3e} B - static {static_bytes:.3e} B - "
            f"fixed {b_bytes:.3e} B leaves less than one token ({a_bytes_per_token:.3e} B)"
        )
    a, c = per_rank_coefficients(a_bytes_per_token, c_bytes_per_token2, cp, kv_bytes_per_token)
    tokens = free / a if c == 0 else 2.0 * free / (a + math.sqrt(a * a + 4.0 * c * free))
    return min(int(tokens), _core.MAX_BUCKET_SIZE)


def free_running_bytes(params: int, trainable: int, param_bytes: int, grad_bytes: int, model_shards: int = 1) -> float:
    """What ``[skrull] free_running`` adds to a rank's static memory: every parameter
    unsharded (``param_bytes`` each: FSDP's mixed_precision_param) and every trainable
    parameter's unsharded gradient (``grad_bytes``: FSDP accumulates an unsynchronised
    gradient in its reduce dtype, float32 in torchtitan 0.3.0, when that is wider than the
    parameter's), held from the step's first forward to its last backward. A frozen
    parameter (a LoRA base) has no gradient. ``model_shards``: TP x PP, which FSDP does not
    unshard. The sharded parameters, gradients and optimizer state stay as they are."""
    return (params * param_bytes + trainable * grad_bytes) / model_shards


@dataclass(frozen=True)
class ProfileMemory:
    """A profile file's [memory] section: what it predicts for one rank. One field per key of
    ``MEMORY_KEYS`` (``MemoryKey.field``), which says what each means."""

    bucket_size: int
    a: float
    b: float
    c: float
    usable: float
    static: float
    margin: float
    cp: int = _MEMORY["cp"].default
    kv: float = _MEMORY["kv_bytes_per_token"].default
    free_running: float = _MEMORY["free_running_bytes"].default
    logits: float = _MEMORY["logits_bytes_per_token"].default
    head_chunk: int = _MEMORY["head_chunk_tokens"].default
    head_grad: float = _MEMORY["head_grad_bytes"].default

    @classmethod
    def of(cls, profile: dict) -> ProfileMemory:
        """The [memory] section of a profile dict, each key read by ``MEMORY_KEYS``."""
        m = profile.get("memory")
        if m is None:
            raise ValueError("profile: missing section [memory] (needed to check BucketSize)")
        return cls(**{k.field: k.read(m, "profile") for k in MEMORY_KEYS})

    def section(self) -> dict[str, Any]:
        """This model as a profile's [memory] table (the fit keys aside), inverse of ``of``."""
        return {k.key: getattr(self, k.field) for k in MEMORY_KEYS
                if k.written_at_default or getattr(self, k.field) != k.default}

    def activation(self, tokens: int) -> float:
        """The fit: activation bytes of a buffer of ``tokens`` whole sequences."""
        return self.b + self.a * tokens + self.c * tokens * tokens + head_bytes(tokens, self.logits, self.head_chunk)

    def activation_any(self, tokens: int) -> float:
        """Activation bytes of ``tokens`` on a rank of the cp group, whole or
        shards (the worst case derive_bucket_size derives BucketSize for)."""
        a, c = per_rank_coefficients(self.a, self.c, self.cp, self.kv)
        return self.b + a * tokens + c * tokens * tokens + head_bytes(tokens, self.logits, self.head_chunk)

    def budget(self, tokens: int) -> float:
        """All a rank holding ``tokens`` may use: static account + activation fit, its part that
        grows with the tokens grown by the margin, as ``derive_bucket_size`` grows it (b, and the
        one chunk of logits a micro-batch of a chunk or more holds, outside the margin), so the
        budget is <= usable up to BucketSize. (The margin grew b too before; with b at a few
        bytes that was nothing, with the head's chunk in b it put BucketSize's budget over usable.)"""
        fixed = self.b
        if self.head_chunk > 0 and tokens >= self.head_chunk:
            fixed += head_bytes(tokens, self.logits, self.head_chunk)
        return self.static + fixed + (self.activation_any(tokens) - fixed) / (1.0 - self.margin)

    def free_running_need(self, unsharded: float, tokens: int) -> float:
        """All a free-running rank holding ``tokens`` may use: ``budget`` with the static
        account's own free-running share (if any) replaced by ``unsharded`` bytes."""
        return self.budget(tokens) - self.free_running + unsharded

    def free_running_bucket_size(self, unsharded: float) -> int:
        """The largest BucketSize whose ``free_running_need`` fits ``usable`` (0: none does):
        ``derive_bucket_size`` with the unsharded parameters and gradients in the static account."""
        try:
            return derive_bucket_size(self.usable, self.static - self.free_running + unsharded, self.a, self.b,
                                      self.margin, self.c, self.cp, self.kv, self.logits, self.head_chunk)
        except ValueError:
            return 0
