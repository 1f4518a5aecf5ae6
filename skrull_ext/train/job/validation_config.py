"""``[validation]``: the held-out set a Skrull job evaluates every N steps and at the end.

The section as the job file sets it, which ``JobConfig`` holds; the run that reads it (the
held-out batches, their loss, the best step's folder) is train/validation.py.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from skrull_ext.data.sources.formats import FORMATS


@dataclass(kw_only=True, slots=True)
class ValidationConfig:
    enable: bool = False
    """Evaluate the loss of a held-out set every ``freq`` steps and at the last step (Skrull jobs)."""
    dataset: Literal[("", "jsonl", "hf", "synthetic")] = ""  # pyrefly: ignore[invalid-literal]
    """The held-out data's kind (jsonl, hf, synthetic); '': the training data's (jsonl for a mixture)."""
    dataset_path: str = ""
    """The held-out file (a shipped name, a file, or for hf a folder); read with the training data's
    options (format, columns, chat_template, ...) unless ``format`` says otherwise."""
    split: str = "validation"
    """hf: the held-out split of a folder or DatasetDict."""
    format: Literal[("", "auto", *FORMATS)] = ""  # pyrefly: ignore[invalid-literal]
    """The held-out records' format (as dataloader.format); '': the training data's."""
    freq: int = 0
    """Evaluate every this many steps (and at the last); 0: at the last step only."""
    samples: int = 0
    """Evaluate the first this many held-out samples; 0: all (one pass over the file; synthetic needs it set)."""
    global_batch_size: int = 0
    """Samples per validation batch, planned as one global batch; 0: dataloader.global_batch_size."""
    keep_best: bool = False
    """Write the model of the step with the lowest validation loss to ``<dump_folder>/best_validation``
    (a HF folder: weights in checkpoint.export_dtype, config.json, tokenizer; validation.json says its step)."""

    def __post_init__(self):
        for name in ("freq", "samples", "global_batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"validation.{name}: {value!r} must be an integer >= 0")

    def due(self, step: int, last_step: int) -> bool:
        """Whether ``step`` is evaluated: every ``freq`` steps and the last."""
        return self.enable and (step == last_step or (self.freq > 0 and step % self.freq == 0))

    def kind(self, dataloader) -> str:
        """The held-out data's dataset kind: ``dataset``, else the training data's (jsonl for a mixture)."""
        return self.dataset or ("jsonl" if dataloader.dataset == "mixture" else dataloader.dataset)

    def source_config(self, dataloader):
        """The training dataloader's config pointed at the held-out data."""
        changes = {"dataset": self.kind(dataloader), "dataset_path": self.dataset_path, "split": self.split}
        if self.format:
            changes["format"] = self.format
        if hasattr(dataloader, "sources"):  # a mixture's sources are training data only
            changes["sources"] = []
        return dataclasses.replace(dataloader, **changes)
