"""A job file with a LoRA linear as its model's head, for the launcher's ``--module/--config``:

    SKRULL_TEST_JOB=/abs/job.toml torchrun ... -m skrull_ext.train \\
        --module tests.integration_tests.lora_head_job --config job_file_lora_head

A job file puts an adapter on the head with ``lm_head`` in ``[lora] target_modules`` (on a model
whose head is not its embedding); a model spec built in Python can put one of any LoRA class
there, on any model (torchtitan's own LoRAConverter with every Linear a target does). This one is
the job file's model with ``[lora]``'s default adapters in its layers and ``cls`` (skrull_ext's
DropoutLoRALinear unless told) as its head, to run the head in chunks through the real trainer
(train/head_loss.py). No adapter folder is written (its ``[lora]`` does not name the head). The
job path comes from the environment, as for tests/integration_tests/torchtitan_job.py.
"""

import dataclasses
import os

from skrull_ext.lora import LoRAConfig, with_lora
from skrull_ext.lora.converter import DropoutLoRALinear
from skrull_ext.train.job.job_file import load_job
from tests.integration_tests.torchtitan_job import JOB_ENV


def lora_head(base, lora: LoRAConfig, cls=DropoutLoRALinear, **extra):
    """``base`` (the head's Linear config) as a LoRA linear's config of ``cls`` with ``lora``'s rank and
    alpha (``extra``: e.g. DropoutLoRALinear's dropout)."""
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base) if f.init}
    return cls.Config(**fields, rank=lora.rank, alpha=lora.alpha, **extra)


def job_file_lora_head():
    config = load_job(os.environ[JOB_ENV])
    config.lora = LoRAConfig(enable=True, save_adapter=False)
    spec = with_lora(config.model_spec, config.lora)
    spec.model.lm_head = lora_head(spec.model.lm_head, config.lora)
    config.model_spec = spec  # apply_lora finds it converted with config.lora: nothing more to do
    return config
