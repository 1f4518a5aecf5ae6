"""Plan.validate catches every broken invariant; digest tracks what ranks compute."""

import copy

import pytest

from skrull_ext import PlanError, Scheduler, SchedulerConfig


@pytest.fixture
def plan(toy):
    p = Scheduler(SchedulerConfig(dp=2, cp=2, bucket_size=10, overlength="drop", cpsat=False), toy).schedule([1, 2, 3, 4, 5, 6, 30])
    p.validate()
    return p


@pytest.mark.parametrize(
    "corrupt, msg",
    [
        (lambda p: p.ranks[0][0].seqs.append(p.ranks[0][0].seqs[0]), r"per-sequence lists differ|appears in 2"),
        (lambda p: p.micro_batch.__setitem__(0, 1 - p.micro_batch[0]),  # the other of its two micro-batches
         r"sequence 0: the plan's arrays say micro-batch \d+ length 1; micro-batch \d+ .* holds it with length 1"),
        (lambda p: _move_set(p, 0, 5 - p.first_rank[0]), r"sequence 0 has rank set \[5, "),
        (lambda p: p.lengths.__setitem__(0, 2), r"sequence 0 length changed from 1 to 2"),
        (lambda p: p.dropped.clear(), r"sequence 6 has length 30 > limit 20"),
        (lambda p: p.ranks[1][0].rank_tokens.__setitem__(0, 0), r"rank tokens \[0, .*\] but its rank sets give"),
        (lambda p: setattr(p, "makespan_us", 0.0), r"makespan 0.0 is not the lockstep step time"),
        (lambda p: p.group_time_us.__setitem__(0, 1.0), r"DP rank 0: its micro-batches finish at"),
        (lambda p: setattr(p, "bucket_size", 5), r"holds \d+ tokens > bucket_size 5|length .* > limit"),
        (lambda p: setattr(p.ranks[0][0], "groups", 2), r"spans 2 CP groups; only skrull-pool plans may"),
        (lambda p: p.ranks[0][0].num_ranks.__setitem__(0, 1 if p.ranks[0][0].num_ranks[0] == 2 else 2),
         r"not one rank or the whole CP group|rank tokens .* but its rank sets give"),
    ],
)
def test_validate_names_the_broken_invariant(plan, corrupt, msg):
    bad = copy.deepcopy(plan)
    corrupt(bad)
    with pytest.raises(PlanError, match=msg):
        bad.validate()


def test_validate_for_one_dp_rank_checks_its_micro_batches_and_exactly_once(plan):
    """A training rank checks its own micro-batches in full and the others' for exactly-once and
    times only: every rank checks its own, so the job checks all (loader.py)."""
    tokens = copy.deepcopy(plan)
    tokens.ranks[1][0].rank_tokens[0] += 1  # DP rank 1's micro-batch: only rank 1 (or the whole check) sees it
    tokens.validate(dp_rank=0)
    for rank in (1, None):
        with pytest.raises(PlanError, match=r"rank tokens .* but its rank sets give"):
            tokens.validate(dp_rank=rank)
    twice = copy.deepcopy(plan)
    twice.ranks[1][0].seqs.append(twice.ranks[0][0].seqs[0])  # rank 0's sequence also in rank 1's micro-batch
    with pytest.raises(PlanError, match=r"appears in 2 micro-batches"):
        twice.validate(dp_rank=0)
    outside = copy.deepcopy(plan)
    outside.ranks[1][0].seqs[0] = -1
    with pytest.raises(PlanError, match=r"micro-batch \d+ holds a sequence outside \[0, 7\)"):
        outside.validate(dp_rank=0)
    for bad in (2, -1, 1.0):
        with pytest.raises(ValueError, match=rf"dp_rank must be in \[0, 2\), got {bad}"):
            plan.validate(dp_rank=bad)


def _move_set(plan, k, by):
    """Moves sequence k's rank set by ``by`` ranks where it is stored: on its micro-batch."""
    mb = plan.micro_batches[plan.micro_batch[k]]
    mb.first_rank[mb.seqs.index(k)] += by


def test_rank_sets_are_read_from_the_micro_batches(plan):
    """A set is stored once, on its micro-batch: the plan's per-sequence view follows a change there."""
    moved = copy.deepcopy(plan)
    _move_set(moved, 0, 1)
    assert moved.first_rank[0] == plan.first_rank[0] + 1 and moved.num_ranks == plan.num_ranks
    assert moved.first_rank[6] == moved.num_ranks[6] == 0  # dropped: no set


