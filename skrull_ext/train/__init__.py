"""The torchtitan integration: ``python -m skrull_ext.train`` and what it is made of.

- ``__main__``: the entry point (torchtitan's ``train.py`` with skrull-ext's config manager);
- ``job_file``, ``job_flags``, ``skrull_config``, ``config_registry``: a job TOML and its
  ``--section.key`` flags into a torchtitan ``Trainer.Config`` (``[skrull]`` is ``SkrullConfig``),
  and the named configs for torchtitan's own ``--module skrull_ext.train --config NAME``;
- ``job_checks``, ``resume_checks``: a whole job checked before any model is built;
  ``tensor_parallel``: how TP composes with DACP, and the parallelism Skrull refuses (PP);
- ``job_config``: every job's config (``JobConfig``, whose ``build()`` picks the trainer by
  ``skrull.enable``); ``trainer``: ``SkrullTrainer``, torchtitan's Trainer fed by the
  scheduling dataloader; ``packed_trainer``: ``PackedTrainer``, torchtitan's own batching
  for ``skrull.enable = false``; ``job_trainer``: ``JobTrainer``, what both share;
  ``free_running``, ``validation``, ``watchdog``, ``step_checks``, ``plan_log``: their parts.

torchtitan's own behaviour is changed only in the top-level ``torchtitan_patches``.
"""
