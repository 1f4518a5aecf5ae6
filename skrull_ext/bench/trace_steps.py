# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.


"""A torch.profiler (Chrome) trace's steps, measured: where each step's time went
on the GPU and what the host did meanwhile (``python -m skrull_ext.bench
trace-report`` prints it: trace_report.py).

Per traced step (each ``ProfilerStep#N`` range; a trace without them is one
step, its whole host extent; torchtitan steps the profiler at a step's end, so
its ``ProfilerStep#N`` is the trainer's step N + 1):

- **span**: from the step's start on the host to the later of its end and the
  end of the last device event it launched (the GPU runs behind the host).
- **GPU busy / idle**: the union of every kernel, memcpy and memset interval on
  the device streams, within the span; the idle gaps are the span less that
  union. Each of the largest gaps is named by the host's record_function (or
  Python) ranges open at its middle and by the host op that overlapped it most:
  what the host was doing while the GPU waited for work.
- **families**: GPU time of the step's own device events (those whose launch,
  matched by the trace's ``correlation`` id, lies in the step; without one, those
  that start in the span) by kernel family (``FAMILIES``, first match wins), and
  the top kernels by total time.
- **ranges**: per record_function name (the trainer's phases ``skrull/phase_<key>``,
  skrull's ``skrull/micro_batch_<j>``, FSDP's ``FSDP::*`` summed over the layers,
  the optimizer's ``Optimizer.step#...``), its instances, host time and the GPU
  time of what was launched while it was open, from any host thread (backward
  runs on autograd's device thread while the main thread waits inside
  ``skrull/micro_batch_<j>``). Nested ranges each count their own.
- **host ops**: the outermost ops by host time, over the threads.
- **syncs**: the host calls that wait for the device (``SYNC_CALLS``), grouped by
  the range and op that made them: count and host time.

A trace with no device events (CPU) still gives the spans, ranges and ops.
Times are the trace's microseconds (the report prints milliseconds). A pure
function of the event list (``analyze``), tested on hand-written traces.
"""

from __future__ import annotations

import bisect
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from skrull_ext.bench.trace_overlap import LAUNCH_CATS, merge

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
"""Device events that occupy a stream (``gpu_user_annotation`` only mirrors host ranges)."""
RANGE_CATS = ("user_annotation", "python_function")
"""Host frames: record_function ranges, and Python functions where the trace has stacks."""
STEP_PREFIX = "ProfilerStep#"
LONG_GAP_MS = 0.1
"""An idle gap this long is the host late with work, not the few microseconds between back-to-back launches."""
SYNC_CALLS = frozenset({
    "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
    "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize", "cuMemcpyDtoH_v2", "cuMemcpyHtoD_v2",
})
"""Runtime and driver calls that block the host until the device has caught up (``cudaMemcpy``: the
blocking copy; ``.item()`` is ``cudaMemcpyAsync`` then ``cudaStreamSynchronize``)."""


@dataclass(frozen=True)
class Family:
    """A kernel family: device events of one of ``cats`` whose lower-cased name matches ``pattern``."""

    name: str
    pattern: str
    cats: tuple[str, ...] = ("kernel",)

    def matches(self, cat: str, name: str) -> bool:
        return cat in self.cats and re.search(self.pattern, name.lower()) is not None


FAMILIES: tuple[Family, ...] = (
    Family("memcpy/memset", "", cats=("gpu_memcpy", "gpu_memset")),
    Family("nccl", "nccl"),
    # torch's foreach and fused optimizers: the fused AdamW, and also clipping's _foreach_norm
    Family("optimizer/foreach", r"multi_tensor|fused_adam|fusedadam|adamw"),
    Family("attention", r"flash|fmha|varlen|attention|attn|sdpa"),
    Family("triton", r"^triton"),  # inductor's fused kernels (triton_poi_, triton_red_, triton_per_, triton_tem_)
    Family("gemm", r"gemm|cutlass|cublas|xmma|nvjet|wgmma|s16816|s1688"),
    Family("elementwise/reduction", r"elementwise|reduce|at::native|vectorized|unrolled|softmax|norm"),
    Family("other", "", cats=DEVICE_CATS),
)
"""In order; an event belongs to the first family that matches (attention before gemm: FlashAttention's
names hold ``cutlass``; the optimizer before elementwise: its kernels are ``at::native``)."""


