"""``[skrull] lookahead = "auto"`` (data/steps/lookahead_choice.py): the rule on given gains,
the gains as the core prices the windows, and the choice on data where the answer is
known (nothing to trade; a long sample in every other global batch)."""

import pytest

from skrull_ext.data.steps import lookahead_choice
from skrull_ext.data.steps.lookahead_choice import choose, horizon, pick
from skrull_ext.scheduler import Scheduler, cost_model
from skrull_ext.scheduler.config import SchedulerConfig


def scheduler(dp: int = 2, timeline: str = "lockstep") -> Scheduler:
    return Scheduler(SchedulerConfig(dp=dp, cp=1, bucket_size=2048, timeline=timeline),
                     cost_model.preset("llama3-debug"))


def test_the_rule_takes_the_smallest_width_near_the_best_if_the_best_pays():
    assert pick({2: 1.04, 4: 1.049, 8: 1.0}) == 1  # nothing reaches x1.05
    assert pick({2: 1.10, 4: 1.20, 8: 1.21}) == 4  # 1.20 is within 2% of 1.21
    assert pick({2: 1.20, 4: 1.10, 8: 1.30}) == 8
    assert pick({2: 1.05, 4: 1.05, 8: 1.05}) == 2
    assert pick({}) == 1


def test_the_horizon_holds_whole_windows_of_every_candidate():
    assert [horizon(n) for n in (1, 8, 9, 40, 64, 1000)] == [8, 8, 16, 40, 64, 64]
    assert [horizon(n, (2, 4)) for n in (2, 5, 6, 7)] == [4, 8, 8, 8]  # the widths a short run prices
    assert horizon(3, (2,)) == 4
    assert all(horizon(n) % w == 0 for n in (1, 13, 77) for w in lookahead_choice.CANDIDATES)


def test_equal_lengths_leave_nothing_to_trade():
    choice = choose(lambda s: [64] * 8, scheduler().lookahead, 16)
    assert choice.width == 1 and choice.gains == {2: 1.0, 4: 1.0, 8: 1.0} and choice.steps == 16
    assert choice.line().startswith("skrull.lookahead auto: 1 (no width is predicted x1.05 faster than none). "
                                    "Predicted over no look-ahead on the samples of steps 1..16 by the job's cost "
                                    "model: W 2 x1.000, W 4 x1.000, W 8 x1.000 (best x1.000; chosen in ")


@pytest.mark.parametrize("timeline", ["lockstep", "free"])
def test_a_long_sample_in_every_other_batch_is_paired_with_the_next_one(timeline):
    # DP 2: a step with one long sample keeps the other rank waiting; two such steps' long samples
    # trained in one step (one per rank) save about one long sample's time per pair.
    batches = {s: [2000] + [16] * 7 if s % 2 else [16] * 8 for s in range(1, 17)}
    sched = scheduler(timeline=timeline)
    choice = choose(batches.__getitem__, sched.lookahead, 16)
    for w, gain in choice.gains.items():  # the gains are the core's windows, summed
        windows = [sched.lookahead([batches[s] for s in range(f, f + w)]) for f in range(1, 17, w)]
        assert gain == pytest.approx(sum(a.arrival_window_us for a in windows) / sum(a.window_us for a in windows))
    assert choice.gains[2] == pytest.approx(1.0)  # a window of 2 holds one long sample: nothing to pair
    assert choice.gains[4] > 1.25 and choice.gains[8] == pytest.approx(choice.gains[4])  # 4 already pairs them all
    assert choice.width == 4  # the smallest of the best
    assert "skrull.lookahead auto: 4 (the smallest width within 2% of the best; samples trained at most 3 steps " \
           "after they arrive)" in choice.line()


def test_a_gain_under_the_threshold_is_not_taken():
    # The same pattern with shorter long samples: pairing them is predicted x1.047, under x1.05.
    batches = {s: [480] + [16] * 7 if s % 2 else [16] * 8 for s in range(1, 17)}
    choice = choose(batches.__getitem__, scheduler().lookahead, 16)
    assert 1.0 < max(choice.gains.values()) < lookahead_choice.MIN_GAIN and choice.width == 1


def test_a_width_wider_than_the_run_is_capped_at_its_steps():
    assert lookahead_choice.within_run(4, 6) == (4, None) and lookahead_choice.within_run(5, 5) == (5, None)
    width, line = lookahead_choice.within_run(1024, 2)
    assert width == 2 and line == (
        "skrull.lookahead 1024 is wider than the run (training.steps 2): capped at 2, so the run is one window and "
        "trains every sample it reads (a window of 1024 would read 1022 global batches it never trains; "
        "docs/design/lookahead.md)")


def test_chunked_documents_are_priced_with_their_steps():
    # overlength = "chunk": a document beyond the limit (2048) in every other step, on one DP rank; the
    # long samples of the other steps can move beside it, onto the other rank, only if the pricing sees it.
    batches = {s: [16] * 8 if s % 2 else [1500] + [16] * 7 for s in range(1, 17)}
    documents = {s: [6000] if s % 2 else [] for s in range(1, 17)}
    sched = scheduler(timeline="free")
    choice = choose(batches.__getitem__, sched.lookahead, 16, chunked_of=documents.__getitem__)
    for w, gain in choice.gains.items():  # each window priced with its steps' documents
        windows = [sched.lookahead([batches[s] for s in range(f, f + w)], [documents[s] for s in range(f, f + w)])
                   for f in range(1, 17, w)]
        assert gain == pytest.approx(sum(a.arrival_window_us for a in windows) / sum(a.window_us for a in windows))
    # Seen, a window of 2 already puts each 1,500-token sample beside the previous step's document (x1.056);
    # blind, the pricing pairs the long samples with each other (W 4, x1.21), which the documents' steps undo.
    blind = choose(batches.__getitem__, sched.lookahead, 16)
    assert choice.width == 2 and choice.gains[2] == pytest.approx(choice.gains[8]) and choice.gains[2] > 1.05
    assert blind.width == 4 and blind.gains[2] == pytest.approx(1.0)
