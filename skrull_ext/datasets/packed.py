"""torchtitan-format batches of the sources' global batches (the baseline).

Each step's global batch is laid out in rows by ``[dataloader] packing``
(row_layout.py: whole samples in ``local_batch_size`` rows of ``seq_len``,
or the samples as one stream cut into as few rows as hold them); DP rank r
gets its share of the rows. Each piece of a sample is a document (positions
restart at 0, which is where torchtitan's document mask separates them);
free space at a row's end is a padding document (id 0, label ignored), so it
never touches real tokens under the document mask. This is what torchtitan's
own trainer consumes, with one optimizer step per yielded batch: the gradient
accumulation steps of the run must be 1.

Samples longer than ``training.seq_len`` (or ``dataloader.max_len``) go
through the same over-length policy and accounting as Skrull's loader
(overlength.py); the policy is 'error' unless the trainer sets it
(``set_overlength``, from ``skrull.overlength``).
"""

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torchtitan.components.tokenizer import BaseTokenizer

from skrull_ext.datasets.accounting import RunAccount
from skrull_ext.datasets.overlength import length_limit, limit_step
from skrull_ext.datasets.row_layout import PACKINGS
from skrull_ext.datasets.source import SourceDataLoaderBase
from skrull_ext.datasets.synthetic import IGNORE_INDEX


class PackedDataLoader(SourceDataLoaderBase):
    @dataclass(kw_only=True, slots=True)
    class Config(SourceDataLoaderBase.Config):
        pass

    def __init__(
        self,
        config: Config,
        *,
        dp_world_size: int,
        dp_rank: int,
        tokenizer: BaseTokenizer | None = None,
        seq_len: int,
        local_batch_size: int,
        **kwargs,
    ):
        super().__init__(config, tokenizer)
        self.dp_world_size = dp_world_size
        self.dp_rank = dp_rank
        self.seq_len = seq_len
        self.local_batch_size = local_batch_size
        self.account = RunAccount()
        self.last_samples: list[int] = []
        """Source indices trained by the last batch (what a failed step names)."""
        self.row_multiple = 1
        """Rows of the 'stream' packing are a multiple of this long (the trainer sets CP x 128)."""
        self.set_overlength("error")

    def set_overlength(self, mode: str) -> None:
        """The over-length policy for samples longer than a row (or max_len)."""
        self.limit = length_limit(self.seq_len, f"training.seq_len {self.seq_len}", mode, self.config.max_len)

    def state_dict(self) -> dict:
        return {"step": self.step, **self.account.state_dict()}

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        self.account.load_state_dict(state_dict)

    def __iter__(self) -> Iterator[tuple[dict[str, torch.Tensor], torch.Tensor]]:
        while True:
            yield self._pack(self.next_global_batch())

    def _pack(self, indices: list[int]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        self.last_samples, samples, _ = limit_step(self.limit, indices, self.source, self.step, self.account)
        layout = PACKINGS[self.config.packing](
            [s.length for s in samples], dp=self.dp_world_size, local_batch_size=self.local_batch_size,
            seq_len=self.seq_len, multiple=self.row_multiple,
        )
        B, S = len(layout.rows) // self.dp_world_size, layout.row_len
        inputs = torch.zeros(B, S, dtype=torch.long)
        labels = torch.full((B, S), IGNORE_INDEX, dtype=torch.long)
        positions = torch.zeros(B, S, dtype=torch.long)
        for b, row in enumerate(layout.rows[self.dp_rank * B : (self.dp_rank + 1) * B]):
            off = 0
            for k, start, end in row:
                s, n = samples[k], end - start
                inputs[b, off : off + n] = s.input[start:end]
                labels[b, off : off + n] = s.labels[start:end]
                positions[b, off : off + n] = torch.arange(n)
                off += n
            positions[b, off:] = torch.arange(S - off)
        return {"input": inputs, "positions": positions}, labels
