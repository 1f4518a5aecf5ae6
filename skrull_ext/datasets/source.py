"""Shared config of the synthetic-token dataloaders.

Every skrull-ext dataloader (torchtitan-style packed rows, Skrull-scheduled
buffers) draws the same global batches from the same source, which is what
makes a Skrull run comparable token for token with a torchtitan run.
"""

from dataclasses import dataclass

import numpy as np
from torchtitan.components.dataloader import BaseDataLoader
from torchtitan.components.tokenizer import BaseTokenizer

from skrull_ext import lengths as shipped_lengths
from skrull_ext.datasets.synthetic import SyntheticSequences


class SyntheticDataLoaderBase(BaseDataLoader):
    """Base for loaders over ``SyntheticSequences``; holds the step counter."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseDataLoader.Config):
        dataset: str = "synthetic"
        lengths: str = "sharegpt_v3_conversations.qwen"
        """A shipped length distribution (skrull_ext/lengths, README there) or a file path."""
        length_scale: float = 1.0
        """Divide drawn lengths by this; keeps the distribution's shape smaller."""
        min_len: int = 2
        max_len: int | None = None
        """Clip sample lengths (an SFT max-length filter); None keeps the tail."""
        vocab_size: int | None = None
        """Token ids are drawn from [1, vocab_size); None: the tokenizer's (the model's)."""
        seed: int = 0
        global_batch_size: int = 8
        """Sequences per optimizer step, over all DP ranks."""

        def __post_init__(self):
            if self.global_batch_size < 1:
                raise ValueError("dataloader.global_batch_size must be >= 1")

    def __init__(self, config: Config, tokenizer: BaseTokenizer | None = None):
        self.config = config
        vocab = config.vocab_size
        if vocab is None:
            if tokenizer is None:
                raise ValueError("dataloader.vocab_size is unset and there is no tokenizer")
            vocab = tokenizer.get_vocab_size()
        self.source = SyntheticSequences(
            lengths=np.asarray(shipped_lengths.load(config.lengths), dtype=np.int64),
            vocab_size=vocab,
            seed=config.seed,
            length_scale=config.length_scale,
            min_len=config.min_len,
            max_len=config.max_len,
        )
        self.step = 0
        """Global batches consumed so far (the checkpointed state)."""

    def next_global_batch(self) -> list[int]:
        self.step += 1
        return self.source.global_batch(self.step, self.config.global_batch_size)

    def state_dict(self) -> dict:
        return {"step": self.step}

    def load_state_dict(self, state_dict: dict) -> None:
        self.step = int(state_dict.get("step", 0))
