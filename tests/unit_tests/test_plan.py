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
        (lambda p: p.ranks[0][0].seqs.append(p.ranks[0][0].seqs[0]), r"seqs, lengths and cp_rank differ|appears in 2"),
        (lambda p: p.cp_rank.__setitem__(0, 5), r"sequence 0 has CP rank 5"),
        (lambda p: p.lengths.__setitem__(0, 2), r"sequence 0 length changed from 1 to 2"),
        (lambda p: p.dropped.clear(), r"sequence 6 has length 30 > limit 20"),
        (lambda p: p.ranks[1][0].rank_tokens.__setitem__(0, 0), r"rank tokens \[0, .*\] but placement gives"),
        (lambda p: setattr(p, "makespan_us", 0.0), r"makespan 0.0 is not the lockstep step time"),
        (lambda p: p.dp_time_us.__setitem__(0, 1.0), r"DP rank 0: micro-batch times sum to"),
        (lambda p: setattr(p, "bucket_size", 5), r"holds \d+ tokens > bucket_size 5|length .* > limit"),
    ],
)
def test_validate_names_the_broken_invariant(plan, corrupt, msg):
    bad = copy.deepcopy(plan)
    corrupt(bad)
    with pytest.raises(PlanError, match=msg):
        bad.validate()


def test_moving_a_sequence_breaks_the_arrays(plan):
    bad = copy.deepcopy(plan)
    mb = bad.ranks[0][0]
    k = mb.seqs.pop()
    mb.lengths.pop()
    mb.cp_rank.pop()
    bad.ranks[1][0].seqs.append(k)
    bad.ranks[1][0].lengths.append(bad.lengths[k])
    bad.ranks[1][0].cp_rank.append(bad.cp_rank[k])
    with pytest.raises(PlanError, match=rf"sequence {k}: arrays say DP 0|rank tokens .* but placement gives"):
        bad.validate()


def test_digest_changes_with_placement(plan):
    d = plan.digest()
    assert d == copy.deepcopy(plan).digest()
    moved = copy.deepcopy(plan)
    moved.cp_rank[0] = 1 - moved.cp_rank[0] if moved.cp_rank[0] >= 0 else 0
    assert moved.digest() != d


def test_summary_counts(plan):
    s = plan.summary()
    assert s["sequences"] == 6 and s["dropped"] == 1
    assert 0.0 <= s["local_seq_share"] <= 1.0
    assert s["micro_batches"] == len(plan.all_micro_batches())


def test_describe_lists_every_micro_batch(plan):
    text = plan.describe()
    assert "1 dropped [6]" in text
    for d, rank in enumerate(plan.ranks):
        assert f"DP {d}: {len(rank)} micro-batches" in text
        for mb in rank:
            k, s, r = mb.seqs[0], mb.lengths[0], mb.cp_rank[0]
            assert f"{k}:{s}@{'D' if r == -1 else r}" in text
