"""The classes a section's ``kind`` key selects in a job file or flag (``[dataloader] kind =
"packed"``, ``--activation_checkpoint.kind full``): job_file.py reads them, ``--help`` lists
them (job_help.py), and train/checkpointing.py names a job's activation-checkpointing mode by
them."""

from __future__ import annotations

from typing import Any

from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

from skrull_ext.data.sources.tokenizer import LocalTokenizer, SyntheticTokenizer
from skrull_ext.data.steps.loader import SkrullDataLoader
from skrull_ext.data.steps.packed import PackedDataLoader

__all__ = ["AC_KINDS", "SECTION_KINDS", "register_kind"]

AC_KINDS: dict[str, Any] = {"selective": SelectiveAC.Config, "full": FullAC.Config, "none": None}
"""``[activation_checkpoint] kind`` -> torchtitan's config class (None: off)."""

SECTION_KINDS: dict[str, dict[str, Any]] = {
    "dataloader": {"packed": PackedDataLoader.Config, "skrull": SkrullDataLoader.Config},
    "tokenizer": {"synthetic": SyntheticTokenizer.Config, "hf": LocalTokenizer.Config},
    "activation_checkpoint": dict(AC_KINDS),
}
"""Per section, the classes a ``kind`` key may select (None disables it)."""


def register_kind(section: str, kind: str, config_cls: Any) -> None:
    """Let ``[section] kind = "<kind>"`` select ``config_cls``."""
    SECTION_KINDS.setdefault(section, {})[kind] = config_cls
