"""The scheduling dataloader under ``[skrull] lookahead`` (data/steps/loader.py):
each window's samples are those of its global batches, each once, each step
keeping its count; every rank gets the same steps; the loss divisor is the
window's mean; a loader resumed inside a window continues the uninterrupted
one exactly."""

import pytest

from skrull_ext.data.steps.loader import SkrullDataLoader
from skrull_ext.scheduler import Scheduler, cost_model
from skrull_ext.scheduler.config import SchedulerConfig
from skrull_ext.train.plan_log import buffers_digest
from skrull_ext.train.job.skrull_config import SkrullConfig

GBS = 16


def loader(lookahead: int, dp: int = 2, dp_rank: int = 0, prefetch: int = 0, cp: int = 1, cp_rank: int = 0):
    section = SkrullConfig(bucket_size=512, cost_model="h100-assumed", lookahead=lookahead)
    config = SkrullDataLoader.Config(length_scale=32.0, max_len=512, global_batch_size=GBS, vocab_size=2048,
                                     prefetch_steps=prefetch)
    out = config.build(dp_world_size=dp, dp_rank=dp_rank)
    out.attach(Scheduler(section.scheduler_config(dp, cp), cost_model.preset("llama3-debug")), cp_rank, cp)
    return out


def key(step):
    return step.step, list(step.samples), step.plan.digest(), buffers_digest(step.micro_batches), step.loss_tokens


def test_lookahead_must_be_a_positive_integer_up_to_the_limit():
    for bad in (0, -1, 1025, 2.0, True):
        with pytest.raises(ValueError, match=r'^skrull\.lookahead must be an integer in \[1, 1024\] or "auto" '
                                             r"\(chosen from the data\), got "):
            SkrullConfig(lookahead=bad)
    assert SkrullConfig().lookahead == "auto" and SkrullConfig(lookahead=1).lookahead == 1  # a job's default: auto
    assert SchedulerConfig().lookahead == 1  # a library user's: none
    # A library SchedulerConfig has no data to choose from.
    with pytest.raises(ValueError, match=r"^lookahead must be an integer in \[1, 1024\], got 'auto'$"):
        SchedulerConfig(lookahead="auto")


@pytest.mark.parametrize("w", [2, 4])
def test_windows_train_their_own_samples_once_with_each_steps_count(w):
    ld = loader(w)
    steps = [ld.next_step() for _ in range(2 * w)]
    src = ld.source
    assert [s.step for s in steps] == list(range(1, 2 * w + 1))
    moved = 0
    for first in range(0, 2 * w, w):
        window = steps[first : first + w]
        arrived = {s.step: src.global_batch(s.step, GBS) for s in window}
        trained = [i for s in window for i in s.samples]
        assert sorted(trained) == sorted(i for b in arrived.values() for i in b)  # each sample once
        assert all(len(s.samples) == len(arrived[s.step]) for s in window)  # nothing skipped here: GBS each
        when = {i: a for a, b in arrived.items() for i in b}
        delays = [abs(s.step - when[i]) for s in window for i in s.samples]
        assert max(delays) <= w - 1
        summary = window[0].window
        assert all(s.window == summary for s in window) and summary.width == w and summary.index == first // w
        assert summary.max_delay == max(delays) and summary.moved == sum(d > 0 for d in delays)
        assert summary.window_us <= summary.arrival_window_us
        moved += summary.moved
        # The loss divisor: the window's mean loss tokens per step, on every step of it.
        mean = sum(s.global_valid_tokens for s in window) / w
        assert all(s.loss_tokens == pytest.approx(mean) for s in window)
    assert moved > 0  # these batches do regroup (a long sample per batch, lockstep DP 2)


def test_a_tokens_weight_does_not_depend_on_its_step():
    # Token weights 1 / loss_tokens: the same for every step of a window, so any regrouping of its samples
    # gives the window the same total weight per sample; without look-ahead a step's own count decides it.
    ld, plain = loader(4), loader(1)
    steps, own = [ld.next_step() for _ in range(4)], [plain.next_step() for _ in range(4)]
    assert len({s.loss_tokens for s in steps}) == 1
    assert [s.loss_tokens for s in own] == [s.global_valid_tokens for s in own]
    assert sum(s.global_valid_tokens for s in steps) == sum(s.global_valid_tokens for s in own)


def test_lookahead_one_is_the_plain_loader():
    # Each step trains its own global batch in read order, its loss divided by its own loss tokens (an int).
    ld = loader(1)
    for _ in range(3):
        s = ld.next_step()
        assert s.samples == ld.source.global_batch(s.step, GBS) and s.window is None
        assert s.loss_tokens == s.global_valid_tokens and isinstance(s.loss_tokens, int)


def test_every_rank_and_prefetch_agree():
    ranks = [loader(4, dp_rank=d, prefetch=p) for d, p in ((0, 0), (1, 0), (0, 2), (1, 3))]
    for _ in range(6):
        got = [ld.next_step() for ld in ranks]
        assert len({(s.step, tuple(s.samples), s.plan.digest(), s.loss_tokens) for s in got}) == 1
    for ld in ranks:
        ld.close()


