"""skrull-ext: Skrull dynamic data scheduling for long-context SFT on torchtitan.

The scheduler core (cost model, DACP, GDS) is C++ in ``skrull_ext._core``;
this package wraps it with config, plans, the CP-SAT fallback, the
benchmark and the torchtitan integration.
"""

from skrull_ext._core import DISTRIBUTED, CostModel, __version__
from skrull_ext.config import POLICIES, SchedulerConfig
from skrull_ext.plan import DROPPED, MicroBatchPlan, Plan, PlanError
from skrull_ext.scheduler import Scheduler

__all__ = [
    "DISTRIBUTED",
    "DROPPED",
    "POLICIES",
    "CostModel",
    "MicroBatchPlan",
    "Plan",
    "PlanError",
    "Scheduler",
    "SchedulerConfig",
    "__version__",
]
