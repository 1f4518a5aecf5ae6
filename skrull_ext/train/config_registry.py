"""Named configs of skrull-ext, for torchtitan's ``--module/--config`` launcher.

    python -m torchtitan.train --module skrull_ext.train --config skrull_llama3_debugmodel
    torchrun --nproc_per_node 2 -m torchtitan.train --module skrull_ext.train \\
        --config skrull_llama3_debugmodel --parallelism.context_parallel_degree 2

Each function reads a shipped job file (skrull_ext/jobs/*.toml), so the TOML
and the ``--config`` forms describe the same job. ``job_file.base_config`` holds
the defaults every job file starts from.
"""

import os

from torchtitan.config.override import derive
from torchtitan.trainer import Trainer

import torchtitan_patches
from skrull_ext.data.steps.packed import PackedDataLoader
from skrull_ext.train import trainer  # noqa: F401  (registers both trainers: torchtitan's launcher calls build())
from skrull_ext.train.job.job_config import JobConfig
from skrull_ext.train.job.job_file import load_job
from skrull_ext.train.job.usage import JOBS_DIR


def _job(name: str, config_cls: type[Trainer.Config] = JobConfig, **kwargs):
    """Load a shipped job file. The trainer it builds applies the CPU fixes
    (torchtitan_patches) when torchtitan's launcher builds it."""
    return load_job(os.path.join(JOBS_DIR, name), config_cls=config_cls, **kwargs)


def skrull_llama3_debugmodel() -> JobConfig:
    """The embedded default: jobs/debug_cpu.toml."""
    return _job("debug_cpu.toml")


def llama3_debugmodel_cpu() -> Trainer.Config:
    """jobs/debug_cpu.toml as torchtitan's own Trainer (no [skrull] section):
    the baseline Skrull runs are compared with."""
    config = _job("debug_cpu.toml", config_cls=Trainer.Config, ignore=("skrull",))
    config.dataloader = derive(config.dataloader, PackedDataLoader.Config)
    # torchtitan.train calls this function before it builds anything, and its
    # own Trainer has no other hook for the CPU fixes.
    torchtitan_patches.apply(config)
    return config


def skrull_qwen2_5_0_5b() -> JobConfig:
    """jobs/qwen2_5_0_5b_gpu.toml: the paper's small model on one GPU node."""
    return _job("qwen2_5_0_5b_gpu.toml")
