"""Over-length sequences: the start-up pre-scan and the dataloader's counts
(synthetic data; the real-text accounting is test_accounting.py)."""

import pytest

from skrull_ext.data.steps.overlength import OverlengthError, check_overlength, scan_overlength
from skrull_ext.data.steps.loader import SkrullDataLoader
from skrull_ext.scheduler import Scheduler, cost_model
from skrull_ext.train.job.skrull_config import SkrullConfig

GBS = 8


def _loader(policy="error", cp=1, bucket=256):
    config = SkrullDataLoader.Config(length_scale=32.0, max_len=512, global_batch_size=GBS, vocab_size=2048)
    loader = config.build(dp_world_size=1, dp_rank=0)
    section = SkrullConfig(bucket_size=bucket, cost_model="h100-assumed", overlength=policy)
    loader.attach(Scheduler(section.scheduler_config(1, cp, lookahead=1), cost_model.preset("llama3-debug")), 0, cp)
    return loader


def test_scan_finds_exactly_the_long_samples():
    loader = _loader()
    report = scan_overlength(loader, 1, 10)
    src = loader.source
    want = [(s, i, src.length(i)) for s in range(1, 11) for i in src.global_batch(s, GBS) if src.length(i) > 256]
    assert want and report.over == want and report.scanned == 10 * GBS


def test_a_bound_that_fits_needs_no_scan():
    report = scan_overlength(_loader(cp=2), 1, 1000)
    assert report.bound == 512 and report.scanned == 0 and not report.over
    assert report.limit.tokens == 512 and report.limit.source == "bucket_size 256 x cp 2"


def test_error_fails_naming_sample_step_length_and_limit():
    loader = _loader()
    step, index, length = scan_overlength(loader, 1, 10).over[0]
    with pytest.raises(OverlengthError) as e:
        check_overlength(loader, 1, 10)
    assert str(e.value).startswith(
        f"sample {index} (step {step}) has length {length}, longer than the 256 tokens a CP group "
        "can hold (bucket_size 256 x cp 1)"
    )
    # the way to keep the sample whole is named too, not only the two that cut or drop it
    assert "or set skrull.overlength to 'chunk' (trained whole, in chunks), 'truncate' or 'drop'" in str(e.value)


@pytest.mark.parametrize("policy", ["truncate", "drop"])
def test_dataloader_counts_what_the_policy_did(policy):
    loader = _loader(policy)
    report = check_overlength(loader, 1, 4)  # logs, does not raise
    what = "cut" if policy == "truncate" else "skipped_overlength"
    steps = [loader.next_step() for _ in range(4)]
    per_step = [getattr(s.account.counts, what) for s in steps]
    assert sum(per_step) == len(report.over) > 0
    assert [s.totals[what] for s in steps] == [sum(per_step[: k + 1]) for k in range(4)]
    for n, s in enumerate(steps, 1):
        events = s.account.events
        # The policy ran before the scheduler: the plan holds only what is trained, none of it too long.
        assert not s.plan.truncated and not s.plan.dropped
        assert max(s.plan.input_lengths) <= 256 and len(s.samples) == GBS - s.account.counts.skipped
        assert sorted(e.index for e in events) == sorted(i for st, i, _ in report.over if st == n)
        assert all(e.kept == (256 if policy == "truncate" else 0) for e in events)
    # The totals are checkpointed with the step.
    fresh = _loader(policy)
    fresh.load_state_dict(loader.state_dict())
    assert fresh.step == 4 and fresh.account.totals == loader.account.totals


def test_the_limit_is_the_batching_or_max_len_whichever_is_smaller():
    from skrull_ext import _core
    from skrull_ext.data.steps.overlength import scheduler_limit
    from skrull_ext.scheduler import Scheduler
    from skrull_ext.scheduler.config import SchedulerConfig

    group = scheduler_limit(Scheduler(SchedulerConfig(dp=2, cp=2, bucket_size=256, overlength="drop")).job, None)
    assert (group.tokens, group.source, group.mode) == (_core.max_sequence_length(256, 2), "bucket_size 256 x cp 2",
                                                        "drop")
    pool = scheduler_limit(Scheduler(SchedulerConfig(dp=2, cp=2, bucket_size=256, policy="skrull-pool")).job, None)
    assert (pool.tokens, pool.source) == (_core.max_sequence_length(256, 4), "bucket_size 256 x dp 2 x cp 2")
    assert pool.too_long() == f"longer than the {pool.tokens} tokens the pool can hold (bucket_size 256 x dp 2 x cp 2)"
    capped = scheduler_limit(Scheduler(SchedulerConfig(dp=2, cp=2, bucket_size=256)).job, 100)
    assert (capped.tokens, capped.source) == (100, "dataloader.max_len 100")
    assert scheduler_limit(Scheduler(SchedulerConfig(dp=1, cp=2, bucket_size=256)).job, 4096).tokens == group.tokens