def test_moving_a_sequence_breaks_the_arrays(plan):
    bad = copy.deepcopy(plan)
    src, dst = bad.ranks[0][0], bad.ranks[1][0]
    k, s, r, n = src.seqs.pop(), src.lengths.pop(), src.first_rank.pop(), src.num_ranks.pop()
    dst.seqs.append(k)
    dst.lengths.append(s)
    dst.first_rank.append(r + bad.cp)  # the same CP rank (or the whole group) of DP rank 1
    dst.num_ranks.append(n)
    with pytest.raises(PlanError, match=rf"sequence {k}: the plan's arrays say|rank tokens .* but its rank sets give"):
        bad.validate()


def test_digest_changes_with_placement(plan):
    d = plan.digest()
    assert d == copy.deepcopy(plan).digest()
    moved = copy.deepcopy(plan)
    _move_set(moved, 0, 1)
    assert moved.digest() != d


def test_skrull_plan_views(plan):
    """A skrull plan is the one-group case: every micro-batch on one group, each set one rank
    or the whole group, and the (DP rank, slot, CP rank) views agree with the micro-batches."""
    for mb in plan.micro_batches:
        assert mb.groups == 1 and all(n in (1, plan.cp) for n in mb.num_ranks)
        for k, c in zip(mb.seqs, mb.cp_rank):
            assert (plan.dp_rank[k], plan.slot[k], plan.cp_rank[k]) == (mb.first_group, mb.slot, c)
    assert [plan.dp_rank[6], plan.slot[6], plan.micro_batch[6]] == [-1, -1, -1]  # dropped


def test_summary_counts(plan):
    s = plan.summary()
    assert s["sequences"] == 6 and s["dropped"] == 1
    assert 0.0 <= s["local_seq_share"] <= 1.0
    assert s["micro_batches"] == len(plan.micro_batches)


def test_describe_lists_every_micro_batch(plan):
    from skrull_ext.scheduler.plan_text import describe

    text = describe(plan)
    assert "1 dropped [6]" in text
    for d, rank in enumerate(plan.ranks):
        assert f"DP {d}: {len(rank)} micro-batches" in text
        for mb in rank:
            k, s, r = mb.seqs[0], mb.lengths[0], mb.cp_rank[0]
            assert f"{k}:{s}@{'D' if r == -1 else r}" in text


def test_to_plan_refuses_a_schedule_of_another_cp_size(toy):
    from skrull_ext import _core

    opts = _core.Options()
    opts.dp, opts.cp, opts.bucket_size = 2, 2, 10
    s = _core.schedule([1, 2, 3, 4, 5, 6], toy, opts)
    with pytest.raises(ValueError, match="^to_plan: a micro-batch of the schedule has 2 CP ranks, cp is 3$"):
        _core.to_plan(s, 3, _core.Timeline.LOCKSTEP, 0.0)
    with pytest.raises(ValueError, match="^to_plan: pad_us must be finite and >= 0$"):
        _core.to_plan(s, 2, _core.Timeline.LOCKSTEP, float("nan"))
    p = _core.to_plan(s, 2, _core.Timeline.LOCKSTEP, 0.0)
    assert (list(p.first_rank), list(p.num_ranks), p.slots, p.skrull_plan) == ([0, 2, 1, 3, 2, 0], [1] * 6, 1, True)


def test_to_plan_reads_cp_timeline_and_costs_from_the_options_and_cost_model(toy):
    """The Scheduler passes the job's options and cost model, as to schedule_pool, not cp and
    the timeline again: the same plan as naming each, and the options' cp checked alike."""
    from skrull_ext import _core

    opts = _core.Options()
    opts.dp, opts.cp, opts.bucket_size, opts.timeline = 2, 2, 10, _core.Timeline.FREE_RUNNING
    s = _core.schedule([1, 2, 3, 4, 5, 6], toy, opts)
    a = _core.to_plan(s, toy, opts)
    b = _core.to_plan(s, 2, _core.Timeline.FREE_RUNNING, toy.micro_batch_fixed_us, toy.step_fixed_us)
    assert (list(a.first_rank), list(a.group_time_us), a.makespan_us) == (
        list(b.first_rank), list(b.group_time_us), b.makespan_us)
    opts.cp = 3
    with pytest.raises(ValueError, match="^to_plan: a micro-batch of the schedule has 2 CP ranks, cp is 3$"):
        _core.to_plan(s, toy, opts)
