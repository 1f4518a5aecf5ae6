# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""A timeline PNG of one profiled step: local compute against the exchange.

Overlap is a picture before it is a number: one lane each for the local
attention forward and backward, the exchange, the host's waits and (for
scale) the distributed part's forward, over the last profiled step of one
rank (trace_overlap.lanes).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from skrull_ext.bench.trace_overlap import lanes, on_gpu  # noqa: E402

LANES = ("local fwd", "local bwd", "exchange", "fwd wait", "bwd wait", "distributed fwd")
COLORS = {"local fwd": "tab:blue", "local bwd": "tab:cyan", "exchange": "tab:orange", "fwd wait": "tab:red",
          "bwd wait": "tab:pink", "distributed fwd": "tab:gray"}


def last_step(events: Sequence[dict]) -> tuple[float, float]:
    """Span of the last ``stepN`` range (the profiled steps are labelled so)."""
    steps = [e for e in events if e["name"].startswith("step") and e["name"][4:].isdigit()
             and e.get("cat") != "gpu_user_annotation"]
    if not steps:
        raise ValueError("no stepN range in the trace")
    last = max(steps, key=lambda e: int(e["name"][4:]))
    return float(last["ts"]), float(last["ts"]) + float(last["dur"])


def timeline_plot(events: Sequence[dict], path: Path, title: str = "") -> Path:
    lo, hi = last_step(events)
    lane = lanes(events)
    fig, ax = plt.subplots(figsize=(11, 3.1))
    for y, name in enumerate(LANES):
        spans = [(max(a, lo), min(b, hi)) for a, b in lane[name] if b > lo and a < hi]
        ax.broken_barh([((a - lo) / 1e3, (b - a) / 1e3) for a, b in spans], (y - 0.4, 0.8),
                       color=COLORS[name])
    ax.set_yticks(range(len(LANES)), LANES)
    ax.invert_yaxis()
    ax.set_xlim(0, (hi - lo) / 1e3)
    ax.set_xlabel("ms into the step")
    src = "GPU kernels" if on_gpu(events) else "host ranges"
    ax.set_title(title or f"DACP attention, last profiled step of rank 0 (compute: {src})", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