_MODULE_INDEX = re.compile(r"(?<=\.)\d+(?=[,)])")


def range_key(name: str) -> str:
    """A range's name with the module indices in its parenthesis starred, so that one hook's
    ranges over the layers add up: ``FSDP::pre_forward (layers.3)`` -> ``FSDP::pre_forward (layers.*)``."""
    return _MODULE_INDEX.sub("*", name) if "(" in name else name


def family_of(cat: str, name: str) -> str:
    return next(f.name for f in FAMILIES if f.matches(cat, name))


@dataclass(frozen=True)
class Gap:
    start: float
    end: float
    ranges: str
    """The host's frames open at the gap's middle (``Trace.frames_at``; the step's own left out)."""
    op: str
    """The host op that overlapped the gap most, with its share of the gap; "-" when none did."""

    @property
    def ms(self) -> float:
        return (self.end - self.start) * 1e-3


@dataclass
class StepReport:
    """One traced step; milliseconds."""

    name: str
    start: float
    """The step's start on the host (the trace's microseconds)."""
    span_ms: float
    host_ms: float
    device: bool
    """False: the trace has no device events (CPU)."""
    busy_ms: float = 0.0
    gaps: list[Gap] = field(default_factory=list)
    """Every idle gap, largest first."""
    families: dict[str, float] = field(default_factory=dict)
    """GPU ms of the step's own device events per family, largest first."""
    kernels: list[tuple[str, str, int, float]] = field(default_factory=list)
    """(name, family, count, total ms), largest total first."""
    ranges: list[tuple[str, int, float, float]] = field(default_factory=list)
    """(record_function name (``range_key``), instances, host ms, GPU ms launched inside), largest host time
    first."""
    host_ops: list[tuple[str, int, float]] = field(default_factory=list)
    """(outermost host op, count, host ms) over the host threads, largest total first."""
    syncs: list[tuple[str, str, int, float]] = field(default_factory=list)
    """(call, the range and op that made it, count, host ms), largest total first."""

    @property
    def idle_ms(self) -> float:
        return self.span_ms - self.busy_ms

    def long_gaps(self, ms: float = LONG_GAP_MS) -> tuple[int, float]:
        """The gaps of at least ``ms``: how many, and their milliseconds (the rest are launch bubbles)."""
        long = [g.ms for g in self.gaps if g.ms >= ms]
        return len(long), sum(long)

    @property
    def device_ms(self) -> float:
        return sum(self.families.values())


def _end(e: dict) -> float:
    return float(e["ts"]) + float(e["dur"])


class Nest:
    """One host thread's events as the stack the profiler recorded: each event's innermost
    enclosing one (its parent), so the frames open at a time are found by a bisection and a
    walk up the parents."""

    def __init__(self, events: Iterable[dict]):
        self.events = sorted(events, key=lambda e: (float(e["ts"]), -float(e["dur"])))
        self.starts = [float(e["ts"]) for e in self.events]
        self.parent: list[int | None] = []
        stack: list[int] = []
        for i, e in enumerate(self.events):
            while stack and _end(self.events[stack[-1]]) <= float(e["ts"]):
                stack.pop()
            self.parent.append(stack[-1] if stack else None)
            stack.append(i)

    def chain(self, t: float) -> list[dict]:
        """The events open at time ``t``, outermost first."""
        i = bisect.bisect_right(self.starts, t) - 1
        while i is not None and i >= 0 and _end(self.events[i]) < t:
            i = self.parent[i]
        out = []
        while i is not None and i >= 0:
            out.append(self.events[i])
            i = self.parent[i]
        return out[::-1]

    def top_level(self, cat: str) -> list[dict]:
        """The events of ``cat`` that no other event of ``cat`` encloses, in time order."""
        out = []
        for i, e in enumerate(self.events):
            if e.get("cat") != cat:
                continue
            p = self.parent[i]
            while p is not None and self.events[p].get("cat") != cat:
                p = self.parent[p]
            if p is None:
                out.append(e)
        return out


def _frames(chain: Sequence[dict]) -> list[str]:
    return [e["name"] for e in chain if e.get("cat") in RANGE_CATS and not e["name"].startswith(STEP_PREFIX)]