@pytest.mark.parametrize("policy, verb", [("truncate", "cut"), ("drop", "drop")])
def test_a_bucket_size_that_cuts_most_sequences_is_refused(policy, verb):
    """--skrull.bucket_size 10 cut 16 of 16 samples and trained on stubs: refused at the
    pre-scan, naming the counts and the smallest bucket_size keeping half whole."""
    loader = _loader(policy, bucket=10)
    report = scan_overlength(loader, 1, 2)
    assert len(report.over) == report.scanned == 2 * GBS
    with pytest.raises(OverlengthError) as e:
        check_overlength(loader, 1, 2)
    message = str(e.value)
    assert message.startswith(
        f"skrull.bucket_size = 10 would {verb} 16 of the 16 sequences of steps 1..2 (longer than 10 tokens, "
        f"bucket_size 10 x cp 1; skrull.overlength = {policy!r}): the run would train on stubs. A Skrull run "
        f"refuses a BucketSize that {verb}s more than half of its sequences; bucket_size ")
    assert "\n" not in message
    keeps = int(message.split("; bucket_size ")[1].split()[0])
    # The suggestion holds: with it at most half are over-length, with one token less more than half.
    for bucket, refused in ((keeps, False), (keeps - 1, True)):
        scan = scan_overlength(_loader(policy, bucket=bucket), 1, 2)
        assert (2 * len(scan.over) > scan.scanned) == refused, (bucket, len(scan.over))
    check_overlength(_loader(policy, bucket=keeps), 1, 2)  # logs the cuts, does not raise


def test_the_stub_rule_counts_ranks_and_leaves_max_len_and_error_alone():
    from skrull_ext.data.steps.overlength import OverlengthScan, capacity_limit, stub_refusal
    from skrull_ext.scheduler.capacity import Capacity

    over = [(1, i, 100 + i) for i in range(5)]
    pool = OverlengthScan(capacity_limit(Capacity(10, cp=2, dp=2, pool=True), "truncate", None), 1, 1, None, 8, over)
    message = stub_refusal(pool)
    assert ("would cut 5 of the 8 sequences of steps 1..1 (longer than 40 tokens, bucket_size 10 x dp 2 x cp 2;"
            in message)
    assert "bucket_size 26 keeps at least half whole" in message  # 4 ranks x 26 hold 104 >= 100; x 25: 96
    assert stub_refusal(OverlengthScan(pool.limit, 1, 1, None, 10, over)) is None  # exactly half: trained
    max_len = capacity_limit(Capacity(1000), "truncate", 10)  # the user's own SFT cut
    assert stub_refusal(OverlengthScan(max_len, 1, 1, None, 8, over)) is None
    error = capacity_limit(Capacity(10), "error", None)  # 'error' names the first offender instead
    assert stub_refusal(OverlengthScan(error, 1, 1, None, 8, over)) is None


def test_the_held_out_set_is_counted_in_validation_batches(caplog):
    """The validation loader's over-length line said "sequences of steps 1..2" and "(step 1)":
    its batches, read as the run's first training steps."""
    loader = _loader("truncate")
    loader.step_unit = "validation batch"  # what train/validation.py's loader says it counts
    report = check_overlength(loader, 1, 10)
    (line,) = [r.getMessage() for r in caplog.records if "Skrull over-length" in r.getMessage()]
    step, index, _ = report.over[0]
    assert f"of {10 * GBS} sequences of validation batches 1..10 are longer than 256 tokens" in line
    assert f"first: sample {index} (validation batch {step})" in line
    with pytest.raises(OverlengthError, match=r"\(validation batch \d+\) has length .* sequences of validation "
                                              r"batches 1\.\.10 are over-length\)"):
        check_overlength(_loader_with_unit("error"), 1, 10)


def _loader_with_unit(policy):
    loader = _loader(policy)
    loader.step_unit = "validation batch"
    return loader
