"""The simulation loop: global batches in dataset order, every policy on each.

    result = simulate(Scenario("chatqa2", "qwen2.5-0.5b", Shape(4, 8, 64, 26624)),
                      policies=["baseline", "skrull", "bound"], iterations=20, seed=0)

Iteration i takes samples [i*G, (i+1)*G) of the dataset's stream
(G = DP x BatchSize), truncates sequences longer than a CP group can hold
(counted in the result; the same data reaches every policy, except that a
pool policy (skrull-pool) sees them truncated only beyond what the whole
DP x CP world holds, counted per policy, and a whole policy (skrull+chunk,
chunkflow+whole) sees none cut), and asks each
policy for a plan. A policy that regroups samples across global batches
(sorted) sees its own regrouping of the same samples. Plans are checked with ``Plan.validate()`` unless they
overflow the capacity, in which case they are counted, never dropped.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from skrull_ext import _core
from skrull_ext._core import CostModel
from skrull_ext.scheduler import cost_model as cost_models
from skrull_ext.scheduler.profile_file import Profile
from skrull_ext.sim import bound, datasets, metrics
from skrull_ext.sim import policies as sim_policies
from skrull_ext.sim.packing import Shape


@dataclass(frozen=True)
class Scenario:
    dataset: str
    model: str
    shape: Shape
    capacity: int | None = None
    """Tokens a rank really holds, for the overflow check; None = BucketSize."""

    def __post_init__(self) -> None:
        if self.capacity is not None and (not isinstance(self.capacity, int) or self.capacity < 1):
            raise ValueError(f"capacity must be a positive integer, got {self.capacity!r}")

    @property
    def key(self) -> str:
        s = self.shape
        return f"{self.dataset}/{self.model}/dp{s.dp}-cp{s.cp}-bs{s.batch_size}-C{s.bucket_size}"


@dataclass
class ScenarioResult:
    scenario: Scenario
    profile: str
    iterations: int
    seed: int
    sequences: int = 0
    truncated: int = 0
    """Sequences longer than a CP group holds (truncated for every policy but the pool ones)."""
    truncated_by_policy: dict[str, int] = field(default_factory=dict)
    per_policy: dict[str, list[metrics.IterationMetrics]] = field(default_factory=dict)
    bounds_us: list[float] = field(default_factory=list)
    """Per iteration, the bound of the job's global batch on the scenario's timeline
    (``bound.lower_bound_us``: on lockstep the lockstep-aware one where it is the larger)."""
    classic_bounds_us: list[float] = field(default_factory=list)
    """Per iteration, the classic bound of the job's global batch (``bound.classic_bound_us``)."""
    regrouped: set[str] = field(default_factory=set)
    """Policies that regroup samples across global batches (sorted): their iteration i is not the job's."""
    whole: set[str] = field(default_factory=set)
    """Policies that plan every sequence whole (``overlength = "chunk"``): more work than the cut batches;
    their gaps are to the bound of the whole sequences (``IterationMetrics.bound_us``)."""
    over_limit: int = 0
    """Sequences longer than a CP group holds: what the whole policies train in chunks."""

    def mean_time_us(self, policy: str) -> float:
        return statistics.fmean(m.time_us for m in self.per_policy[policy])

    def speedup(self, policy: str, over: str) -> float:
        """Speedup of the average iteration time (the paper's figure)."""
        return self.mean_time_us(over) / self.mean_time_us(policy)

    def gap_to_bound(self, policy: str, classic: bool = False) -> float:
        """Mean over iterations of time / bound - 1, every policy against the bound of the job's
        global batch (``bounds_us``, or ``classic_bounds_us``), so a lower gap is a faster policy.
        A policy that regroups samples across batches has no iteration i of the job's: its mean time
        over the mean bound - 1. Below 0 where a policy does what the bound rules out (sorted's
        regrouping, skrull-pool's sets over several CP groups)."""
        if policy in self.whole:
            return self.gap_to_own_bound(policy)
        bounds = self.classic_bounds_us if classic else self.bounds_us
        ms = self.per_policy[policy]
        if policy in self.regrouped:
            return self.mean_time_us(policy) / statistics.fmean(bounds) - 1.0 if any(bounds) else 0.0
        return statistics.fmean(m.time_us / b - 1.0 for m, b in zip(ms, bounds) if b > 0)

    def gap_to_own_bound(self, policy: str) -> float:
        """Mean over iterations of time / the bound of the batch the policy planned (``IterationMetrics.bound_us``:
        a pool policy's is ``bound.pool_lower_bound_us``, the bound every pool plan obeys) - 1."""
        return statistics.fmean(m.time_us / m.bound_us - 1.0 for m in self.per_policy[policy] if m.bound_us > 0)