def _ops(chain: Sequence[dict]) -> list[str]:
    return [e["name"] for e in chain if e.get("cat") == "cpu_op"]


def _said(frames: Sequence[str], deepest: int = 3) -> str:
    """The innermost ``deepest`` frames, outermost first ("-" when none)."""
    return " > ".join(frames[-deepest:]) if frames else "-"


def complement(intervals: Sequence[tuple[float, float]], lo: float, hi: float) -> list[tuple[float, float]]:
    """[lo, hi] less the (merged, sorted) ``intervals``."""
    out, at = [], lo
    for a, b in intervals:
        if b <= lo or a >= hi:
            continue
        if a > at:
            out.append((at, a))
        at = max(at, b)
    if at < hi:
        out.append((at, hi))
    return out


def clipped(intervals: Sequence[tuple[float, float]], lo: float, hi: float) -> float:
    """Measure of the (merged) ``intervals`` within [lo, hi]."""
    return sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in intervals)


class Trace:
    """One trace's events, indexed once for every step's questions."""

    def __init__(self, events: Sequence[dict]):
        self.device = [e for e in events if e.get("cat") in DEVICE_CATS]
        host = [e for e in events if e.get("cat") not in DEVICE_CATS and e.get("cat") != "gpu_user_annotation"]
        threads: dict[tuple, list[dict]] = defaultdict(list)
        for e in host:
            threads[(e.get("pid"), e.get("tid"))].append(e)
        self.nests = {k: Nest(v) for k, v in threads.items()}
        self.steps = sorted((e for e in host if e.get("cat") == "user_annotation"
                             and e["name"].startswith(STEP_PREFIX)), key=lambda e: float(e["ts"]))
        self.host = host
        self.busy = merge((float(e["ts"]), _end(e)) for e in self.device)
        launch = {e["args"]["correlation"]: float(e["ts"]) for e in host
                  if e.get("cat") in LAUNCH_CATS and "correlation" in e.get("args", {})}
        # each device event at its launch's time on the host (its own start where no launch matches)
        self.launched = sorted(((launch.get(e.get("args", {}).get("correlation"), float(e["ts"])), e)
                                for e in self.device), key=lambda p: p[0])
        self.launch_ts = [t for t, _ in self.launched]
        self.prefix = [0.0]
        for _, e in self.launched:
            self.prefix.append(self.prefix[-1] + float(e["dur"]))
        # per thread, the ops no other op encloses: disjoint and in time order, so bisected
        self.top_ops = [ops for ops in (n.top_level("cpu_op") for n in self.nests.values()) if ops]
        self.top_op_starts = [[float(e["ts"]) for e in ops] for ops in self.top_ops]

    def launched_in(self, lo: float, hi: float) -> list[dict]:
        """Device events launched in [lo, hi] on the host."""
        i, j = bisect.bisect_left(self.launch_ts, lo), bisect.bisect_right(self.launch_ts, hi)
        return [e for _, e in self.launched[i:j]]

    def gpu_us_launched_in(self, lo: float, hi: float) -> float:
        i, j = bisect.bisect_left(self.launch_ts, lo), bisect.bisect_right(self.launch_ts, hi)
        return self.prefix[j] - self.prefix[i]

    def frames_at(self, t: float, threads: int = 2) -> str:
        """The host frames open at ``t``: each thread's chain (its innermost three), the deepest
        ``threads`` threads, deepest first, joined by " ; " (backward's FSDP hooks run on autograd's
        thread while the main thread waits in its micro-batch's range); "-" when none is open."""
        chains = sorted((f for f in (_frames(n.chain(t)) for n in self.nests.values()) if f), key=len, reverse=True)
        return " ; ".join(_said(f) for f in chains[:threads]) or "-"

    def op_over(self, lo: float, hi: float) -> str:
        """The top-level host op that overlapped [lo, hi] most, and its share of it."""
        overlap: dict[str, float] = defaultdict(float)
        for ops, starts in zip(self.top_ops, self.top_op_starts):
            i = max(0, bisect.bisect_right(starts, lo) - 1)  # the one op that may have started before lo
            for e in ops[i:bisect.bisect_right(starts, hi)]:
                overlap[e["name"]] += max(0.0, min(_end(e), hi) - max(float(e["ts"]), lo))
        name, us = max(overlap.items(), key=lambda kv: kv[1], default=("-", 0.0))
        return f"{name} ({us / (hi - lo):.0%})" if us > 0 else "-"

    def step(self, name: str, lo: float, hi: float) -> StepReport:
        own = self.launched_in(lo, hi)
        end = max([hi, *(_end(e) for e in own)])
        report = StepReport(name=name, start=lo, span_ms=(end - lo) * 1e-3, host_ms=(hi - lo) * 1e-3,
                            device=bool(self.device))
        if self.device:
            report.busy_ms = clipped(self.busy, lo, end) * 1e-3
            gaps = sorted(complement(self.busy, lo, end), key=lambda g: g[0] - g[1])
            report.gaps = [Gap(a, b, "", "") for a, b in gaps]
            families: dict[str, float] = defaultdict(float)
            kernels: dict[str, list] = {}
            for e in own:
                fam = family_of(e.get("cat"), e["name"])
                families[fam] += float(e["dur"]) * 1e-3
                k = kernels.setdefault(e["name"], [e["name"], fam, 0, 0.0])
                k[2] += 1
                k[3] += float(e["dur"]) * 1e-3
            report.families = dict(sorted(families.items(), key=lambda kv: -kv[1]))
            report.kernels = sorted((tuple(k) for k in kernels.values()), key=lambda k: -k[3])
        ranges: dict[str, list] = {}
        syncs: dict[tuple[str, str], list] = {}
        for key, nest in self.nests.items():
            for e in nest.events:
                t = float(e["ts"])
                if not lo <= t <= hi:
                    continue
                if e.get("cat") == "user_annotation" and not e["name"].startswith(STEP_PREFIX):
                    name = range_key(e["name"])
                    r = ranges.setdefault(name, [name, 0, 0.0, 0.0])
                    r[1] += 1
                    r[2] += float(e["dur"]) * 1e-3
                    r[3] += self.gpu_us_launched_in(t, _end(e)) * 1e-3
                elif e.get("cat") in LAUNCH_CATS and e["name"] in SYNC_CALLS:
                    chain = nest.chain(t)
                    ops = _ops(chain)
                    where = _said(_frames(chain), 2) + " / " + (" > ".join(dict.fromkeys([ops[0], ops[-1]]))
                                                                if ops else "-")
                    s = syncs.setdefault((e["name"], where), [e["name"], where, 0, 0.0])
                    s[2] += 1
                    s[3] += float(e["dur"]) * 1e-3
        ops: dict[str, list] = {}
        for thread_ops, starts in zip(self.top_ops, self.top_op_starts):
            for e in thread_ops[bisect.bisect_left(starts, lo):bisect.bisect_right(starts, hi)]:
                o = ops.setdefault(e["name"], [e["name"], 0, 0.0])
                o[1] += 1
                o[2] += float(e["dur"]) * 1e-3
        report.host_ops = sorted((tuple(o) for o in ops.values()), key=lambda o: -o[2])
        report.ranges = sorted((tuple(r) for r in ranges.values()), key=lambda r: -r[2])
        report.syncs = sorted((tuple(s) for s in syncs.values()), key=lambda s: -s[3])
        return report

    def name_gaps(self, report: StepReport, top: int) -> None:
        """Name the ``top`` largest gaps by the host's frames and op (the rest keep "")."""
        report.gaps[:top] = [Gap(g.start, g.end, self.frames_at((g.start + g.end) / 2),
                                 self.op_over(g.start, g.end)) for g in report.gaps[:top]]


def analyze(events: Sequence[dict], gaps: int = 8) -> list[StepReport]:
    """Every traced step of one trace's complete events (``ProfilerStep#N`` ranges; without them, the
    host's whole extent as one step), its ``gaps`` largest idle gaps named."""
    trace = Trace(events)
    if trace.steps:
        windows = [(e["name"], float(e["ts"]), _end(e)) for e in trace.steps]
    elif trace.host:
        windows = [("whole trace", min(float(e["ts"]) for e in trace.host), max(_end(e) for e in trace.host))]
    else:
        return []
    out = []
    for name, lo, hi in windows:
        report = trace.step(name, lo, hi)
        trace.name_gaps(report, gaps)
        out.append(report)
    return out
