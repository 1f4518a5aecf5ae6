"""The cost model's whole_buffer: attention over a rank's buffer priced as the kernel computes it.

The CPU's dense kernel is one masked SDPA over a part of the buffer (the local documents, or this
rank's distributed queries over the gathered K/V), so a part costs flops() of its length; a varlen
kernel (a GPU's) costs the sum over documents. ``[compute] whole_buffer`` says which.
"""

import hashlib
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skrull_ext import _core, Scheduler, SchedulerConfig
from skrull_ext._core import CommModel, CostModel, DISTRIBUTED, ModelShape
from skrull_ext.scheduler import profile_file
from skrull_ext.scheduler.profile_file import Profile

PROFILES = Path(__file__).resolve().parents[2] / "profiles"


def _toy(whole: bool, comm_us: float = 0.0) -> CostModel:
    """flops(s) = 24 s + 4 s^2, T_comp(F) = F (conftest.toy_cost), whole or per document."""
    return CostModel(shape=ModelShape(layers=1, hidden=1, kv_width=1, bytes_per_elem=1), a_us_per_flop=1.0,
                     b_us=0.0, comm=CommModel(bytes=[1.0], us=[comm_us], collectives_per_layer=1.0),
                     whole_buffer=whole)


def test_two_documents_are_priced_as_their_sum_whole_and_as_two_per_document():
    per_doc, whole = _toy(False), _toy(True)
    assert (per_doc.whole_buffer, whole.whole_buffer) == (False, True)
    # 3 + 5 tokens on one rank: 24*3 + 4*9 + 24*5 + 4*25 = 328 per document; 24*8 + 4*64 = 448 whole.
    assert _core.evaluate_placement([3, 5], [0, 0], per_doc, 1, 10).time_us == 328.0
    assert _core.evaluate_placement([3, 5], [0, 0], whole, 1, 10).time_us == 448.0
    # Sharded over 2 ranks: each rank's queries over all the gathered K/V, 448 / 2.
    assert _core.evaluate_placement([3, 5], [DISTRIBUTED] * 2, per_doc, 2, 10).time_us == 164.0
    assert _core.evaluate_placement([3, 5], [DISTRIBUTED] * 2, whole, 2, 10).time_us == 224.0
    # One document a part: no difference.
    assert _core.evaluate_placement([3, 5], [0, DISTRIBUTED], whole, 2, 10).time_us == 108.0 + 110.0
    # The scheduler follows the price. Per document, one micro-batch of both (328); whole, two
    # micro-batches of one each price 108 + 220 = 328 against 448 together, so it splits them...
    plans = [Scheduler(SchedulerConfig(dp=1, cp=1, bucket_size=10), c).schedule([3, 5]) for c in (per_doc, whole)]
    assert [(p.slots, p.makespan_us) for p in plans] == [(1, 328.0), (2, 328.0)]
    # ...unless a micro-batch's fixed cost (1000) outweighs the square it saves.
    fixed = profile_file.from_dict({**profile_file.to_dict(whole), "micro_batch": {"fixed_us": 1000.0}})
    plan = Scheduler(SchedulerConfig(dp=1, cp=1, bucket_size=10), fixed).schedule([3, 5])
    assert (plan.slots, plan.makespan_us) == (1, 1448.0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=12), st.integers(1, 4), st.randoms(use_true_random=False))
def test_whole_never_prices_below_per_document_and_equals_it_one_document_a_part(lengths, cp, rnd):
    cp_rank = [rnd.choice([DISTRIBUTED, *range(cp)]) if cp > 1 else 0 for _ in lengths]
    bucket = 1 << 20
    per_doc = _core.evaluate_placement(lengths, cp_rank, _toy(False, 3.0), cp, bucket).time_us
    whole = _core.evaluate_placement(lengths, cp_rank, _toy(True, 3.0), cp, bucket).time_us
    assert whole >= per_doc
    parts = [sum(1 for r in cp_rank if r == j) for j in (DISTRIBUTED, *range(cp))]
    if max(parts) <= 1:
        assert whole == per_doc


