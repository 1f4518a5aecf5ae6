"""Synthetic token sequences whose lengths follow a real distribution.

Sample ``i`` is a pure function of ``(seed, i)``: every rank, every restart
and every schedule sees the same tokens for the same index, so a global batch
is fully described by its step number and parity or resume tests need no
shared state. Tokens follow a per-sequence arithmetic progression with a few
random substitutions, which a small model learns within a few steps (so
"loss decreases" is a meaningful check) without any text or tokenizer.
"""

import math
from dataclasses import dataclass

import numpy as np
import torch

IGNORE_INDEX = -100
"""Label value skipped by the loss (torchtitan's ``IGNORE_INDEX``)."""


@dataclass(frozen=True)
class Sample:
    """One sequence: ``labels[t]`` is ``input[t + 1]``; the last label is ignored."""

    input: torch.Tensor  # int64 [L]
    labels: torch.Tensor  # int64 [L]

    @property
    def length(self) -> int:
        return int(self.input.numel())


@dataclass(frozen=True)
class SyntheticSequences:
    """Deterministic synthetic samples indexed by an integer."""

    lengths: np.ndarray
    """Real lengths to draw from (tokens)."""
    vocab_size: int
    seed: int = 0
    length_scale: float = 1.0
    """Divide drawn lengths by this (keeps the shape at a smaller size)."""
    min_len: int = 2
    max_len: int | None = None
    """Clip lengths to this (like an SFT max-length filter); None keeps the tail."""
    noise: float = 0.1
    """Share of tokens replaced by uniform random ones."""

    def __post_init__(self):
        if self.vocab_size < 3:
            raise ValueError("vocab_size must be at least 3")
        if self.length_scale <= 0:
            raise ValueError("length_scale must be positive")
        if self.min_len < 2:
            raise ValueError("min_len must be at least 2 (one input, one label)")
        if self.max_len is not None and self.max_len < self.min_len:
            raise ValueError("max_len must be >= min_len")

    def _draw(self, index: int) -> tuple[np.random.Generator, int]:
        """The sample's generator, already past the length draw, and its length."""
        rng = np.random.default_rng([self.seed, index])
        raw = int(self.lengths[rng.integers(len(self.lengths))])
        n = max(self.min_len, math.ceil(raw / self.length_scale))
        return rng, (n if self.max_len is None else min(n, self.max_len))

    def length(self, index: int) -> int:
        """Length of sample ``index`` without building its tokens."""
        return self._draw(index)[1]

    def loss_tokens(self, index: int, n: int, length: int) -> int:
        """Loss tokens of sample ``index`` (``length`` tokens long) trained as
        its first ``n``: every label but a whole sample's last."""
        return n if n < length else length - 1

    @property
    def max_length(self) -> int:
        """The longest sample this source can produce (any index)."""
        n = max(self.min_len, math.ceil(int(self.lengths.max()) / self.length_scale))
        return n if self.max_len is None else min(n, self.max_len)

    def __getitem__(self, index: int) -> Sample:
        rng, n = self._draw(index)
        # Token 0 is reserved for padding, so real tokens live in [1, V).
        span = self.vocab_size - 1
        start = int(rng.integers(span))
        stride = int(rng.integers(1, 8))
        toks = (start + stride * np.arange(n)) % span + 1
        noisy = rng.random(n) < self.noise
        toks[noisy] = rng.integers(1, self.vocab_size, int(noisy.sum()))
        ids = torch.from_numpy(toks.astype(np.int64))
        labels = torch.empty_like(ids)
        labels[:-1] = ids[1:]
        labels[-1] = IGNORE_INDEX
        return Sample(input=ids, labels=labels)

    def global_batch(self, step: int, size: int) -> list[int]:
        """Sample indices of the global batch of 1-based training ``step``."""
        if step < 1:
            raise ValueError("steps are 1-based")
        return list(range((step - 1) * size, step * size))
