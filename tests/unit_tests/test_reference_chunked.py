"""The core equals the plain-Python reference on batches with chunked documents
(skrull_ext/bench/reference_chunked.py: chunked.hpp, assign_chunked, schedule_as_priced), under the per-rank
GDS on both timelines, with a pad pass's and a step's fixed cost, hedged and not: the same plan, each
document on the same DP rank, every rank's time and the step bit for bit."""

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skrull_ext import POLICIES, _core
from skrull_ext.bench import reference as ref
from skrull_ext.bench import reference_chunked as refc
from skrull_ext.scheduler import cost_model as cm
from tests.unit_tests.test_properties import batch

TIMES = [0.0, 1.0, 3e3, 4e4, 2e5, 1e6]  # a document's time: none, tiny, about a micro-batch's, many


def model(margin: float, fixed_us: float, step_us: float, token_us: float = 0.0, whole: bool = False):
    """The preset with its comm table at plan_margin `margin` and the fixed costs given."""
    c = cm.preset()
    comm = _core.CommModel(c.comm.bytes, c.comm.us, c.comm.threshold_bytes, c.comm.floor_us,
                           c.comm.collectives_per_layer, c.comm.cross_group_factor, margin)
    return _core.CostModel(c.shape, c.a_us_per_flop, c.b_us, comm, fixed_us, step_us, token_us, c.attention_weight,
                           whole)


def options(dp: int, cp: int, bucket: int, policy: str, lockstep: bool) -> _core.Options:
    p, o = POLICIES[policy], _core.Options()
    o.dp, o.cp, o.bucket_size = dp, cp, bucket
    o.placement, o.rollback, o.micro_batch_count = p.placement, p.rollback, p.micro_batch_count
    o.dacp_search, o.refine = p.dacp_search, p.refine
    o.timeline = _core.Timeline.LOCKSTEP if lockstep else _core.Timeline.FREE_RUNNING
    o.slot_gds = False  # the reference restates the per-rank GDS
    return o


def restated(module, lengths, cost, o: _core.Options, us, chunks, lockstep: bool):
    """``module.schedule`` (a plain-Python reference: reference_chunked or reference_slots) of what the
    core is asked with ``o``."""
    return module.schedule(
        lengths, ref.RefCost.of(cost), o.dp, o.cp, o.bucket_size, us, chunks, lockstep,
        worst_fit=o.placement == _core.Placement.WORST_FIT,
        longest_rollback=o.rollback == _core.Rollback.LONGEST,
        predicted_time=o.micro_batch_count == _core.MicroBatchCount.PREDICTED_TIME,
        max_extra=o.max_extra_micro_batches, refine_=o.refine,
        sweep=o.dacp_search == _core.DacpSearch.SHARD_SWEEP,
    )


def reference(lengths, cost, o: _core.Options, us, chunks, lockstep: bool) -> refc.RefChunkedSchedule:
    return restated(refc, lengths, cost, o, us, chunks, lockstep)


def assert_equal(s: _core.Schedule, want: refc.RefChunkedSchedule) -> None:
    plan = want.plan
    assert s.dp_rank == plan.dp_rank
    assert s.micro_batch == plan.micro_batch
    assert s.cp_rank == plan.cp_rank
    offsets = s.dp_offsets
    assert [[s.micro_batches[j].seqs for j in range(offsets[i], offsets[i + 1])]
            for i in range(len(offsets) - 1)] == plan.groups
    assert s.chunked_dp_rank == want.chunked_dp_rank
    assert s.dp_time_us == plan.dp_time_us  # same operations, same order: bitwise
    assert s.makespan_us == want.makespan_us


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31), st.integers(0, 300), st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 3, 4, 7, 33]),
       st.sampled_from([64, 1000, 4096, 26624]),
       st.sampled_from(sorted(p for p, v in POLICIES.items() if not v.pool)), st.booleans(),
       st.sampled_from([1.0, 1.5]), st.sampled_from([0.0, 150.0]), st.sampled_from([0.0, 900.0]),
       st.lists(st.tuples(st.sampled_from(TIMES), st.integers(1, 6)), max_size=7))
