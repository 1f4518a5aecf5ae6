# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""How much of DACP's K/V exchange ran under the local attention, read off a
torch profiler (Chrome) trace.

DACP issues each layer's exchange, computes the local sequences, then waits
(dacp.py); backward issues the reduce-scatter of dK/dV, computes the local
part's backward, then waits (exchange.py). The question a trace answers is
whether the bytes actually moved while that compute ran, which counters
cannot tell. From the events:

- **compute windows**: forward, each ``dacp/local`` range; backward, the span
  between the end of ``_WaitExchangeBackward`` (which issues the
  reduce-scatter) and the start of the next ``_StartExchangeBackward`` (which
  waits on it) on the same thread: the local part's backward runs there.
- **compute**: on CPU the windows themselves. With GPU kernels in the trace,
  the kernels launched inside a window (a runtime launch event inside it with
  the kernel's ``correlation`` id), at their GPU times: that is the side
  stream's work.
- **exchange**: gloo's own ranges (``gloo:all_gather`` and friends; for the
  collectives they run on gloo's worker thread from start to finish of the
  transfer; a point-to-point ``gloo:send``/``gloo:recv`` range closes only
  when it is waited on, so it overstates the transfer) and NCCL kernels.
- **overlap**: the measure of (compute ∩ exchange), intervals merged first,
  per direction; **hidden** is overlap / exchange.

