"""The torchtitan integration: ``python -m skrull_ext.train`` and what it is made of.

- ``__main__``: the entry point (torchtitan's ``train.py`` with skrull-ext's config manager);
- ``job/``: a job as the user writes it, below the trainers (it imports nothing of train/):
  ``job_file``, ``job_flags``: a job TOML and its ``--section.key`` flags into a torchtitan
  ``Trainer.Config``; ``section_kinds``: what a section's ``kind`` selects; its sections
  ``skrull_config`` (``[skrull]``), ``loss_config``, ``validation_config``, ``comm_config``;
  ``job_help``, ``usage``: ``--help`` from the parser's own keys, and the usage printed before
  torch loads, naming the entry point that asks; ``job_checks``, ``resume_checks``,
  ``tensor_parallel`` (how TP composes with DACP, and the parallelism Skrull refuses: PP): a
  whole job checked before any model is built; ``job_config``: every job's config
  (``JobConfig``, whose ``build()`` builds the trainer registered for ``skrull.enable``);
- ``config_registry``: the named configs for torchtitan's own ``--module skrull_ext.train
  --config NAME``;
- ``trainer``: ``SkrullTrainer``, torchtitan's Trainer fed by the scheduling dataloader
  (this module registers both trainers with ``JobConfig``); ``packed_trainer``:
  ``PackedTrainer``, torchtitan's own batching for ``skrull.enable = false``;
  ``job_trainer``: ``JobTrainer``, what both share;
  ``free_running``, ``validation``, ``watchdog``, ``step_checks``, ``step_phases`` (a step
  timed by phase), ``plan_log``,
  ``doc_flops`` (document-aware FLOPs), ``head_loss`` (the head and loss in chunks), ``head_grad``
  (their gradients computed in forward), ``chunked``
  (a document trained in chunks): their parts;
- ``settle``, ``execution``: the Skrull job settled once at start-up (lockstep or
  free-running, BucketSize, timeline, look-ahead width);
- ``allocator``, ``compile_limit``: the CUDA allocator's settings and dynamo's recompile
  limit for a run; ``run_lock``, ``launcher_watch``, ``interrupt``, ``stop_line``: how a run
  stops (the dump folder's lock, a dead launcher, Ctrl-C, the last line).

torchtitan's own behaviour is changed only in the top-level ``torchtitan_patches``.
"""