def test_core_equals_reference_with_chunked_documents(seed, k, cp, dp, bucket, policy, lockstep, margin, fixed_us,
                                                      step_us, docs):
    lengths = batch(seed, k, bucket, cp)
    rng = random.Random(seed)
    us = [t * rng.choice([1.0, 0.37]) for t, _ in docs]  # ties and near-ties between documents
    chunks = [n for _, n in docs]
    sizes = [rng.randint(1, 60000) for _ in docs]  # where each one's lockstep pad chunks start
    last = [rng.randint(1, n) for n in sizes]  # its last chunk, recomputed where pads follow it
    cost = model(margin, fixed_us, step_us)
    o = options(dp, cp, bucket, policy, lockstep)
    assert_equal(_core.schedule(lengths, cost, o, us, chunks, sizes, last),
                 reference(lengths, cost, o, us, list(zip(chunks, sizes, last)), lockstep))


def test_reference_exact_small_case():
    """Three documents over two lockstep ranks, by hand. One layer priced a microsecond a FLOP, no exchange,
    each micro-batch's (and chunk pass's) fixed cost 10 us, a step 5 us; samples of 1 and 2 tokens
    (flops(s) = 24 s + 4 s^2 here: 28 and 64, so micro-batches of 38 and 74 us). Documents of 3, 1 and 2
    tokens in 3, 1 and 2 chunks. A pad chunk runs what a chunk does (CostModel.pad_chunks_us): after p
    tokens of its document, flops(p + 1) - flops(p) = 28 + 8 p, 4/3 of it where recomputed (all but a
    position's last pass), and the fixed cost: not a pad pass's 38 each.
    LPT: 100 us (3 chunks) on rank 0, 60 (1 chunk) and 30 (2 chunks) on rank 1. The positions take 3 and 2
    passes: rank 0 runs an all-pad position of 2 (28 x 4/3 + 10 and 36 + 10: 93 1/3), rank 1 pads its
    1-token document twice (36 x 4/3 + 10 and 44 + 10: 112) and recomputes that document's chunk (28 / 3):
    after its micro-batches rank 0 runs 193 1/3, rank 1 211 1/3. The samples start from 100 and 90 us in
    FLOPs: 2 tokens to rank 1 (154), then 1 token to rank 0 (128). Ranks: 38 + 193 1/3 and 74 + 211 1/3;
    step: slot 0's 74, the most after, 211 1/3, and 5: 290 1/3 (at a pad pass each, 255). Round robin
    (100 and 30 on rank 0, 60 on rank 1: pads none and 121 1/3 + 93 1/3) is bounded by 279 2/3 < 290 1/3,
    so it is planned, the samples as without documents (2 tokens to rank 0): 74 + 274 2/3 + 5, not
    shorter: LPT's plan is kept."""
    shape = _core.ModelShape(1, 1, 1, 2)
    comm = _core.CommModel([0.0], [0.0], 0.0, 0.0, 0.0, 9.0, 1.0)
    cost = _core.CostModel(shape, 1.0, 0.0, comm, 10.0, 5.0, 0.0, 1.0, False)
    o = options(2, 1, 8, "skrull-paper", True)
    us, chunks = [100.0, 60.0, 30.0], [3, 1, 2]
    s = _core.schedule([1, 2], cost, o, us, chunks, [3, 1, 2], [1, 1, 1])
    assert_equal(s, reference([1, 2], cost, o, us, list(zip(chunks, [3, 1, 2], [1, 1, 1])), True))
    assert refc.assign_lpt(us, 2) == [0, 1, 1]
    assert refc.lockstep_pads(chunks, [0, 1, 1], 2) == [2, 2]
    assert refc.lockstep_pads(chunks, [0, 1, 0], 2) == [0, 4]
    assert s.chunked_dp_rank == [0, 1, 1]
    assert s.dp_rank == [0, 1]
    assert cost.pad_pass_us() == 38.0
    assert s.chunked_pad_us == pytest.approx([28.0 * 4 / 3 + 10.0 + 46.0, 112.0 + 28.0 / 3])
    assert s.dp_time_us == pytest.approx([38.0 + 100.0 + 93.0 + 1 / 3, 74.0 + 90.0 + 121.0 + 1 / 3])
    assert s.makespan_us == pytest.approx(290.0 + 1 / 3)