Every gloo range and NCCL kernel counts as exchange, so read traces of
DACP attention alone (``python -m skrull_ext.bench overlap``): in a training
trace FSDP's parameter all-gathers and gradient reductions run on the same
backends and would be counted too (gloo's ranges name no process group).

Times are microseconds as the trace has them. A pure function of the event
list, so it is tested on hand-written traces.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

Interval = tuple[float, float]

LOCAL = "dacp/local"
DISTRIBUTED = "dacp/distributed"
KV_WAIT = "dacp/kv_wait"
_EVAL = "autograd::engine::evaluate_function: "
ISSUE_GRAD = _EVAL + "_WaitExchangeBackward"
WAIT_GRAD = _EVAL + "_StartExchangeBackward"
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")


@dataclass(frozen=True)
class Overlap:
    """One rank's trace, summed over every profiled step; milliseconds."""

    source: str
    """"gpu" (compute = kernels launched in the windows) or "cpu" (the windows)."""
    fwd_compute_ms: float
    bwd_compute_ms: float
    exchange_ms: float
    fwd_overlap_ms: float
    bwd_overlap_ms: float
    kv_wait_ms: float
    """Host time blocked in the forward wait (``dacp/kv_wait``)."""
    grad_wait_ms: float
    """Host time in the backward wait node (``_StartExchangeBackward``)."""
    exchange_kinds: tuple[str, ...]

    @property
    def hidden(self) -> float:
        """Share of the exchange that ran under local compute (0 with no exchange)."""
        return (self.fwd_overlap_ms + self.bwd_overlap_ms) / self.exchange_ms if self.exchange_ms else 0.0

    def as_dict(self) -> dict:
        return {**asdict(self), "hidden": self.hidden}


def load_events(path: str | Path) -> list[dict]:
    """The complete ("X") events of a Chrome trace file (.json or .json.gz)."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    return [e for e in events if e.get("ph") == "X" and "dur" in e]


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint union of ``intervals``."""
    out: list[Interval] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        elif b > a:
            out.append((a, b))
    return out


def measure(intervals: Sequence[Interval]) -> float:
    return sum(b - a for a, b in merge(intervals))


def intersection(x: Sequence[Interval], y: Sequence[Interval]) -> float:
    """Measure of (union of x) ∩ (union of y)."""
    x, y = merge(x), merge(y)
    i = j = 0
    total = 0.0
    while i < len(x) and j < len(y):
        lo, hi = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        total += max(0.0, hi - lo)
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return total


def _span(e: dict) -> Interval:
    return float(e["ts"]), float(e["ts"]) + float(e["dur"])


def _key(e: dict) -> tuple:
    return e.get("pid"), e.get("tid")


def forward_windows(events: Sequence[dict], name: str = LOCAL) -> list[tuple[tuple, Interval]]:
    """(thread, span) of every ``name`` range on the host (``dacp/local`` by default)."""
    return [(_key(e), _span(e)) for e in events if e["name"] == name and e.get("cat") != "gpu_user_annotation"]


def backward_windows(events: Sequence[dict]) -> list[tuple[tuple, Interval]]:
    """(thread, span) from the end of each reduce-scatter issue node to the start
    of the next wait node on the same thread."""
    marks = sorted(
        (e["ts"], e["name"], _key(e), _span(e)[1]) for e in events if e["name"] in (ISSUE_GRAD, WAIT_GRAD)
    )
    open_at: dict[tuple, float] = {}
    windows = []
    for ts, name, thread, end in marks:
        if name == ISSUE_GRAD:
            open_at.setdefault(thread, end)  # nested layers: the window runs to the first wait
        elif thread in open_at:
            windows.append((thread, (open_at.pop(thread), float(ts))))
    return windows


def _inside(ts: float, thread: tuple, windows: Sequence[tuple[tuple, Interval]]) -> bool:
    return any(t == thread and a <= ts <= b for t, (a, b) in windows)


def gpu_compute(events: Sequence[dict], windows: Sequence[tuple[tuple, Interval]]) -> list[Interval]:
    """GPU spans of the kernels whose launch lies inside one of ``windows``."""
    launched = {
        e["args"]["correlation"]
        for e in events
        if e.get("cat") in LAUNCH_CATS and "correlation" in e.get("args", {})
        and _inside(float(e["ts"]), _key(e), windows)
    }
    return [_span(e) for e in events if e.get("cat") == "kernel" and e.get("args", {}).get("correlation") in launched]


def is_exchange(e: dict) -> bool:
    name = e["name"]
    if e.get("cat") == "kernel":
        return "nccl" in name.lower()
    return name.startswith("gloo:") and "barrier" not in name


def on_gpu(events: Sequence[dict]) -> bool:
    """True when the trace has GPU kernels: compute is then read off them."""
    return any(e.get("cat") == "kernel" for e in events)


def lanes(events: Sequence[dict]) -> dict[str, list[Interval]]:
    """The intervals the overlap is measured on: local compute forward and
    backward, exchange, and the host's waits; the distributed part's forward
    (for the picture)."""
    gpu = on_gpu(events)

    def compute(windows):
        return gpu_compute(events, windows) if gpu else [s for _, s in windows]

    fwd_c, bwd_c = compute(forward_windows(events)), compute(backward_windows(events))
    host = [e for e in events if e.get("cat") != "gpu_user_annotation"]
    return {
        "local fwd": fwd_c,
        "local bwd": bwd_c,
        "distributed fwd": compute(forward_windows(events, DISTRIBUTED)),
        "exchange": [_span(e) for e in events if is_exchange(e)],
        "fwd wait": [_span(e) for e in host if e["name"] == KV_WAIT],
        "bwd wait": [_span(e) for e in host if e["name"] == WAIT_GRAD],
    }


def analyze(events: Sequence[dict]) -> Overlap:
    lane = lanes(events)
    ex = lane["exchange"]
    ms = 1e-3
    return Overlap(
        source="gpu" if on_gpu(events) else "cpu",
        fwd_compute_ms=measure(lane["local fwd"]) * ms,
        bwd_compute_ms=measure(lane["local bwd"]) * ms,
        exchange_ms=measure(ex) * ms,
        fwd_overlap_ms=intersection(lane["local fwd"], ex) * ms,
        bwd_overlap_ms=intersection(lane["local bwd"], ex) * ms,
        kv_wait_ms=sum(b - a for a, b in lane["fwd wait"]) * ms,
        grad_wait_ms=sum(b - a for a, b in lane["bwd wait"]) * ms,
        exchange_kinds=tuple(sorted({e["name"].split("(")[0] for e in events if is_exchange(e)})),
    )
