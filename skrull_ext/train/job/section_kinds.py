"""The classes a section's ``kind`` key selects in a job file or flag (``[dataloader] kind =
"packed"``, ``--activation_checkpoint.kind full``): job_file.py reads them, ``--help`` lists
them (job_help.py), and ``mode_of`` names a job's activation-checkpointing mode by them (for
train/checkpointing.py and the job checks)."""

from __future__ import annotations

from typing import Any

from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

from skrull_ext.data.sources.tokenizer import LocalTokenizer, SyntheticTokenizer
from skrull_ext.data.steps.loader import SkrullDataLoader
from skrull_ext.data.steps.packed import PackedDataLoader

__all__ = ["AC_KINDS", "SECTION_KINDS", "mode_of", "register_kind"]

AC_KINDS: dict[str, Any] = {"selective": SelectiveAC.Config, "full": FullAC.Config, "none": None}
"""``[activation_checkpoint] kind`` -> torchtitan's config class (None: off)."""


def mode_of(ac: Any) -> str | None:
    """The mode of a job's ``config.activation_checkpoint`` (None: a kind no profile measures,
    e.g. torchtitan's memory-budget)."""
    for mode, cls in AC_KINDS.items():
        if (ac is None) if cls is None else type(ac) is cls:
            return mode
    return None

SECTION_KINDS: dict[str, dict[str, Any]] = {
    "dataloader": {"packed": PackedDataLoader.Config, "skrull": SkrullDataLoader.Config},
    "tokenizer": {"synthetic": SyntheticTokenizer.Config, "hf": LocalTokenizer.Config},
    "activation_checkpoint": dict(AC_KINDS),
}
"""Per section, the classes a ``kind`` key may select (None disables it)."""


def register_kind(section: str, kind: str, config_cls: Any) -> None:
    """Let ``[section] kind = "<kind>"`` select ``config_cls``."""
    SECTION_KINDS.setdefault(section, {})[kind] = config_cls
