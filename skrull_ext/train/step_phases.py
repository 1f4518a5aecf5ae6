"""The phases of a training step, timed: where a step's time goes beside its micro-batches.

A step is more than its micro-batches: the trainer waits for its data, checks
it, runs the micro-batches, clips the gradients, steps the optimizer, logs and
validates. ``PHASES`` is the one list of them, in the order a step runs them; the trainer
(train/trainer.py) wraps each piece of work in ``StepPhases.phase(key)``, and
everything that reads the times (the step line's clause, the TensorBoard
scalars ``skrull/phase_<key>_ms``, the run's closing line, the profiler's
per-step term) goes through this list, never a name of its own.

Clocks: on a GPU each phase is a pair of CUDA events, so the GPU time is
attributed to the phase whose kernels ran (a phase the host leaves before its
kernels finish still owns them); on CPU, ``time.perf_counter``. Events are
read only once they have completed (``Event.query``, which does not wait): a
step's times are taken at the next step's logging, after that step's
finiteness check has read the loss (the host sync every step already has),
so timing adds no synchronisation. Only logged steps are kept (their
TensorBoard scalars then stand beside the step's other ``skrull/*`` ones): the
step line of a logged step gives the previous logged step's phases, whole (its
logging included), step N - 1's with ``metrics.log_freq`` 1; the last logged
step's are read at close.

A step's time as run (``StepTimes.step_ms``) is everything ``train_step`` did
but the data wait, the logging and the validation, which the cost model does
not price (the dataloader's prefetch hides the first, ``metrics.log_freq`` and
``validation.freq`` space the others);
the time between phases that no phase covers (zero_grad, the learning rates'
read) is counted in it as ``rest``. The host's clock is read at every mark too
(``StepTimes.rest_host_ms``, ``skrull/phase_rest_host_ms``, the closing line): on
a GPU, a ``rest`` that the host's gaps match is the device waiting for host work
between the phases; one far above them is the device busy there.

Each phase is also a record_function range, ``skrull/phase_<key>`` (``RANGE``), so
that a torch.profiler trace of a step (torchtitan's ``[profiler]``; ``python -m
skrull_ext.bench trace-report``) gives the GPU time launched in each phase and names
the phase the host was in during each of the GPU's idle gaps. Outside a profiler
a range costs a few microseconds, a handful of them a step.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

__all__ = ["PHASES", "RANGE", "Phase", "StepPhases", "StepTimes", "WallClock", "CudaClock", "clock_for",
           "phases_summary"]


@dataclass(frozen=True)
class Phase:
    """One phase of a step."""

    key: str
    """Its name on the step line and in TensorBoard (``skrull/phase_<key>_ms``)."""
    doc: str
    """What it times."""
    in_step: bool = True
    """Counted in the step as run, what the cost model predicts (False: the data wait and the logging)."""
    per_step: bool = False
    """Priced by the cost model's per-step term (``[step] fixed_us``: the step outside its micro-batches)."""


PHASES: tuple[Phase, ...] = (
    Phase("data", "the wait for the step's data (the dataloader's next)", in_step=False),
    Phase("checks", "the per-step checks: the plans' digests (skrull.check_plan_hash), the plan log, and the "
          "loss and gradient norm checked finite (one all-reduce and the step's host sync)", per_step=True),
    Phase("chunk", "overlength = 'chunk''s samples, forward and backward in chunks (absent without them)"),
    Phase("mb", "the plan's micro-batches, forward and backward (the gradient reduction their backward issues "
          "included)"),
    Phase("clip", "gradient clipping: the norm over the shards (its all-reduce) and the scaling", per_step=True),
    Phase("opt", "the optimizer step, the checkpoint staging wait and the learning-rate step", per_step=True),
    Phase("log", "a logged step's metrics: the loss reductions, TensorBoard, the step line (absent on steps not "
          "logged)", in_step=False),
    Phase("val", "the held-out set's loss when [validation] is due, forward only (absent on other steps)",
          in_step=False),
)
_BY_KEY = {p.key: p for p in PHASES}
RANGE = "skrull/phase_{key}"
"""The record_function range of a phase, in a profiler trace."""


class Clock(Protocol):
    """Marks in time and the milliseconds between two of them."""

    def mark(self) -> Any: ...

    def ready(self, mark: Any) -> bool: ...

    def ms(self, start: Any, end: Any) -> float: ...

    def wait(self) -> None: ...


