"""torchtitan-format batches of the sources' global batches (the baseline).

Each step's global batch is packed, in caller order and without splitting a
sequence, into ``dp_world_size * local_batch_size`` rows of ``seq_len``
tokens; DP rank r gets rows [r*B, (r+1)*B). Free space at a row's end is a
padding document (id 0, label ignored, positions restarting at 0), so it
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
from skrull_ext.datasets.source import SourceDataLoaderBase
from skrull_ext.datasets.synthetic import IGNORE_INDEX


def pack_rows(
    lengths: list[int], rows: int, seq_len: int
) -> list[list[int]]:
    """First-fit positions of sequences into rows, in caller order.

    Returns, per row, the indices (into ``lengths``) it holds. Raises
    ValueError when the batch does not fit, naming the sizes involved.
    """
    free = [seq_len] * rows
    out: list[list[int]] = [[] for _ in range(rows)]
    for k, n in enumerate(lengths):
        row = next((r for r in range(rows) if free[r] >= n), None)
        if row is None:
            raise ValueError(
                f"global batch ({sum(lengths)} tokens, longest {max(lengths)}) "
                f"does not fit {rows} rows of seq_len={seq_len}; raise "
                "training.seq_len or training.local_batch_size, or lower "
                "dataloader.max_len / global_batch_size"
            )
        out[row].append(k)
        free[row] -= n
    return out


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
        B, S = self.local_batch_size, self.seq_len
        self.last_samples, samples, _ = limit_step(self.limit, indices, self.source, self.step, self.account)
        rows = pack_rows([s.length for s in samples], self.dp_world_size * B, S)
        inputs = torch.zeros(B, S, dtype=torch.long)
        labels = torch.full((B, S), IGNORE_INDEX, dtype=torch.long)
        positions = torch.zeros(B, S, dtype=torch.long)
        for b, row in enumerate(rows[self.dp_rank * B : (self.dp_rank + 1) * B]):
            off = 0
            for k in row:
                s = samples[k]
                inputs[b, off : off + s.length] = s.input
                labels[b, off : off + s.length] = s.labels
                positions[b, off : off + s.length] = torch.arange(s.length)
                off += s.length
            positions[b, off:] = torch.arange(S - off)
        return {"input": inputs, "positions": positions}, labels
