"""``[skrull] lookahead = "auto"``: the window width the job's own cost model says pays.

Look-ahead pays where a global batch holds a few long sequences among many
short ones, and next to nothing where long ones are the bulk or so rare that a
window seldom holds two (docs/benchmarks.md, section 16). Which case a job is
in depends on its data, its DP x CP and its hardware, all of which the job
already describes: so the choice is made the way ``bench simulate
--lookahead`` makes its table. The run's first global batches (up to
``HORIZON`` steps, limited as training limits them) are regrouped in windows
of each candidate width by the core (``Scheduler.lookahead``, the same call
the dataloader makes) and priced by the job's cost model on its timeline.

The rule: the smallest width whose predicted gain over arrival order is
within ``NEAR_BEST`` of the best candidate's, if that best gain is at least
``MIN_GAIN``; else 1. The smallest, because a wider window delays samples
further (up to W - 1 steps) for little more. ``MIN_GAIN``, because the CPU
measurements of section 16 put the cost model's error on one step's
prediction at tens of percent: a predicted gain of a few percent is not one
a run can count on, and a window is not free (it reorders the data).

The same on every rank (a function of the source, the limits and the core's
deterministic planner), and on a resume with the same ``training.steps``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from skrull_ext._core import Lookahead
from skrull_ext.data.steps.windows import Windows

CANDIDATES: tuple[int, ...] = (2, 4, 8)
"""Widths compared (each divides the largest, so one horizon holds whole windows of each)."""
HORIZON = 64
"""At most this many first global batches are priced (fewer when the run trains fewer steps)."""
MIN_GAIN = 1.05
"""The best candidate must be predicted at least this much faster than arrival order."""
NEAR_BEST = 0.02
"""A smaller width within this fraction of the best gain is taken instead."""


def horizon(training_steps: int, candidates: Sequence[int] = CANDIDATES) -> int:
    """Steps priced: the run's steps rounded up to whole windows of every candidate (each divides
    the widest), at most HORIZON."""
    return min(HORIZON, Windows.of(max(candidates)).end(training_steps))


@dataclass(frozen=True)
class LookaheadChoice:
    """What ``choose`` priced and picked."""

    width: int
    """The chosen width (1: no look-ahead)."""
    gains: dict[int, float]
    """Per candidate width: the predicted time of the priced steps in arrival order over their
    time regrouped in windows of that width."""
    steps: int
    """Global batches priced (steps 1..steps)."""
    elapsed_s: float
    """Wall time of the choice."""

    def line(self) -> str:
        """The log line saying what was chosen and why."""
        gains = ", ".join(f"W {w} x{g:.3f}" for w, g in self.gains.items())
        best = max(self.gains.values())
        if self.width == 1:
            why = f"no width is predicted x{MIN_GAIN:.2f} faster than none"
        else:
            why = (f"the smallest width within {NEAR_BEST:.0%} of the best; samples trained at most "
                   f"{self.width - 1} steps after they arrive")
        return (f"skrull.lookahead auto: {self.width} ({why}). Predicted over no look-ahead on the samples of "
                f"steps 1..{self.steps} by the job's cost model: {gains} (best x{best:.3f}; "
                f"chosen in {self.elapsed_s:.1f} s; docs/design/lookahead.md)")


def within_run(width: int, training_steps: int) -> tuple[int, str | None]:
    """A width no wider than the run, and the line saying it was capped (None: it was not).
    A window wider than ``training.steps`` reads, and plans, global batches the run never
    trains (W = 1024 on a 2-step run planned 1,024 of them for 24.5 s and delayed samples by
    1,005 steps); capped at the run's steps, its one window is the whole run and every
    sample it reads is trained once."""
    if width <= training_steps:
        return width, None
    return training_steps, (f"skrull.lookahead {width} is wider than the run (training.steps {training_steps}): "
                            f"capped at {training_steps}, so the run is one window and trains every sample it "
                            f"reads (a window of {width} would read {width - training_steps} global batches it "
                            "never trains; docs/design/lookahead.md)")


def choose(lengths_of: Callable[[int], Sequence[int]], plan_window: Callable[..., Lookahead],
           steps: int, candidates: Sequence[int] = CANDIDATES,
           chunked_of: Callable[[int], Sequence[int]] | None = None) -> LookaheadChoice:
    """Price the lengths of steps 1..``steps`` (``lengths_of(step)``: the step's global batch as
    training limits it) in windows of each candidate width, each window regrouped by
    ``plan_window`` (``scheduler.plan_window`` of the job, as the dataloader regroups it); pick
    one by the module's rule. ``chunked_of(step)``: the lengths of the step's chunked documents
    (``overlength = "chunk"``), given to ``plan_window`` as its second argument, each window's,
    as the dataloader gives them."""
    begin = time.perf_counter()
    batches = [list(lengths_of(s)) for s in range(1, steps + 1)]
    chunked = None if chunked_of is None else [list(chunked_of(s)) for s in range(1, steps + 1)]
    gains = {}
    for w in candidates:
        arrival = regrouped = 0.0
        for first in range(0, steps, w):
            window = batches[first : first + w]
            a = plan_window(window) if chunked is None else plan_window(window, chunked[first : first + w])
            arrival += a.arrival_window_us
            regrouped += a.window_us
        gains[w] = arrival / regrouped if regrouped > 0 else 1.0
    return LookaheadChoice(pick(gains), gains, steps, time.perf_counter() - begin)


def pick(gains: dict[int, float]) -> int:
    """The module's rule: the smallest width within NEAR_BEST of the best gain, if that is at
    least MIN_GAIN; else 1."""
    best = max(gains.values(), default=1.0)
    if best < MIN_GAIN:
        return 1
    return min(w for w, g in gains.items() if g >= best * (1 - NEAR_BEST))