class WallClock:
    """The host's clock (CPU runs): a mark is ``time.perf_counter()``, ready at once."""

    def mark(self) -> float:
        return time.perf_counter()

    def ready(self, mark: float) -> bool:
        return True

    def ms(self, start: float, end: float) -> float:
        return (end - start) * 1e3

    def wait(self) -> None:
        pass


class CudaClock:
    """The device's clock: a mark is a CUDA event recorded on the current stream, read
    once it has completed (``query`` does not wait)."""

    def __init__(self, device: torch.device):
        self.device = device

    def mark(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def ready(self, mark: torch.cuda.Event) -> bool:
        return mark.query()

    def ms(self, start: torch.cuda.Event, end: torch.cuda.Event) -> float:
        return start.elapsed_time(end)

    def wait(self) -> None:
        torch.cuda.synchronize(self.device)


def clock_for(device: torch.device) -> Clock:
    """CUDA events on a CUDA device, the host's clock elsewhere."""
    return CudaClock(device) if device.type == "cuda" else WallClock()


@dataclass(frozen=True)
class StepTimes:
    """One step's phases, read: milliseconds per phase that ran, in ``PHASES`` order."""

    step: int
    phases: dict[str, float]
    """Milliseconds per phase (a phase entered more than once: the sum); absent: it did not run."""
    total_ms: float
    """From the step's first mark to its last."""
    predicted_us: float
    """What the plan predicted for the step (0: nothing predicted)."""
    rest_host_ms: float = math.nan
    """The host's time outside every phase (``time.perf_counter`` beside the clock's marks; nan where
    the clock is the host's, ``WallClock``: it would be ``rest_ms`` again): on a GPU, where it matches ``rest_ms`` the device waited for the host's work between phases (the
    learning rates' read, zero_grad, ...); where it is far below, the device was busy then."""

    @property
    def rest_ms(self) -> float:
        """The step's time no phase covers."""
        return self.total_ms - sum(self.phases.values())

    @property
    def step_ms(self) -> float:
        """The step as run, what the cost model predicts: the total less the phases it does not price."""
        return self.total_ms - sum(ms for k, ms in self.phases.items() if not _BY_KEY[k].in_step)

    @property
    def outside_ms(self) -> float:
        """The per-step term's phases: the step outside its micro-batches."""
        return sum(ms for k, ms in self.phases.items() if _BY_KEY[k].per_step)

    @property
    def ratio(self) -> float:
        """Measured over predicted, the whole step as run (nan: nothing predicted)."""
        return self.step_ms * 1e3 / self.predicted_us if self.predicted_us > 0 else float("nan")

    def metrics(self) -> dict[str, float]:
        """The TensorBoard scalars, written at this step."""
        out = {f"skrull/phase_{k}_ms": ms for k, ms in self.phases.items()}
        out["skrull/phase_rest_ms"] = self.rest_ms
        if math.isfinite(self.rest_host_ms):
            out["skrull/phase_rest_host_ms"] = self.rest_host_ms
        out["skrull/step_outside_ms"] = self.outside_ms
        out["skrull/measured_us"] = self.step_ms * 1e3  # beside skrull/predicted_us, written at the same step
        if self.predicted_us > 0:  # nothing predicted (torchtitan's batching): no ratio
            out["skrull/measured_over_predicted"] = self.ratio
        return out

    def clause(self) -> str:
        """``phases ms: data 0 checks 3 mb 120 clip 2 opt 5 log 3 rest 1``."""
        parts = [f"{k} {ms:.0f}" for k, ms in self.phases.items()] + [f"rest {self.rest_ms:.0f}"]
        return "phases ms: " + " ".join(parts)


@dataclass
class _Open:
    step: int
    start: Any
    spans: list[tuple[str, Any, Any]] = field(default_factory=list)
    end: Any = None
    predicted_us: float = 0.0
    host: list[float] = field(default_factory=list)
    """Host clock: the step's begin, then each phase's start and end, then the step's end."""


class StepPhases:
    """The phases of the step being run and of the last one finished.

    ``begin(step)``, then ``phase(key)`` around each piece of work, or ``enter(key)`` where it
    starts and ``leave()`` where it ends (a phase may be entered more than once; phases do not
    nest), then ``end(predicted_us)``.
    ``take()`` reads the last finished step once its marks are ready."""

    def __init__(self, clock: Clock):
        self.clock = clock
        self._open: _Open | None = None
        self._done: _Open | None = None
        self._in: tuple[str, _Open | None, Any] | None = None
        """The phase open now: its key, the step it belongs to (None: outside a step) and its start."""
        self._range: torch.profiler.record_function | None = None
        """The open phase's record_function range (``RANGE``)."""
        self.dropped = 0
        """Finished steps replaced before their marks were ready (never read)."""
        self.read: list[StepTimes] = []
        """Every step read so far, in order (the run's medians: ``phases_summary``)."""

    def begin(self, step: int) -> None:
        self._open = _Open(step, self.clock.mark(), host=[time.perf_counter()])

    @contextmanager
    def phase(self, key: str) -> Iterator[None]:
        """The work inside the ``with`` is phase ``key``."""
        self.enter(key)
        try:
            yield
        finally:
            self.leave()

    def enter(self, key: str) -> None:
        """Phase ``key`` starts now and runs to ``leave``: for a step whose code is not ours to wrap
        in ``phase`` (torchtitan's own train_step, where PackedTrainer marks where each phase starts
        from the calls it can hook: packed_trainer.py)."""
        if key not in _BY_KEY:
            raise KeyError(f"unknown step phase {key!r}; PHASES: {[p.key for p in PHASES]}")
        if self._in is not None:
            raise RuntimeError(f"step phase {key!r} entered inside {self._in[0]!r}: phases do not nest")
        if self._open is not None:
            self._open.host.append(time.perf_counter())
        self._in = (key, self._open, self.clock.mark() if self._open is not None else None)
        self._range = torch.profiler.record_function(RANGE.format(key=key))
        self._range.__enter__()

    def leave(self) -> None:
        """The phase entered last ends now (none open: nothing)."""
        if self._in is None:
            return
        (key, record, start), self._in = self._in, None
        self._range.__exit__(None, None, None)
        self._range = None
        if record is not None:
            record.spans.append((key, start, self.clock.mark()))
            record.host.append(time.perf_counter())

    def end(self, predicted_us: float, keep: bool = True) -> None:
        """The step finished: its marks wait to be read (``take``), if ``keep`` (else dropped:
        a step that is not logged)."""
        record, self._open = self._open, None
        if record is None or not keep:
            return
        record.end, record.predicted_us = self.clock.mark(), predicted_us
        record.host.append(time.perf_counter())
        if self._done is not None:
            self.dropped += 1
        self._done = record

    def take(self, wait: bool = False) -> StepTimes | None:
        """The last finished step's times, once (None: none finished, or its marks not ready
        yet, unless ``wait``: the device is synchronised first, for the last step at close)."""
        done = self._done
        if done is None:
            return None
        if not self.clock.ready(done.end):
            if not wait:
                return None
            self.clock.wait()
        self._done = None
        spent: dict[str, float] = {}
        for key, start, end in done.spans:
            spent[key] = spent.get(key, 0.0) + self.clock.ms(start, end)
        phases = {p.key: spent[p.key] for p in PHASES if p.key in spent}
        host = done.host  # begin, (start, end) per span, end: the gaps are the pairs between the spans
        rest_host = sum(b - a for a, b in zip(host[0::2], host[1::2])) * 1e3
        if isinstance(self.clock, WallClock):  # the phases' clock is the host's: nothing to compare
            rest_host = math.nan
        self.read.append(StepTimes(done.step, phases, self.clock.ms(done.start, done.end), done.predicted_us,
                                   rest_host))
        return self.read[-1]


def phases_summary(times: list[StepTimes]) -> str | None:
    """The run's closing clause: the median of each phase over the steps read (the first
    left out when there are others: lazy initialisation), the median step as run and
    the share of it outside the micro-batches. None: no step read."""
    kept = times[1:] or times
    if not kept:
        return None
    keys = [p.key for p in PHASES if any(p.key in t.phases for t in kept)]
    med = {k: statistics.median(t.phases.get(k, 0.0) for t in kept) for k in keys}
    step = statistics.median(t.step_ms for t in kept)
    outside = statistics.median(t.outside_ms / t.step_ms if t.step_ms > 0 else 0.0 for t in kept)
    said = " ".join(f"{k} {v:.1f}" for k, v in med.items())
    rest = statistics.median(t.rest_ms for t in kept)
    hosts = [t.rest_host_ms for t in kept if math.isfinite(t.rest_host_ms)]
    host = (f", on the host's clock {statistics.median(hosts):.1f} (where these match on a GPU, "
            "the device waited for the host's work between the phases)") if hosts else ""
    return (f"step phases, median ms over {len(kept)} steps{' after the first' if len(times) > 1 else ''}: {said}; "
            f"step as run {step:.1f} ms, {100 * outside:.0f}% of it outside the micro-batches "
            f"({', '.join(p.key for p in PHASES if p.per_step)}); rest {rest:.1f}{host}")
