"""Simulator: predict iteration time, memory and traffic of scheduling policies.

Pieces, one concern each:

- scenarios.py  named job shapes: the paper's evaluation settings
- datasets.py   length streams: real files and the paper's Table 1 distributions
- packing.py    cluster Shape and Plan builders for the non-core policies
- chunkflow.py  ChunkFlow-style chunk plans
- bound.py      lower bound on an iteration's time
- policies.py   the policy registry (baseline ... skrull, bound)
- metrics.py    per-iteration figures of a plan
- simulator.py  the loop over global batches

The cost model is the core's (``skrull_ext._core.CostModel``); nothing here
re-implements it. Entry point for users: ``python -m skrull_ext.bench simulate``.
"""

from skrull_ext.sim.packing import Shape
from skrull_ext.sim.policies import SIM_POLICIES
from skrull_ext.sim.simulator import Scenario, ScenarioResult, simulate

__all__ = ["SIM_POLICIES", "Scenario", "ScenarioResult", "Shape", "simulate"]
