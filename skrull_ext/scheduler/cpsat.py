"""Exact DACP for one micro-batch with OR-Tools CP-SAT.

The model is docs/design/method.md's optimisation problem: D_k (sequence k sharded) or
P_kj (whole on CP rank j), memory per rank within BucketSize, and the
makespan T >= max(T_comm(V), T_comp(Local_j)) + T_comp(Dist) for every rank,
with T_comm piecewise linear in the exchanged volume. Times are integers in
nanoseconds per layer. Under a host floor (``CostModel.host_floor_us``) a
rank's layer call costs max(floor, max(T_comm, line(Local_j)) + line(Dist)),
the floor once a call (cost_model.hpp ``layer_us``): every rank of a
non-empty micro-batch makes the call, so the floor is one more lower bound on
the makespan.

The solver runs single-threaded under a *deterministic* time limit, so every
rank that solves the same micro-batch gets the same answer without talking.
Callers score the answer with the C++ cost model (``evaluate_placement``)
and keep it only if it predicts faster: rounding here never makes a plan
worse than the heuristic's. Under ``CostModel.whole_buffer`` (a kernel over the
whole buffer, CPU dense) the model still sums FLOPs per document, a relaxation
of that price (a buffer costs at least its documents' sum): its answer is
priced whole by ``evaluate_placement`` like any other.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from skrull_ext import _core
from skrull_ext._core import DISTRIBUTED, CostModel

_NS = 1000.0  # integer time unit: nanoseconds
MAX_PLACEMENT_VARS = 1 << 12
"""The largest model CP-SAT is given: sequences x CP ranks placement variables.
The deterministic limit bounds the search, not building the model and loading
it into the solver, which grow linearly with its size, to seconds at 65,536
variables and far longer under the sanitizers (timed in docs/reliability.md),
where the fallback exists to save microseconds. Beyond this size the heuristic's
placement stands (status ``TOO_LARGE``); it still admits 512 sequences on a
CP group of 8."""


@dataclass
class CpSatResult:
    cp_rank: list[int] | None
    """Placement in the input's order, or None when no solution was found."""
    status: str
    """OPTIMAL, FEASIBLE, INFEASIBLE, UNKNOWN, MODEL_INVALID, or TOO_LARGE (not solved:
    more than MAX_PLACEMENT_VARS placement variables)."""
    objective_us: float | None
    """Model objective (all layers), before re-scoring with the cost model."""
    bound_us: float
    """Proven lower bound on the micro-batch time (all layers)."""
    wall_s: float


def _comm_segments(cost: CostModel, v_max: float) -> list[tuple[float, float, float, float]]:
    """(lo, hi, y_lo, y_hi) linear pieces of cost.comm_us over (0, v_max], bytes -> microseconds.

    Pieces are cut at the threshold and at the table's sizes; on each piece
    comm_us is linear, so two interior evaluations give its ends exactly.
    """
    cuts = {0.0, v_max}
    cuts.update(x for x in [cost.comm.threshold_bytes, *cost.comm.bytes] if 0.0 < x < v_max)
    cuts = sorted(cuts)
    pieces = []
    for lo, hi in zip(cuts, cuts[1:]):
        p1, p2 = lo + (hi - lo) / 3.0, lo + 2.0 * (hi - lo) / 3.0
        g1, g2 = cost.comm_us(p1), cost.comm_us(p2)
        slope = (g2 - g1) / (p2 - p1)
        pieces.append((lo, hi, g1 - slope * (p1 - lo), g2 + slope * (hi - p2)))
    return pieces


