"""The core equals the plain-Python reference under slot GDS (skrull_ext/bench/reference_slots.py:
slots.hpp, split_micro_batches with unit = dp, the leader slot, assign_slots), with chunked documents, on both
timelines, with fixed costs, the head, whole_buffer, hedged and not: the same plan, each document on the same
DP rank, every rank's time and the step bit for bit."""

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skrull_ext import POLICIES, _core
from skrull_ext.bench import reference as ref
from skrull_ext.bench import reference_slots as refs
from tests.unit_tests.test_properties import batch
from tests.unit_tests.test_reference_chunked import TIMES, assert_equal, model, options, restated


def reference(lengths, cost, o: _core.Options, us, chunks, lockstep: bool):
    return restated(refs, lengths, cost, o, us, chunks, lockstep)


def slot_options(dp, cp, bucket, policy, lockstep, extra: int = 1) -> _core.Options:
    o = options(dp, cp, bucket, policy, lockstep)
    o.slot_gds = True
    o.max_extra_micro_batches = extra
    return o


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31), st.integers(0, 400), st.sampled_from([1, 2, 4, 8]),
       st.sampled_from([1, 2, 3, 4, 7, 16, 33]), st.sampled_from([64, 1000, 4096, 26624]),
       st.sampled_from(sorted(p for p, v in POLICIES.items() if not v.pool)), st.booleans(),
       st.sampled_from([1.0, 1.5]), st.sampled_from([0.0, 150.0]), st.sampled_from([0.0, 900.0]),
       st.sampled_from([0.0, 2.5]), st.booleans(), st.sampled_from([1, 3]),
       st.lists(st.tuples(st.sampled_from(TIMES), st.integers(1, 6)), max_size=5))
def test_core_equals_reference_under_slot_gds(seed, k, cp, dp, bucket, policy, lockstep, margin, fixed_us, step_us,
                                              token_us, whole, extra, docs):
    lengths = batch(seed, k, bucket, cp)
    rng = random.Random(seed)
    if lengths and rng.random() < 0.5:  # one long leader among the rest: the leader slot's case
        lengths[rng.randrange(len(lengths))] = _core.max_sequence_length(bucket, cp)
    us = [t * rng.choice([1.0, 0.37]) for t, _ in docs]
    chunks = [n for _, n in docs]
    sizes = [rng.randint(1, 60000) for _ in docs]  # where each one's lockstep pad chunks start
    last = [rng.randint(1, n) for n in sizes]  # its last chunk, recomputed where pads follow it
    cost = model(margin, fixed_us, step_us, token_us, whole)
    o = slot_options(dp, cp, bucket, policy, lockstep, extra)
    assert_equal(_core.schedule(lengths, cost, o, us, chunks, sizes, last),
                 reference(lengths, cost, o, us, list(zip(chunks, sizes, last)), lockstep))


def test_reference_exact_small_case_with_a_leader_slot():
    """Slot GDS by hand, DP 2 x CP 1, BucketSize 10, one layer priced a microsecond a FLOP, nothing else
    (flops(s) = 24 s + 4 s^2: lengths 9, 7, 6, 2 cost 540, 364, 288, 64). Lengths [9, 2, 6, 7, 6], 30 tokens:
    at least 2 slots of 2 groups. LPT, longest first, to the least FLOPs with room: {9} 540, {7} 364,
    {6 (#4), 2} 352, {6 (#2)} 288: slots of 540 and 352, 892. The dp slowest leave room (176 us idle), so the
    leader slot is tried: 9 alone sets 540; its mate takes 7 (364), then not a 6 (no tokens left in either
    group), then 2: 428. The two 6s left bound the rest by 288 (540 + 288 < 892) and take one slot of 288:
    828 < 892, kept. That slot's groups go slowest first to the rank with the least time: #4 to rank 1
    (428 < 540), #2 to rank 0."""
    shape = _core.ModelShape(1, 1, 1, 2)
    comm = _core.CommModel([0.0], [0.0], 0.0, 0.0, 0.0, 9.0, 1.0)
    cost = _core.CostModel(shape, 1.0, 0.0, comm, 0.0, 0.0, 0.0, 1.0, False)
    o = slot_options(2, 1, 10, "skrull-paper", True)
    lengths = [9, 2, 6, 7, 6]
    s = _core.schedule(lengths, cost, o)
    assert_equal(s, reference(lengths, cost, o, [], [], True))
    rc = ref.RefCost.of(cost)
    plain = dict(worst_fit=False, longest_rollback=True, sweep=False)  # one rank: any placement is rank 0
    main = refs.search(lengths, [1, 2, 4, 3, 0], rc, 2, 1, 10, plain, False, 1)
    assert (main.groups, main.times, main.score) == ([[4], [3], [0, 2], [1]], [540.0, 364.0, 352.0, 288.0], 892.0)
    assert refs.worth_trying(main.times, 2, 0.0)
    head, rest = refs.leader_slot(lengths, [1, 2, 4, 3, 0], rc, 2, 1, 10, plain)
    assert (head.groups, head.times, rest) == ([[4], [0, 3]], [540.0, 428.0], [2, 4])
    assert [[s.micro_batches[j].seqs for j in range(s.dp_offsets[i], s.dp_offsets[i + 1])] for i in range(2)] == \
        [[[0], [2]], [[1, 3], [4]]]
    assert [mb.dacp.time_us for mb in s.micro_batches] == [540.0, 288.0, 428.0, 288.0]
    assert s.makespan_us == 828.0
