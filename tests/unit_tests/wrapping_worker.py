"""Build the trainer's model and the profile's for one job in this process, a world of one,
and print how each is wrapped (profile/model.py ``wrapping``) as one JSON line.

    python tests/unit_tests/wrapping_worker.py DUMP_FOLDER --config-file JOB.toml [job flags]

The trainer first (torchtitan's Trainer initializes the process group of one rank, which the
profile's build then finds), built by ``config.build()`` as both launchers build it."""

import json
import sys

import torch

import skrull_ext.train.trainer  # noqa: F401  (registers the trainers with the job's config)
from skrull_ext.profile.model import build_job_model, wrapping
from skrull_ext.train.job.job_file import JobConfigManager, load_config


def main() -> None:
    dump, flags = sys.argv[1], sys.argv[2:]
    trainer = JobConfigManager().parse_args([*flags, "--dump_folder", dump]).build()
    try:
        built = wrapping(trainer.model_parts[0])
    finally:
        trainer.close()
    jm = build_job_model(load_config(flags, module="skrull_ext.profile"), torch.device("cpu"), 64)
    print(json.dumps({"trainer": built, "profile": wrapping(jm.model)}))


if __name__ == "__main__":
    main()
