"""``Windows``: which steps form each look-ahead window, across launches.

A run under ``[skrull] lookahead = W`` trains its steps in windows of W: the
samples of global batches f..f+W-1 are regrouped over steps f..f+W-1
(data/steps/loader.py). A window is a function of its first step and its width
only, so every rank, and a run resumed inside a window, makes the same one.

A run resumed with another W cannot simply cut the steps by the new width: the
window holding the next step was regrouped by the old width, so some of its
samples may already be trained and others still owed. ``Windows`` is the list
of (first step, width) regimes the run has used; a new width starts where the
old window holding the next step ends, so the windows still partition the
steps and every sample is trained exactly once (tests/unit_tests/test_windows.py).
It is checkpointed with the dataloader (``"lookahead"``: its JSON).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from skrull_ext.data.steps.accounting import StepAccount


@dataclass(frozen=True)
class Window:
    """Steps ``first`` .. ``first + width - 1``, the ``index``-th window of the run (0-based)."""

    index: int
    first: int
    width: int

    @property
    def last(self) -> int:
        return self.first + self.width - 1


@dataclass(frozen=True)
class Windows:
    """The run's look-ahead regimes: from step ``regimes[i][0]`` on, windows of ``regimes[i][1]``
    steps (the first regime starts at step 1; each later one at a window boundary of the one before)."""

    regimes: tuple[tuple[int, int], ...] = ((1, 1),)

    def __post_init__(self) -> None:
        if not self.regimes or self.regimes[0][0] != 1:
            raise ValueError(f"look-ahead regimes must start at step 1, got {self.regimes!r}")
        for (f0, w0), (f1, w1) in zip(self.regimes, self.regimes[1:]):
            if w0 < 1 or f1 <= f0 or (f1 - f0) % w0:
                raise ValueError(f"look-ahead regime ({f1}, {w1}) does not start at a window boundary of "
                                 f"({f0}, {w0})")
        if self.regimes[-1][1] < 1:
            raise ValueError(f"look-ahead width must be >= 1, got {self.regimes!r}")

    @classmethod
    def of(cls, width: int) -> Windows:
        """Windows of ``width`` steps from step 1."""
        return cls(((1, width),))

    @property
    def width(self) -> int:
        """The width new windows get (the last regime's)."""
        return self.regimes[-1][1]

    def window(self, step: int) -> Window:
        """The window holding 1-based ``step``."""
        if step < 1:
            raise ValueError(f"steps are 1-based, got {step}")
        index = 0
        for k, (first, width) in enumerate(self.regimes):
            nxt = self.regimes[k + 1][0] if k + 1 < len(self.regimes) else None
            if nxt is not None and step >= nxt:
                index += (nxt - first) // width
                continue
            j = (step - first) // width
            return Window(index + j, first + j * width, width)
        raise AssertionError("unreachable: the last regime has no end")

    def end(self, steps: int) -> int:
        """The last step whose global batch a run of ``steps`` steps reads: the end of the window
        holding its last step (past ``steps`` when the run stops inside a window). The one place
        that says where a window ends: the start-up checks, the look-ahead choice and the loader
        all ask here."""
        return self.window(steps).last

    def left(self, steps: int) -> range:
        """The steps of the window holding step ``steps`` that come after it: a run of ``steps``
        steps reads their global batches (the window regroups them) but never trains them.
        Empty when ``steps`` ends a window."""
        return range(steps + 1, self.end(steps) + 1)

    def switch(self, done: int, width: int) -> Windows:
        """These windows continued with ``width`` after a checkpoint of step ``done``: the window
        holding step ``done + 1`` keeps its width (it was regrouped by it, and may have trained
        samples that arrived in its later steps); ``width`` applies from the step after it."""
        w = self.window(done + 1)
        if width == w.width == self.width:
            return self
        start = w.first if w.first == done + 1 else w.last + 1
        kept = tuple(r for r in self.regimes if r[0] < start)
        if not kept or kept[-1][1] == width:
            return Windows(kept or ((1, width),))
        return Windows(kept + ((start, width),))

    def describe(self) -> str:
        """'of 8 steps from step 1, of 4 from step 9'."""
        unit = lambda k, w: "" if k else " step" if w == 1 else " steps"  # noqa: E731
        return ", ".join(f"of {w}{unit(k, w)} from step {f}" for k, (f, w) in enumerate(self.regimes))

    def to_json(self) -> str:
        """The checkpoint's form; "[]" for no look-ahead ever, as torchtitan's batching writes."""
        return "[]" if self == Windows() else json.dumps([list(r) for r in self.regimes])

    @classmethod
    def from_json(cls, text: str, where: str = "the checkpoint's dataloader.lookahead") -> Windows:
        try:
            regimes = tuple((int(f), int(w)) for f, w in json.loads(text))
            return cls(regimes) if regimes else cls()
        except (ValueError, TypeError) as e:
            raise ValueError(f"{where}: {text!r} is not a list of [first step, width] regimes, each starting "
                             f"at a window boundary of the one before ({e})") from None


@dataclass(frozen=True)
class LookaheadWindow:
    """A look-ahead window as the loader made it: its samples by the step that trains them and
    what the regrouping did (logged on each of its steps: ``skrull/lookahead_*``). Which steps
    it spans is ``Windows``' answer (above); this is what its steps train (data/steps/loader.py makes it)."""

    index: int
    """Window number, counted from the run's first (``Window.index``)."""
    first: int
    """Its first step."""
    width: int
    """W, its number of steps."""
    samples: list[list[int]]
    """Per step of the window: the source indices it trains (arrival order within a step)."""
    lengths: list[list[int]]
    """The same samples' trained lengths."""
    losses: list[list[int]]
    """The same samples' loss tokens."""
    accounts: list[StepAccount]
    """Per step: what it counts (accounting.by_training_step: a trained sample at the step that
    trains it, a skipped one at the step it arrived in)."""
    chunked: list[list[tuple[int, int, int]]]
    """Per step: (source index, length, loss tokens) of the samples over the limit that ``overlength =
    "chunk"`` trains whole in chunks, outside the plans' micro-batches and the regrouping (at the
    step they arrived in; the regrouping and the step's plan price them there)."""
    moved: int = 0
    """Samples trained at another step than they arrived in."""
    max_delay: int = 0
    """Largest distance in steps between a sample's arrival and its training (<= W-1)."""
    window_us: float = 0.0
    """The window's predicted time as regrouped (sum of its steps; the core's ``Lookahead``
    field of the same name, as the two below)."""
    arrival_window_us: float = 0.0
    """The same in arrival order: what the window would take without look-ahead."""
    elapsed_us: float = 0.0
    """Wall time of the core's regrouping."""

    @property
    def last(self) -> int:
        return self.first + self.width - 1

    @property
    def saved_us(self) -> float:
        return self.arrival_window_us - self.window_us

    @property
    def loss_tokens(self) -> float:
        """Mean loss tokens per step of the window (chunked samples' included)."""
        return (sum(map(sum, self.losses)) + sum(c for step in self.chunked for _, _, c in step)) / len(self.losses)

    def trained_after(self, step: int) -> list[int]:
        """The samples the window trains after ``step``: those a run that stops at ``step`` leaves."""
        return [i for j in range(max(0, step + 1 - self.first), self.width) for i in self.samples[j]]
