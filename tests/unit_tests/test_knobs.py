"""Each knob resolved once (issue 26 item 3): the policy is one Policy from one
registry, the over-length limit is data computed from one Capacity, and a
knob's default is written once."""

from dataclasses import fields

import pytest

from skrull_ext import _core
from skrull_ext.data.steps.overlength import LengthLimit, capacity_limit, row_limit, scheduler_limit
from skrull_ext.scheduler import Scheduler
from skrull_ext.scheduler.capacity import Capacity
from skrull_ext.scheduler.config import POLICIES, SchedulerConfig, SchedulingOptions, resolve_policy
from skrull_ext.sim import policies as sim_policies


def test_a_config_resolves_its_policy_once_into_the_registrys_object():
    for name, policy in POLICIES.items():
        assert policy.name == name
        assert SchedulerConfig(policy=name).policy_spec is policy
    assert resolve_policy("skrull-pool").pool is True
    with pytest.raises(ValueError, match=r"^policy must be one of \['skrull', 'skrull-fast', 'skrull-paper', "
                                         r"'skrull-per-rank', 'skrull-pool', 'worstfit'\], got 'fifo'$"):
        SchedulerConfig(policy="fifo")


def test_the_resolved_policy_reaches_the_core_options():
    opt = SchedulerConfig(dp=2, cp=4, bucket_size=512, policy="worstfit", timeline="lockstep").core_options()
    assert (opt.placement, opt.rollback, opt.micro_batch_count) == (
        _core.Placement.WORST_FIT, _core.Rollback.SHORTEST, _core.MicroBatchCount.SMALLEST_FEASIBLE)
    assert (opt.dp, opt.cp, opt.bucket_size, opt.slot_gds, opt.refine) == (2, 4, 512, False, False)


def test_the_simulator_takes_the_schedulers_policies_from_its_registry():
    assert list(sim_policies.SCHEDULER) == list(POLICIES)
    for name, policy in POLICIES.items():
        sim = sim_policies.SIM_POLICIES[name]
        assert (sim.description, sim.pool, sim.world) == (policy.description, policy.pool, policy.pool)
    others = set(sim_policies.BASELINES) | set(sim_policies.VARIANTS)
    assert not others & set(POLICIES)
    assert set(sim_policies.SIM_POLICIES) == others | set(POLICIES)
    assert set(sim_policies.BASELINES) == {"baseline", "unpacked", "sorted", "chunkflow", "chunkflow+whole"}


def test_capacity_gives_the_limit_of_a_group_or_the_pool():
    group = Capacity(bucket_size=256, cp=2, dp=2)
    pool = Capacity(bucket_size=256, cp=2, dp=2, pool=True)
    assert (group.ranks, group.limit, group.group_limit, group.label, group.holder) == (
        2, 512, 512, "bucket_size 256 x cp 2", "a CP group")
    assert (pool.ranks, pool.limit, pool.group_limit, pool.label, pool.holder) == (
        4, 1024, 512, "bucket_size 256 x dp 2 x cp 2", "the pool")
    assert Capacity(bucket_size=11, cp=4).limit == 40  # zigzag shards: 2 x 4 x floor(11 / 2)
    assert Scheduler(SchedulerConfig(dp=2, cp=2, bucket_size=256, policy="skrull-pool")).job.capacity == pool
    assert Scheduler(SchedulerConfig(dp=2, cp=2, bucket_size=256, policy="skrull")).job.capacity == group


def test_the_length_limit_is_data_and_its_messages_come_from_it():
    job = Scheduler(SchedulerConfig(dp=2, cp=2, bucket_size=256, policy="skrull-pool", overlength="drop")).job
    pool = scheduler_limit(job, None)
    assert pool == LengthLimit(1024, "drop", "capacity", Capacity(256, 2, 2, True))
    assert pool.too_long() == "longer than the 1024 tokens the pool can hold (bucket_size 256 x dp 2 x cp 2)"
    assert pool.fix().startswith("raise skrull.bucket_size or parallelism.context_parallel_degree")
    capped = capacity_limit(Capacity(256, 2), "error", 100)
    assert capped == LengthLimit(100, "error", "max_len") and capped.source == "dataloader.max_len 100"
    assert capped.too_long() == "longer than dataloader.max_len 100"
    row = row_limit(2048, "truncate", 4096)
    assert (row.tokens, row.by, row.source) == (2048, "row", "training.seq_len 2048")
    assert row.too_long() == "longer than a row (training.seq_len 2048)"
    assert row.fix().startswith("raise training.seq_len")


def test_core_options_sets_every_knob_python_declares():
    """The C++ Options defaults never decide a Python run: each field a Python knob maps
    to is set from the config, whatever the C++ default."""
    cfg = SchedulerConfig(dp=3, cp=2, bucket_size=77, max_extra_micro_batches=5, overlength="drop",
                          policy="skrull-paper", timeline="free")
    opt = cfg.core_options()
    assert (opt.dp, opt.cp, opt.bucket_size, opt.max_extra_micro_batches) == (3, 2, 77, 5)
    assert (opt.overlength, opt.timeline) == (_core.Overlength.DROP, _core.Timeline.FREE_RUNNING)
    assert opt.dacp_search == _core.DacpSearch.HEURISTIC and opt.slot_gds is False
    knobs = {f.name for f in fields(SchedulingOptions) if f.init}
    assert knobs == {"bucket_size", "policy", "overlength", "cpsat", "cpsat_margin", "cpsat_deterministic_time",
                     "max_extra_micro_batches", "lookahead"}
    # lookahead is no Options field: the core's window is the number of global batches it is given.
    assert not hasattr(opt, "lookahead")
