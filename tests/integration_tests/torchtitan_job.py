"""Any job file as torchtitan's own Trainer, for torchtitan's launcher:

    SKRULL_TEST_JOB=/abs/job.toml torchrun ... -m torchtitan.train \\
        --module tests.integration_tests.torchtitan_job --config job_file_torchtitan

The reference a Skrull run of the same job file is compared with, as
``skrull_ext.train.config_registry.llama3_debugmodel_cpu`` is for the shipped
debug job: no ``[skrull]`` section, the same data packed into torchtitan's
rows, torchtitan's Trainer and train step. A ``[model] hf_path`` job starts
from its HF folder as the Skrull run does (skrull_ext/hf/job.py). The job
path comes from the environment because torchtitan's ``--config`` names a
function, which takes no arguments.
"""

import os

from torchtitan.config.override import derive
from torchtitan.trainer import Trainer

import torchtitan_patches
from skrull_ext.data.steps.packed import PackedDataLoader
from skrull_ext.train.job.job_file import load_job

JOB_ENV = "SKRULL_TEST_JOB"


def job_file_torchtitan() -> Trainer.Config:
    config = load_job(os.environ[JOB_ENV], config_cls=Trainer.Config, ignore=("skrull",))
    config.dataloader = derive(config.dataloader, PackedDataLoader.Config)
    torchtitan_patches.apply(config)  # torchtitan's Trainer has no other hook for the CPU fixes
    return config
