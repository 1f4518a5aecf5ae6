"""Chunked documents in the plans (``overlength = "chunk"``, cpp/include/skrull/chunked.hpp):
which DP rank trains each, the step's predicted time with them, the look-ahead pricing them,
and the loader handing each rank its own. Hand-computed on the toy cost model
(tests/unit_tests/conftest.py: flops(s) = 24 s + 4 s^2, a time of one FLOP a microsecond, nothing else),
where chunk_cost is flops(L) plus a third of the flops of every chunk but the last (their recomputed
forward; the last chunk keeps its activations), no fixed cost: ``_chunked``."""

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skrull_ext import _core
from skrull_ext.scheduler import Scheduler
from skrull_ext.scheduler.config import SchedulerConfig
from skrull_ext.scheduler.plan import PlanError


def _flops(s: int) -> int:
    return 24 * s + 4 * s * s


def _chunked(n: int, chunk: int = 5) -> float:
    """A chunked document's price: its flops, and a third of those before its last chunk (the
    recompute). Documents 12, 9 and 6 in chunks of 5: 1077.33, 613.33, 361.33."""
    return _flops(n) + _flops((n - 1) // chunk * chunk) / 3


def test_chunked_documents_go_where_they_balance_the_step(toy):
    # Limit 5 tokens (BucketSize 5, cp 1). Documents 12, 9, 6 cost 1077.33, 613.33, 361.33 (_chunked).
    # LPT: 1077.33 -> DP 0, 613.33 -> DP 1, 361.33 -> DP 1 (613.33 < 1077.33): loads 1077.33, 974.67.
    # GDS around them, longest first: 5 (220) -> DP 1 (1194.67), 4 (160) -> DP 0 (1237.33), 3 (108) -> DP 1
    # (1302.67), 2 (64) -> DP 0 (1301.33), 1 (28) -> DP 0 (1329.33). Free-running: the step is DP 0's 1329.33.
    plan = Scheduler(SchedulerConfig(dp=2, cp=1, bucket_size=5, timeline="free"), toy).schedule(
        [1, 2, 3, 4, 5], chunked=[12, 9, 6])
    plan.validate()
    assert plan.chunked_us == pytest.approx([_chunked(n) for n in (12, 9, 6)])
    assert plan.chunked_group == [0, 1, 1]
    assert plan.dp_rank == [0, 0, 1, 0, 1]
    assert plan.group_time_us == pytest.approx([1329 + 1 / 3, 1302 + 2 / 3])
    assert plan.makespan_us == pytest.approx(1329 + 1 / 3)
    assert plan.chunked_of(1) == [1, 2] and plan.summary()["chunked"] == 3
    # Round robin (12 and 6 on DP 0) with the samples split as without them: 1438.67 + their share.
    assert _round_robin_us(toy, [1, 2, 3, 4, 5], [12, 9, 6], dp=2, cp=1, bucket=5, timeline="free") > 1438


def test_lockstep_runs_them_after_the_slots(toy):
    # Lockstep: every rank's slots, then the step waits for the rank with the most chunked time: DP 0's
    # 12 (3 chunks) and the all-pad position of 2 chunks it runs beside DP 1's 9 and 6 (2 each), each a
    # chunk of one token (CostModel.pad_chunks_us): flops(1) = 28, recomputed (4/3), then flops(2) -
    # flops(1) = 36, its query over the first one's key: 73 1/3 (a pad pass each, 56, left that out). DP 1
    # pads its 9 once (flops(10) - flops(9) = 100) and recomputes that document's last chunk (tokens 5-8,
    # (flops(9) - flops(5)) / 3 = 106 2/3), which now makes it the rank the step waits for.
    plan = Scheduler(SchedulerConfig(dp=2, cp=1, bucket_size=5, timeline="lockstep"), toy).schedule(
        [1, 2, 3, 4, 5], chunked=[12, 9, 6])
    plan.validate()
    slots = sum(max(mb.time_us for mb in plan.micro_batches if mb.slot == j) for j in range(plan.slots))
    assert plan.chunked_group == [0, 1, 1]
    assert toy.pad_pass_us() == _flops(1) == 28 and plan.pad_us == 28
    assert toy.pad_chunks_us(0, 2, 1) == pytest.approx(28 * 4 / 3 + 36)
    assert plan.chunked_pad_us == pytest.approx([28 * 4 / 3 + 36, 100 + 320 / 3])
    after = [_chunked(12) + 28 * 4 / 3 + 36, _chunked(9) + _chunked(6) + 100 + 320 / 3]
    assert after[1] > after[0] and plan.makespan_us == pytest.approx(slots + after[1])


def test_lockstep_prices_the_pad_chunks_its_ranks_run():
    # Lockstep DP ranks run as many chunk passes per position as each other (scheduler/chunk_lockstep.py):
    # 12 (3 chunks of 5) on DP 0; 9 and 6 (2 each) on DP 1. Positions [3, 2]: DP 0 runs an all-pad
    # document of 2, DP 1 one pad chunk after its 9. Each pad chunk one token through the layer over the
    # keys before it, recomputed but the last, and the fixed cost (chunk_cost has 5 a real chunk too):
    # DP 0 1092.33 + 28 x 4/3 + 5 + 36 + 5 (at a pad pass each, 2 x 33), DP 1 623.33 + 371.33 + 33 + 8 x 9,
    # and its 9's last chunk (tokens 5-8) recomputed, no longer its position's last pass: (flops(9) -
    # flops(5)) / 3 more; DP 1's 1206.33 now sets the step (DP 0's 1175.67; at a pad pass each, DP 0's
    # 1158.33 did).
    from tests.unit_tests.conftest import toy_cost

    cost = toy_cost(fixed_us=5.0)
    lock = Scheduler(SchedulerConfig(dp=2, cp=1, bucket_size=5, timeline="lockstep"), cost).schedule(
        [1, 2, 3, 4, 5], chunked=[12, 9, 6])
    lock.validate()
    assert lock.chunked_group == [0, 1, 1] and lock.chunked_pads() == [2, 1]
    slots = sum(max(mb.time_us for mb in lock.micro_batches if mb.slot == j) for j in range(lock.slots))
    assert lock.chunked_us == pytest.approx([_chunked(n) + 5 * -(-n // 5) for n in (12, 9, 6)])
    assert cost.pad_pass_us() == lock.pad_us == 33.0
    assert lock.chunked_pad_us == pytest.approx([28 * 4 / 3 + 36 + 10, 28 + 8 * 9 + 5 + (_flops(9) - _flops(5)) / 3])
    assert lock.makespan_us == pytest.approx(slots + 623 + 1 / 3 + 371 + 1 / 3 + 105 + (_flops(9) - _flops(5)) / 3)
    assert lock.step_time_us() == pytest.approx(lock.makespan_us)
    # Free-running ranks pad nothing (their chunk passes share no collective); DP 1 has nothing to pad.
    free = Scheduler(SchedulerConfig(dp=2, cp=1, bucket_size=5, timeline="free"), cost).schedule(
        [1, 2, 3, 4, 5], chunked=[12, 9, 6])
    assert free.step_time_us() == pytest.approx(free.makespan_us)
    one = Scheduler(SchedulerConfig(dp=1, cp=1, bucket_size=5, timeline="lockstep"), cost).schedule(
        [1, 2], chunked=[12, 9])
    assert one.chunked_pads() == [0]


def test_a_step_of_chunked_documents_only(toy):
    plan = Scheduler(SchedulerConfig(dp=3, cp=1, bucket_size=5, timeline="free"), toy).schedule([], chunked=[6, 9])
    plan.validate()
    assert plan.micro_batches == [] and plan.chunked_group == [1, 0]  # the longer first, to DP 0
    # Free-running at DP 3, every rank without a micro-batch runs one pad pass (data/steps/plan_buffers.py
    # rank_buffers), DP 0 after its document: 28 more than the document (the timeline left it out).
    assert plan.makespan_us == pytest.approx(_chunked(9) + toy.pad_pass_us()) and toy.pad_pass_us() == 28
    assert plan.group_time_us == pytest.approx([_chunked(9) + 28, _chunked(6) + 28, 28])


def test_plan_check_names_a_bad_chunked_document(toy):
    plan = Scheduler(SchedulerConfig(dp=2, cp=1, bucket_size=5, timeline="free"), toy).schedule([1, 2], chunked=[12])
    plan.chunked_group = [2]
    with pytest.raises(PlanError, match=r"chunked document 0 is on DP rank 2, outside \[0, 2\)"):
        plan.validate()
    plan.chunked_group, plan.chunked = [0], [5]
    with pytest.raises(PlanError, match="chunked document 0 has length 5, within the limit 5"):
        plan.validate()


def test_the_lookahead_prices_a_step_with_its_chunked_documents(toy):
    # Step 0 trains a document of 1077.33; its long samples move to step 1 beside nothing.
    sched = Scheduler(SchedulerConfig(dp=1, cp=1, bucket_size=10, timeline="free"), toy)
    with_doc = sched.lookahead([[5, 1], [5, 1]], [[12], []])
    assert with_doc.arrival_us[0] == pytest.approx(_chunked(12) + _flops(5) + _flops(1))
    assert with_doc.window_us == pytest.approx(with_doc.arrival_window_us)  # one group: moving changes no sum
    assert with_doc.window_us == pytest.approx(_chunked(12) + 2 * (_flops(5) + _flops(1)))


def _round_robin_us(cost, lengths, chunked, dp, cp, bucket, timeline, pads: bool = True):
    """The reference: the samples planned as without the documents, document k on DP rank k mod dp
    (``pads``: with the pad chunks lockstep ranks run, Plan.chunked_pads)."""
    sched = Scheduler(SchedulerConfig(dp=dp, cp=cp, bucket_size=bucket, timeline=timeline), cost)
    plan = sched.schedule(lengths)
    plan.chunked, plan.chunked_us = list(chunked), sched.chunked_us(chunked)
    plan.chunked_chunk = [sched.job.chunk_for(n) for n in chunked] if pads else []
    plan.chunked_group = [k % dp for k in range(len(chunked))]
    passes = plan.chunked_passes()
    plan.chunked_pad_us = _core.lockstep_pad_us(
        chunked, passes, [n - (p - 1) * c for n, p, c in zip(chunked, passes, plan.chunked_chunk)],
        plan.chunked_group, dp, cp, cost) if pads else []
    plan.retime()
    return plan.makespan_us


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 4), st.sampled_from([1, 2]), st.sampled_from(["free", "lockstep"]),
       st.lists(st.integers(1, 16), max_size=24), st.lists(st.integers(17, 120), min_size=1, max_size=7))
def test_every_chunked_document_once_and_no_slower_than_round_robin(dp, cp, timeline, lengths, chunked):
    from tests.unit_tests.conftest import toy_cost

    cost = toy_cost(b_us=2.0, fixed_us=5.0)
    bucket = 16 // cp  # limit 16 tokens: every chunked length is beyond it
    sched = Scheduler(SchedulerConfig(dp=dp, cp=cp, bucket_size=bucket, timeline=timeline), cost)
    plan = sched.schedule(lengths, chunked=chunked)
    plan.validate()
    assert len(plan.chunked_group) == len(chunked) and all(0 <= g < dp for g in plan.chunked_group)
    assert sorted(k for g in range(dp) for k in plan.chunked_of(g)) == list(range(len(chunked)))
    assert sum(plan.chunked_load()) == pytest.approx(sum(sched.chunked_us(chunked)))
    # The core assigns seeing the pad chunks lockstep ranks add (Plan.chunked_pads): no slower than
    # round robin with them, and they add at most the dearest rank's pads, each at least a pad pass.
    assert plan.makespan_us <= _round_robin_us(cost, lengths, chunked, dp, cp, bucket, timeline) * (1 + 1e-9)
    unpadded = copy.copy(plan)
    unpadded.chunked_pad_us = []
    pads = plan.chunked_pads()
    assert unpadded.step_time_us() <= plan.makespan_us <= \
        unpadded.step_time_us() + max(plan.chunked_pad_us, default=0.0) + 1e-6
    if timeline == "lockstep":
        assert all(p >= n * plan.pad_us * (1 - 1e-12) for p, n in zip(plan.chunked_pad_us, pads))
    if timeline == "free" or dp == 1:
        assert plan.makespan_us == pytest.approx(unpadded.step_time_us())
    # The same inputs, the same plan (every rank plans alike).
    assert sched.schedule(lengths, chunked=chunked).digest() == plan.digest()


def test_the_pad_chunks_change_which_rank_runs_a_document():
    # cpp/tests/test_core.cpp test_chunked_lockstep, through the binding. Documents of 6, 5 and 2 us in 3, 1
    # and 1 chunk passes (3, 1 and 1 tokens) on DP 2, no samples. LPT by time ([0, 1, 1]: loads 6, 7) beats
    # round robin ([0, 1, 0]: 8, 5) unpadded. Lockstep, a pad chunk the layer call's intercept (b = 1 at
    # a = 0, no fixed cost), 4/3 of it where recomputed (all but a position's last pass): LPT's positions
    # [3, 1] pad DP 0 once (1: 7) and DP 1 twice (4/3 + 1, and its document's chunk recomputed, 1/3:
    # 9 2/3); round robin's pad DP 0 never (8) and DP 1 three times (4/3 + 1 + 1/3 + 1: 8 2/3): round
    # robin. At a pad pass each, 9 against 8.
    opts = SchedulerConfig(dp=2, cp=1, bucket_size=100, timeline="lockstep").core_options()
    flat = _core.CostModel(_core.ModelShape(1, 1, 1, 1), 0.0, 1.0, _core.CommModel([1.0], [0.0]))
    assert flat.pad_pass_us() == 1.0 and flat.pad_chunks_us(0, 2, 1) == pytest.approx(1 + 4 / 3)
    s = _core.schedule([], flat, opts, [6.0, 5.0, 2.0], [3, 1, 1], [3, 1, 1], [1, 1, 1])
    assert s.chunked_dp_rank == [0, 1, 0] and s.makespan_us == pytest.approx(5 + 11 / 3)
    assert s.chunked_chunks == [3, 1, 1] and s.chunked_pad_us == pytest.approx([0.0, 11 / 3])
    assert _core.lockstep_pad_us([3, 1, 1], [3, 1, 1], [1, 1, 1], [0, 1, 1], 2, 1, flat) == \
        pytest.approx([1.0, 1 + 4 / 3 + 1 / 3])
    assert _core.chunked_after([6.0, 5.0, 2.0], [0, 1, 1], 2, opts.timeline, [1.0, 2.0]) == [7.0, 9.0]
    cost = _core.CostModel(_core.ModelShape(1, 1, 1, 1), 0.0, 0.0, _core.CommModel([1.0], [0.0]))
    assert cost.pad_pass_us() == 0.0  # the pads priced at nothing: LPT
    s = _core.schedule([], cost, opts, [6.0, 5.0, 2.0], [3, 1, 1], [3, 1, 1], [1, 1, 1])
    assert s.chunked_dp_rank == [0, 1, 1] and s.makespan_us == 7.0
    with pytest.raises(ValueError, match="^0 chunk counts for 3 chunked documents$"):
        _core.schedule([], cost, opts, [6.0, 5.0, 2.0])
    with pytest.raises(ValueError, match="^0 chunked lengths for 3 chunked documents$"):
        _core.schedule([], cost, opts, [6.0, 5.0, 2.0], [3, 1, 1])
    with pytest.raises(ValueError, match=r"^chunked document 2 has a last chunk of 2 tokens; must be in \[1, 1\]$"):
        _core.schedule([], cost, opts, [6.0, 5.0, 2.0], [3, 1, 1], [3, 1, 1], [1, 1, 2])
    with pytest.raises(ValueError, match="^chunked document 1 has 0 chunks; must be >= 1$"):
        _core.lockstep_pads([3, 0], [0, 1], 2)
    with pytest.raises(ValueError, match=r"^chunked document 0's DP rank -1 is outside \[0, 2\)$"):
        _core.chunked_after([1.0], [-1], 2, opts.timeline, [])


def test_chunk_passes_and_times_past_their_ranges_are_refused_by_name():
    # Two documents of 2^31 - 1 chunks at no time both go to DP rank 0 (LPT's ties to the lower rank): DP rank
    # 1's pads, 2 x (2^31 - 1), wrapped to -2 in int32; two of the largest double on one rank made the step
    # infinite (both from the fuzz target's tail, chunked.hpp kMaxChunkPasses and kMaxChunkedUs).
    from tests.unit_tests.conftest import toy_cost

    opts = SchedulerConfig(dp=2, cp=1, bucket_size=100, timeline="lockstep").core_options()
    most = 2**31 - 1
    with pytest.raises(ValueError, match="^chunked documents have 4294967294 chunk passes in all, "
                                         "more than the limit 1073741824$"):
        _core.schedule([5], toy_cost(fixed_us=1.0), opts, [0.0, 0.0], [most, most])
    with pytest.raises(ValueError, match="^chunked documents have 4294967294 chunk passes in all"):
        _core.lockstep_pads([most, most], [0, 0], 2)
    with pytest.raises(ValueError, match=r"^chunked document 1 has time 1.79769e\+308 us, above the limit 1e\+60 us$"):
        _core.schedule([5], toy_cost(), opts, [1.0, 1.7976931348623157e308], [1, 1])
    assert _core.lockstep_pads([2**29, 2**29], [0, 0], 2) == [0, 2**30]


def test_assign_chunked_is_lpt():
    assert _core.assign_chunked([2, 3, 2, 3, 2], 2) == [0, 0, 1, 1, 0]
    with pytest.raises(ValueError, match="chunked document 1 has time"):
        _core.assign_chunked([1.0, float("nan")], 2)


@pytest.mark.parametrize("lookahead", [1, 2])
def test_each_rank_gets_the_chunked_documents_its_plan_assigns(lookahead):
    from skrull_ext.data.steps.loader import SkrullDataLoader
    from skrull_ext.scheduler import cost_model
    from skrull_ext.train.job.skrull_config import SkrullConfig

    dp, steps = 2, 6
    section = SkrullConfig(bucket_size=256, cost_model="h100-assumed", overlength="chunk", lookahead=lookahead)
    got = []
    for rank in range(dp):
        config = SkrullDataLoader.Config(length_scale=32.0, max_len=2048, global_batch_size=8, vocab_size=512,
                                         prefetch_steps=0)
        loader = config.build(dp_world_size=dp, dp_rank=rank)
        loader.attach(Scheduler(section.scheduler_config(dp, 1), cost_model.preset("llama3-debug")), 0, 1)
        got.append([loader.next_step() for _ in range(steps)])
    seen = 0
    for j in range(steps):
        a, b = got[0][j], got[1][j]
        assert a.plan.digest() == b.plan.digest()
        over = a.samples[len(a.samples) - len(a.plan.chunked):]
        for rank, step in enumerate((a, b)):
            want = [over[k] for k in step.plan.chunked_of(rank)]
            assert [s.length for s in step.chunked] == [step.plan.chunked[k] for k in step.plan.chunked_of(rank)]
            assert len(want) == len(step.chunked)
        assert len(a.chunked) + len(b.chunked) == len(a.plan.chunked)
        seen += len(a.plan.chunked)
    assert seen > 0  # the data has documents beyond the limit


def test_the_pool_places_chunked_documents_after_its_plan(toy):
    # skrull-pool: the documents go by LPT after the pool's plan (which does not balance around them),
    # and the timeline counts them. Limit of the world: BucketSize 5 x dp 2 x cp 1 = 10 tokens.
    sched = Scheduler(SchedulerConfig(dp=2, cp=1, bucket_size=5, policy="skrull-pool", timeline="lockstep"), toy)
    plan = sched.schedule([1, 2, 3, 4, 5], chunked=[12])
    plan.validate()
    assert plan.chunked_group == [0] and plan.chunked_us == pytest.approx([_chunked(12)])
    without = sched.schedule([1, 2, 3, 4, 5])
    assert plan.makespan_us == pytest.approx(without.makespan_us + _chunked(12))
    window = sched.lookahead([[1, 2], [3, 4]], [[12], []])
    assert window.arrival_us[0] == pytest.approx(sched.schedule([1, 2], chunked=[12]).makespan_us)


def test_the_lookahead_moves_long_samples_beside_a_chunked_document(toy):
    # DP 2, free-running: step 0's document (1077.33) holds DP rank 0, which then runs one pad pass (28: it
    # has no micro-batch); its samples run on DP rank 1 beside it. Both 5-token samples (220 each) fit beside
    # it, so step 1 keeps only the 1-token ones (28).
    sched = Scheduler(SchedulerConfig(dp=2, cp=1, bucket_size=10, timeline="free"), toy)
    a = sched.lookahead([[5, 1], [5, 1]], [[12], []])
    assert a.arrival_us == pytest.approx([_chunked(12) + 28, _flops(5)])
    assert a.steps == [[0, 2], [1, 3]] and a.step_us == pytest.approx([_chunked(12) + 28, _flops(1)])


def test_a_step_of_one_chunked_sample_has_an_empty_plan_and_no_micro_batch():
    from skrull_ext.data.steps.loader import SkrullDataLoader
    from skrull_ext.scheduler import cost_model
    from skrull_ext.train.job.skrull_config import SkrullConfig

    section = SkrullConfig(bucket_size=64, cost_model="h100-assumed", overlength="chunk", lookahead=1)
    config = SkrullDataLoader.Config(length_scale=32.0, max_len=2048, global_batch_size=1, vocab_size=512,
                                     prefetch_steps=0)
    loader = config.build(dp_world_size=1, dp_rank=0)
    loader.attach(Scheduler(section.scheduler_config(1, 1), cost_model.preset("llama3-debug")), 0, 1)
    step = loader.next_step()  # the debug data's first sample: 252 tokens, over the limit of 64
    step.plan.validate()
    assert step.plan.lengths == [] and step.plan.chunked == [252] and step.plan.chunked_group == [0]
    assert step.micro_batches == [] and [s.length for s in step.chunked] == [252]
    assert step.plan.makespan_us == pytest.approx(step.plan.chunked_us[0] + step.plan.step_us)
    assert step.global_valid_tokens == 251 and loader.last_tokens == 252
