"""The scheduler: what each rank runs in a global batch, decided alike on every rank.

- ``config``: the scheduling knobs (``SchedulingOptions``, checked once), ``SchedulerConfig`` (the same
  as plain values, for library users), the policies and the timelines;
- ``job``: ``SchedulerJob``, a job's scheduling resolved once (BucketSize, Policy, timeline, execution,
  capacity, cost model, the core's options): what the Scheduler, its plans and the dataloader read;
- ``capacity``: what a job's ranks hold, and the longest sequence a plan trains whole;
- ``cost_model``, ``profile_file``, ``model_shape``: what a micro-batch costs (named presets,
  measured profile files, the shape of the job's model), and ``hardware/`` the assumed H100;
- ``scheduler``: ``Scheduler``, the C++ core (``skrull_ext._core``) plus the CP-SAT fallback (``cpsat``);
- ``plan``: the one plan type it returns (slots x rank sets), with its summaries; ``plan_check`` its
  invariants;
- ``first_fit``: first-fit bin packing in O(log bins) an item (torchtitan's 'rows' batching, ChunkFlow's plan).

Nothing here but model_shape.py (the job's dtypes) imports torch: the plan is a pure function of the lengths, the
cost model and the options. ``Scheduler`` loads on first use (PEP 562), and
ortools only when CP-SAT first solves (a job without ``cpsat`` never imports it).
"""

import importlib

_LAZY = {"Scheduler": "skrull_ext.scheduler.scheduler"}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'skrull_ext.scheduler' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value
