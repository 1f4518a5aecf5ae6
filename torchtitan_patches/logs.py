"""What torchtitan logs, said once: from the ranks a user asked for, and
without torchtitan 0.3.0's warning about its own default.

Ranks: under torchrun every rank logs every line, so the README's 2-process
command printed each line twice. torchtitan's ``run_train.sh`` shows one rank
(``LOG_RANK``, default 0, passed to ``torchrun --local-ranks-filter``); here
``LOG_RANK`` names the global ranks whose info and warnings print
(comma-separated, default ``0``; ``all`` for every rank). The other ranks
print neither those nor Python warnings, but still print their errors,
prefixed ``[rank N]``, so a failure on one rank is never hidden.

Noise: torchtitan 0.3.0's ``CheckpointManager.Config.__post_init__`` warns
"initial_load_model_only=True has no effect without an initial_load_path"
for every config without an initial load path, though ``True`` is its own
default, and again for every copy of the config (a ``[model] hf_path`` job
built its config several times, warning each time, and its weights did
load). Its ``ConfigManager`` warns "HF assets path  does not exist!" for
the empty path skrull-ext's jobs set (``job_file.base_config``; a ``[model]
hf_path`` job names its folder). Under torchrun, which always sets
``TORCH_NCCL_ASYNC_ERROR_HANDLING=1``, its process-group set-up warns on every
launch that it overrides that to 3 (what it always does, for its flight
recorder). All three dropped. On CPU (no accelerator to
rate) its "Peak FLOPS used for computing MFU: nan" is dropped too (the step
line says ``mfu: N/A``), and torch's warnings that DTensor random ops and
``manual_seed`` "may not have complete support on cpu device mesh": the CPU
runs draw their init bit for bit alike (test_reproducible.py), and LoRA's
adapters draw from their own generator (lora/converter.py).

``install()`` is idempotent; ``skrull_ext.train`` calls it after
``init_logger`` and ``JobTrainer`` again (for ``torchtitan.train``).
"""

from __future__ import annotations

import logging
import os
import warnings

from torchtitan.tools.logging import logger

__all__ = ["NOISE", "RankFilter", "install", "shown_ranks"]

NOISE = ("initial_load_model_only=True has no effect without an initial_load_path",
         "HF assets path  does not exist!", "Peak FLOPS used for computing MFU: nan",
         "ENV[TORCH_NCCL_ASYNC_ERROR_HANDLING] = 1 will be overridden to 3")
"""Starts of torchtitan messages that never describe the run (see the module docstring)."""


def shown_ranks(value: str | None) -> set[int] | None:
    """``LOG_RANK`` as a set of ranks (None: every rank); an unreadable value shows rank 0."""
    value = (value or "0").strip()
    if value.lower() == "all":
        return None
    try:
        return {int(r) for r in value.split(",") if r.strip()}
    except ValueError:
        return {0}


class RankFilter(logging.Filter):
    """Drops NOISE; on a rank not shown, drops what is below ERROR and prefixes the rest."""

    def __init__(self, rank: int, shown: set[int] | None):
        super().__init__()
        self.rank = rank
        self.quiet = shown is not None and rank not in shown

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and record.msg.startswith(NOISE):
            return False
        if not self.quiet:
            return True
        if record.levelno < logging.ERROR:
            return False
        if isinstance(record.msg, str) and not record.msg.startswith("[rank "):
            record.msg = f"[rank {self.rank}] {record.msg}"
        return True


def install() -> None:
    """Put the filter on torchtitan's logger (the root logger), once per process."""
    if any(isinstance(f, RankFilter) for f in logger.filters):
        return
    rank = int(os.environ.get("RANK", "0"))
    rank_filter = RankFilter(rank, shown_ranks(os.environ.get("LOG_RANK")))
    logger.addFilter(rank_filter)
    warnings.filterwarnings("ignore", message=r"DTensor (random operators|manual_seed\(\)) may not have complete "
                                              r"support on cpu device mesh")
    if rank_filter.quiet:  # Python warnings too (torch's DTensor ones are the same on every rank)
        logging.captureWarnings(True)
        logging.getLogger("py.warnings").addFilter(rank_filter)
