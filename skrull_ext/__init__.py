"""skrull-ext: Skrull dynamic data scheduling for long-context SFT on torchtitan.

The scheduler core (cost model, DACP, GDS) is C++ in ``skrull_ext._core``;
this package wraps it with config, plans, the CP-SAT fallback and the
torchtitan integration. The research and measurement tools (``bench``,
``sim``, ``profile``) sit beside the training path and are never imported
by it.

The names below load on first use (PEP 562), so importing one part, e.g.
``skrull_ext.attention``, needs neither the compiled core nor ortools.
"""

import importlib

_LAZY = {
    "DISTRIBUTED": "skrull_ext._core",
    "CostModel": "skrull_ext._core",
    "__version__": "skrull_ext._core",
    "POLICIES": "skrull_ext.scheduler.config",
    "SchedulerConfig": "skrull_ext.scheduler.config",
    "DROPPED": "skrull_ext.scheduler.plan",
    "MicroBatchPlan": "skrull_ext.scheduler.plan",
    "Plan": "skrull_ext.scheduler.plan",
    "PlanError": "skrull_ext.scheduler.plan",
    "Scheduler": "skrull_ext.scheduler.scheduler",
    "SchedulerJob": "skrull_ext.scheduler.job",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'skrull_ext' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