@pytest.mark.parametrize("stop", [1, 2, 3, 5])
def test_resume_inside_a_window_continues_the_uninterrupted_run(stop):
    whole = loader(4)
    want = [key(whole.next_step()) for _ in range(8)]
    first = loader(4, prefetch=2)
    for _ in range(stop):
        first.next_step()
    state = first.state_dict()
    first.close()
    resumed = loader(4)
    resumed.load_state_dict(state)
    got = [key(resumed.next_step()) for _ in range(8 - stop)]
    assert got == want[stop:]
    assert resumed.account.totals.as_dict() == whole.account.totals.as_dict()


def test_the_log_says_what_the_window_did():
    from skrull_ext.train.step_checks import step_log_line, step_metrics

    step = loader(4).next_step()
    m = step_metrics(step, [])
    w = step.window
    assert (m["skrull/lookahead_moved"], m["skrull/lookahead_max_delay"]) == (w.moved, w.max_delay)
    assert m["skrull/lookahead_saved_ms"] == pytest.approx((w.arrival_window_us - w.window_us) / 1e3)
    line = step_log_line(1, m)
    assert f"look-ahead window 0: {w.moved} samples moved, largest delay {w.max_delay} steps, predicted" in line
    assert "skrull/lookahead_moved" not in step_metrics(loader(1).next_step(), [])


@pytest.mark.parametrize("old,new,stop", [(4, 2, 2), (4, 2, 4), (2, 4, 3), (4, 8, 5), (4, 1, 1), (1, 4, 3)])
def test_resume_with_another_width_finishes_its_window_and_trains_every_sample_once(old, new, stop, caplog):
    whole = loader(old)
    before = [key(whole.next_step()) for _ in range(8)]
    first = loader(old)
    for _ in range(stop):
        first.next_step()
    state = first.state_dict()
    resumed = loader(new)
    with caplog.at_level("INFO"):
        resumed.load_state_dict(state)
    finish = first.windows.window(stop + 1).last if stop % old else stop  # the window it stopped in
    end = resumed.windows.window(16).last  # whole windows of the new width
    steps = [resumed.next_step() for _ in range(end - stop)]
    # The window it stopped in is the uninterrupted run's; the new width from the step after it.
    assert [key(s) for s in steps[: finish - stop]] == before[stop:finish]
    assert all((s.window.width if s.window else 1) == new for s in steps[finish - stop :])
    # Every sample of global batches 1..end once, each step its own count (nothing is skipped here).
    trained = [i for s in steps for i in s.samples] + [i for step in range(1, stop + 1) for i in _trained(old, step)]
    assert sorted(trained) == list(range(end * GBS)) and all(len(s.samples) == GBS for s in steps)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("skrull.lookahead")]
    assert said == [f"skrull.lookahead {new}: the checkpoint of step {stop} has look-ahead windows of {old} "
                    f"step{'s' * (old > 1)} from step 1; this run goes on with windows {resumed.windows.describe()} (the window holding "
                    "the next step is finished as it was begun: docs/design/lookahead.md)"]


def _trained(width: int, step: int) -> list[int]:
    """Samples an uninterrupted run at ``width`` trains at ``step``."""
    ld = loader(width)
    for _ in range(step - 1):
        ld.next_step()
    return list(ld.next_step().samples)


def test_a_checkpoint_of_torchtitans_batching_starts_windows_at_the_next_step():
    state = loader(1).state_dict()
    state.update(step=3, lookahead="[]")
    resumed = loader(4)
    resumed.load_state_dict(state)
    assert resumed.windows.regimes == ((1, 1), (4, 4))
    steps = [resumed.next_step() for _ in range(4)]
    assert sorted(i for s in steps for i in s.samples) == list(range(3 * GBS, 7 * GBS))
    assert steps[0].window.index == 3  # steps 1..3 were windows of one


def _cutting_loader(lookahead: int):
    """GBS 16 at DP 2 with BucketSize 256: the 512-token samples are cut (truncate)."""
    section = SkrullConfig(bucket_size=256, cost_model="h100-assumed", lookahead=lookahead, overlength="truncate")
    config = SkrullDataLoader.Config(length_scale=32.0, max_len=512, global_batch_size=GBS, vocab_size=2048,
                                     prefetch_steps=0)
    out = config.build(dp_world_size=2, dp_rank=0)
    out.attach(Scheduler(section.scheduler_config(2, 1), cost_model.preset("llama3-debug")), 0, 1)
    return out


@pytest.mark.parametrize("w", [4, 8])
def test_counts_follow_the_step_that_trains_a_sample(w):
    # Under look-ahead a step counts (and names the cuts of) the samples it trains, not those that
    # arrived in it: a run stopped after any step of a window has counted exactly what it trained.
    ld, plain = _cutting_loader(w), _cutting_loader(1)
    trained, cut_named = [], []
    for _ in range(w):
        s = ld.next_step()
        trained += s.samples
        cut_named += [e.index for e in s.account.events if e.kept]
        c = ld.account.totals
        assert c.whole + c.cut == len(trained) and c.read == len(trained) + c.skipped
        assert s.account.counts.whole + s.account.counts.cut == len(s.samples)
        assert s.totals == c.as_dict()
        assert sorted(cut_named) == sorted(i for i in trained if ld.source.length(i) > 256)
    assert cut_named  # the window does cut some
    for _ in range(w):
        plain.next_step()
    # Over a whole window the counts are those of its global batches, as without look-ahead.
    assert ld.account.totals.as_dict() == plain.account.totals.as_dict()
    assert any(s.window.moved for s in [ld.next_step()])  # and the samples did move