def global_batches(dataset: str, shape: Shape, iterations: int, seed: int,
                   limit: int | None = None) -> tuple[list[list[int]], int]:
    """Global batches in dataset order, truncated to `limit` (default: what a CP group holds), and how many were
    truncated."""
    g = shape.global_batch
    stream = datasets.get(dataset).stream(g * iterations, seed)
    limit = shape.max_length if limit is None else limit
    truncated = sum(s > limit for s in stream)
    stream = [min(s, limit) for s in stream]
    return [stream[i * g : (i + 1) * g] for i in range(iterations)], truncated


def simulate(
    scenario: Scenario,
    policies: Sequence[str],
    iterations: int,
    seed: int = 0,
    profile: Profile | None = None,
    cost: CostModel | None = None,
    on_iteration: Callable[[], None] | None = None,
    validate: bool = True,
    on_policy: Callable[[str], None] | None = None,
) -> ScenarioResult:
    """Predict every iteration of `scenario` under each policy. ``on_iteration`` is called after
    each iteration, ``on_policy`` with each policy's name before it plans one (progress inside an
    iteration: at DP 128 x CP 8 with 2,048 sequences a DP rank an iteration takes a minute)."""
    profile = profile if profile is not None else cost_models.hardware()
    cost = cost if cost is not None else profile.cost_model(cost_models.shape(scenario.model), repr(scenario.model))
    chosen = [sim_policies.get(p) for p in policies]
    capacity = scenario.capacity or scenario.shape.bucket_size
    batches, truncated = global_batches(scenario.dataset, scenario.shape, iterations, seed)
    result = ScenarioResult(scenario, profile.label, iterations, seed,
                            sequences=sum(map(len, batches)), truncated=truncated)
    shape = scenario.shape
    world_batches, world_truncated = batches, truncated
    if any(p.world for p in chosen):
        world_batches, world_truncated = global_batches(
            scenario.dataset, shape, iterations, seed, shape.capacity(pool=True).limit)
    whole_batches = batches
    if any(p.whole for p in chosen):
        whole_batches, _ = global_batches(scenario.dataset, shape, iterations, seed, _core.MAX_LENGTH)
        result.over_limit = truncated  # the same sequences the others cut
    own = {}
    for p in chosen:
        mine = world_batches if p.world else whole_batches if p.whole else batches
        own[p.name] = p.regroup(mine, seed, cost, shape) if p.regroup else mine
        result.truncated_by_policy[p.name] = world_truncated if p.world else 0 if p.whole else truncated
        if p.whole:
            result.whole.add(p.name)
    for p in chosen:
        result.per_policy[p.name] = []
        if p.regroup:
            result.regrouped.add(p.name)
    for i in range(iterations):
        job = batches[i]
        result.classic_bounds_us.append(bound.classic_bound_us(job, cost, shape.dp, shape.cp, shape.bucket_size))
        result.bounds_us.append(bound.lower_bound_us(job, cost, shape.dp, shape.cp, shape.bucket_size, shape.timeline))
        for p in chosen:
            if on_policy is not None:
                on_policy(p.name)
            batch = own[p.name][i]
            lb = (bound.pool_lower_bound_us(batch, cost, shape.dp, shape.cp, shape.bucket_size) if p.pool else
                  bound.classic_bound_us(batch, cost, shape.dp, shape.cp, shape.bucket_size) if p.whole else
                  bound.lower_bound_us(batch, cost, shape.dp, shape.cp, shape.bucket_size, shape.timeline))
            if p.is_bound:
                result.per_policy[p.name].append(metrics.IterationMetrics(time_us=lb, bound_us=lb))
                continue
            out = p.plan(batch, cost, shape, seed * 1_000_003 + i)
            m = metrics.of_plan(out, cost, capacity, lb)
            if validate and m.overflow == 0:
                out.validate()
            result.per_policy[p.name].append(m)
        if on_iteration is not None:
            on_iteration()
    return result