def solve_dacp(
    lengths: list[int],
    cost: CostModel,
    cp: int,
    bucket_size: int,
    deterministic_time: float = 0.005,
    hint: list[int] | None = None,
) -> CpSatResult:
    """Minimise the predicted time of one micro-batch exactly (within the limit)."""
    start = time.perf_counter()
    n = len(lengths)
    if n * cp > MAX_PLACEMENT_VARS:
        return CpSatResult(None, "TOO_LARGE", None, 0.0, time.perf_counter() - start)
    layers = cost.shape.layers
    from ortools.sat.python import cp_model  # here: a job without CP-SAT never imports ortools (0.4 s a rank)

    m = cp_model.CpModel()
    # --- data
    flops = [cost.flops(s) for s in lengths]
    shard = [_core.shard_tokens(s, cp) for s in lengths]
    a, b = cost.a_us_per_flop, cost.b_us
    loc_cost = [round(a * f * _NS) for f in flops]
    dist_cost = [round(a * f / cp * _NS) for f in flops]
    b_ns = round(b * _NS)
    floor_ns = round(cost.host_floor_us * _NS)
    # Volume in units of one shard-token's K/V, so it is an exact integer.
    unit = cost.kv_bytes(1)
    vol_units = [sh * cp for sh in shard]
    v_max_units = sum(vol_units)
    segs = _comm_segments(cost, v_max_units * unit) if v_max_units > 0 else []
    comm_max = round(max((max(ya, yb) for _, _, ya, yb in segs), default=0.0) * _NS) + 1
    horizon = sum(loc_cost) + sum(dist_cost) + 2 * b_ns + floor_ns + comm_max + 1
    # --- variables
    dist = [m.NewBoolVar(f"d{k}") for k in range(n)]
    put = [[m.NewBoolVar(f"p{k}_{j}") for j in range(cp)] for k in range(n)]
    has_local = [m.NewBoolVar(f"hl{j}") for j in range(cp)]
    has_dist = m.NewBoolVar("hd")
    volume = m.NewIntVar(0, v_max_units, "volume")
    comm = m.NewIntVar(0, comm_max, "comm")
    makespan = m.NewIntVar(0, horizon, "makespan")
    # --- constraints
    for k in range(n):
        m.AddExactlyOne([dist[k], *put[k]])
        if cp == 1:
            m.Add(dist[k] == 0)
        m.AddImplication(dist[k], has_dist)
        for j in range(cp):
            m.AddImplication(put[k][j], has_local[j])
    for j in range(cp):
        m.Add(sum(put[k][j] for k in range(n)) >= 1).OnlyEnforceIf(has_local[j])
        m.Add(sum(lengths[k] * put[k][j] + shard[k] * dist[k] for k in range(n)) <= bucket_size)
    m.Add(sum(dist) >= 1).OnlyEnforceIf(has_dist)
    m.Add(volume == sum(vol_units[k] * dist[k] for k in range(n)))
    dist_time = sum(dist_cost[k] * dist[k] for k in range(n)) + b_ns * has_dist
    local_time = [sum(loc_cost[k] * put[k][j] for k in range(n)) + b_ns * has_local[j] for j in range(cp)]
    # comm >= piecewise-linear T_comm(volume) on the segment the volume falls in.
    if segs:
        pick = [m.NewBoolVar(f"seg{i}") for i in range(len(segs))]
        m.AddExactlyOne([has_dist.Not(), *pick])
        for i, (lo, hi, ylo, yhi) in enumerate(segs):
            lo_u, hi_u = int(lo // unit), int(-(-hi // unit))
            m.Add(volume >= lo_u).OnlyEnforceIf(pick[i])
            m.Add(volume <= hi_u).OnlyEnforceIf(pick[i])
            width = max(hi_u - lo_u, 1)
            slope_num = round((yhi - ylo) * _NS)
            m.Add(comm * width >= round(ylo * _NS) * width + slope_num * (volume - lo_u)).OnlyEnforceIf(pick[i])
    for j in range(cp):
        m.Add(makespan >= local_time[j] + dist_time)
    m.Add(makespan >= comm + dist_time)
    if floor_ns > 0 and n > 0:  # the layer call, once a rank, at the host floor or more
        m.Add(makespan >= floor_ns)
    # Ranks are interchangeable: order them by local load.
    for j in range(1, cp):
        m.Add(sum(loc_cost[k] * put[k][j - 1] for k in range(n)) >= sum(loc_cost[k] * put[k][j] for k in range(n)))
    m.Minimize(makespan)
    if hint is not None:
        # Relabel the hint's ranks to satisfy the ordering above.
        load = [sum(loc_cost[k] for k, r in enumerate(hint) if r == j) for j in range(cp)]
        relabel = {old: new for new, old in enumerate(sorted(range(cp), key=lambda j: (-load[j], j)))}
        hint = [r if r == DISTRIBUTED else relabel[r] for r in hint]
        for k, r in enumerate(hint):
            m.AddHint(dist[k], r == DISTRIBUTED)
            for j in range(cp):
                m.AddHint(put[k][j], r == j)
    # --- solve
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = 0
    solver.parameters.max_deterministic_time = deterministic_time
    status = solver.Solve(m)
    name = solver.StatusName(status)
    placement = None
    objective = None
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        placement = []
        for k in range(n):
            if solver.BooleanValue(dist[k]):
                placement.append(DISTRIBUTED)
            else:
                placement.append(next(j for j in range(cp) if solver.BooleanValue(put[k][j])))
    # Once per micro-batch, outside the model: the fixed cost, and the head's time for at least
    # the average tokens a rank holds (its placement-exact value: the core's score of the answer).
    fixed = cost.micro_batch_fixed_us + cost.token_us * sum(lengths) / cp
    if placement is not None:
        objective = solver.ObjectiveValue() / _NS * layers + fixed
    bound = (max(solver.BestObjectiveBound(), 0.0) / _NS * layers + fixed
             if status != cp_model.INFEASIBLE else float("inf"))
    return CpSatResult(placement, name, objective, bound, time.perf_counter() - start)
