"""Entry point: train a skrull-ext job.

    python -m skrull_ext.train --config-file skrull_ext/jobs/debug_cpu.toml
    torchrun --nproc_per_node 4 -m skrull_ext.train \\
        --config-file skrull_ext/jobs/debug_cpu.toml \\
        --parallelism.data_parallel_shard_degree 2 --parallelism.context_parallel_degree 2

CLI flags (torchtitan's ``--section.field value``, plus ``--skrull.*``)
override the job file. ``--module/--config`` work as in torchtitan.train.
This mirrors torchtitan/train.py's main(); only the config manager differs,
a config or data error is one line from rank 0 (``cli_errors``), Ctrl-C
ends in one line saying where the run stopped (``interrupt``), and the
log lines come from rank 0 (``LOG_RANK=0,1`` or ``all`` for more; other
ranks print their errors: ``torchtitan_patches/logs.py``).
"""

import os
import sys

from skrull_ext.train.job.usage import exit_without_job

MODULE = "skrull_ext.train"
"""This entry point, as its usage and ``--help`` name it (the job layer below names none)."""

if __name__ == "__main__":
    exit_without_job(sys.argv[1:], MODULE)  # --help or no job: the usage before torch is imported (seconds)

import torch  # noqa: E402

from torchtitan_patches import compat

compat.install_import_shims()  # before torchtitan is imported (torch 2.11-2.12)

from torchtitan.tools.logging import init_logger, logger  # noqa: E402

from skrull_ext.cli_errors import run_cli  # noqa: E402
from skrull_ext.train import interrupt  # noqa: E402
from skrull_ext.train.allocator import allocator_line, use_expandable_segments  # noqa: E402
from skrull_ext.train.job.job_file import load_config  # noqa: E402
from skrull_ext.train import trainer  # noqa: E402, F401  (registers both trainers: config.build())
from torchtitan_patches import logs  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    allocator = use_expandable_segments()  # before the first CUDA allocation (allocator.py)
    init_logger()
    logs.install()  # rank 0's lines only (LOG_RANK), without torchtitan's default-value warning
    if (line := allocator_line(allocator)) is not None:
        logger.info(line)
    config = load_config(sys.argv[1:] if argv is None else argv, module=MODULE)

    trainer = None
    try:
        trainer = config.build()
        if config.checkpoint.create_seed_checkpoint:
            if int(os.environ["WORLD_SIZE"]) != 1:
                raise ValueError("create the seed checkpoint with a single process")
            if not config.checkpoint.enable:
                raise ValueError("--checkpoint.create_seed_checkpoint needs --checkpoint.enable")
            trainer.checkpointer.save(curr_step=0, last_step=True)
            logger.info("Created seed checkpoint")
        else:
            trainer.train()
    except Exception:
        if trainer:
            trainer.close()
        raise
    else:
        trainer.close()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


if __name__ == "__main__":
    interrupt.install()  # Ctrl-C: one line saying where the run stopped, no traceback
    run_cli(main)