# The plans of the pre-change core (b454955) on the GPU profiles of that time (GPU run 7's H200, now dated): makespan and a digest of
# (cp_rank, dp_rank, slot), for 24 random sequences at (cp, dp) = (4, 1) and (8, 2), free and lockstep.
GPU_PLANS = {
    "h200-qwen2.5-0.5b-2026-11-28": [("2298269.749256859", "4a9ad1541b54"), ("2298269.749256859", "4a9ad1541b54"),
                          ("1260207.7298064248", "9dc7a9a6ebbf"), ("1260207.7298064248", "39e9fb51d3c9")],
    "h100-qwen2.5-0.5b": [("1656658.3223569002", "170fb1e4c636"), ("1656658.3223569002", "170fb1e4c636"),
                          ("864205.9132549864", "64341ff292cc"), ("864782.4806696858", "34541c2e2d8d")],
}


@pytest.mark.parametrize("name", sorted(GPU_PLANS))
def test_gpu_profiles_price_per_document_and_plan_as_before(name):
    prof = Profile.load(PROFILES / f"{name}.toml")
    cost = prof.cost_model()
    assert cost.whole_buffer is False  # varlen on the GPU: no [compute] whole_buffer
    rng = random.Random(7)
    got = []
    for cp, dp in ((4, 1), (8, 2)):
        lengths = [rng.choice([rng.randint(100, 3000), rng.randint(8000, 60000)]) for _ in range(24)]
        for timeline in ("free", "lockstep"):
            plan = Scheduler(SchedulerConfig(dp=dp, cp=cp, bucket_size=prof.bucket_size, timeline=timeline),
                             cost).schedule(lengths)
            digest = hashlib.sha1(repr((plan.cp_rank, plan.dp_rank, plan.slot)).encode()).hexdigest()[:12]
            got.append((repr(plan.makespan_us), digest))
    assert got == GPU_PLANS[name]


def _cpu_whole() -> tuple[Profile, CostModel, CostModel]:
    """The shipped CPU profile, its cost model priced per document and whole (the shipped file
    says whole, as its dense kernel computes; either way is set here, not read)."""
    prof = Profile.load(PROFILES / "cpu-debug-gloo2.toml")
    per_doc, whole = ({**prof.data, "compute": {**prof.data["compute"], "whole_buffer": w}} for w in (False, True))
    return prof, profile_file.from_dict(per_doc), profile_file.from_dict(whole)


def test_the_reference_restates_whole_buffer_plans():
    # The CPU profile, whole: random README-like steps at CP 2 and 4 plan alike in the core and the
    # plain-Python reference (refinement and the shard sweep included), and differ from per document.
    from skrull_ext.bench import reference as ref

    prof, per_doc_cost, cost = _cpu_whole()
    assert cost.whole_buffer and not per_doc_cost.whole_buffer and prof.cost_model().whole_buffer
    rng = random.Random(5)
    moved = 0
    for cp in (2, 4):
        for _ in range(4):
            lengths = [rng.choice([rng.randint(8, 120), rng.randint(200, 500)]) for _ in range(10)]
            want = ref.schedule(lengths, ref.RefCost.of(cost), 1, cp, 512, predicted_time=True, refine_=True,
                                sweep=True)
            plan = Scheduler(SchedulerConfig(dp=1, cp=cp, bucket_size=512, timeline="free"), cost).schedule(lengths)
            plan.validate()
            assert [[mb.seqs for mb in r] for r in plan.ranks] == want.groups and plan.group_time_us == want.dp_time_us
            per_doc = ref.schedule(lengths, ref.RefCost.of(per_doc_cost), 1, cp, 512, predicted_time=True,
                                   refine_=True, sweep=True)
            moved += per_doc.dp_time_us != want.dp_time_us
    assert moved == 8


def test_a_profile_says_whole_buffer_in_compute():
    prof, per_doc_cost, cost = _cpu_whole()
    back = profile_file.to_dict(cost)
    assert back["compute"]["whole_buffer"] is True
    assert "whole_buffer" not in profile_file.to_dict(per_doc_cost)["compute"]
    assert profile_file.from_dict({**back, "model": prof.data["model"]}).whole_buffer
    bad = {**prof.data, "compute": {**prof.data["compute"], "whole_buffer": 1}}
    with pytest.raises(ValueError, match=r"\[compute\] whole_buffer must be true or false, got 1"):
        profile_file.from_dict(bad, where="p.toml")
    # A job's activation-checkpointing mode replaces the fit, not the kernel's shape of work.
    d = {**prof.data, "compute": {**prof.data["compute"], "whole_buffer": True}}
    assert Profile(d, "p.toml").under_mode("selective").cost_model().whole_buffer
