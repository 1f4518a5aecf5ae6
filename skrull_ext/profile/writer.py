# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""The profile file and the console report.

The file is the TOML ``skrull_ext.scheduler.profile_file`` reads (sections and keys
in its docstring); the raw measurements go under ``[meta.*]`` so a plot or a
re-fit never needs a rerun. ``profile_dict`` round-trips its result through
``profile_file.from_dict`` before anything is written, so a file the scheduler
would reject is never produced.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w

from skrull_ext.profile.check import BucketCheck
from skrull_ext.profile.checkpointing import ModeRun
from skrull_ext.profile.comm import CommResult
from skrull_ext.profile.compute import ComputeResult
from skrull_ext.profile.fit import floor_fields
from skrull_ext.profile.memory import MemoryResult
from skrull_ext.profile.head import HeadResult
from skrull_ext.profile.micro_batch import DEVICE_BOUND_COUNTS, MicroBatchResult
from skrull_ext.profile.model import JobModel
from skrull_ext.profile.step import StepResult
from skrull_ext.scheduler import checkpointing, cost_model, profile_file, profile_memory

__all__ = ["Profile", "profile_dict", "report", "write"]


@dataclass
class Profile:
    """Everything one run measured, plus its provenance."""

    jm: JobModel
    compute: ComputeResult
    memory: MemoryResult
    comm: CommResult | None
    comm_fallback: str
    """Hardware preset whose table fills [comm] when one process measured no collective."""
    check: BucketCheck | None
    meta: dict[str, Any]
    micro_batch: MicroBatchResult | None = None
    """The per-micro-batch fixed cost's fit (None: not measured, the key is left out: 0)."""
    head: HeadResult | None = None
    """The per-token cost outside the layers (None: not measured, [micro_batch] token_us left out: 0)."""
    step: StepResult | None = None
    """What a step pays outside its micro-batches (None: not measured, [step] left out: 0)."""
    modes: dict[str, ModeRun] | None = None
    """Each activation-checkpointing mode measured, the job's among them (None or {}: no section)."""
    measured_mode: str | None = None
    """The job's mode: what [compute] and [memory] were measured under."""


def _comm_section(p: Profile) -> dict[str, Any]:
    if p.comm is None:
        hw = cost_model.hardware(p.comm_fallback).data["comm"]
        # The preset's plan margin travels with its table: an assumed exchange is planned hedged
        # (cpp/include/skrull/hedge.hpp) wherever it is used.
        margin = {"plan_margin": hw["plan_margin"]} if hw.get("plan_margin", 1.0) != 1.0 else {}
        return {"bytes": list(hw["bytes"]), "us": list(hw["us"]), "collectives_per_layer": 2.0, **margin,
                "collective": "all_gather", "backend": f"assumed:{p.comm_fallback}", "world_size": 1}
    c = p.comm
    xs, us = c.fit.table(c.sizes)
    return {
        "bytes": xs, "us": us,
        "threshold_bytes": c.fit.threshold_bytes, "floor_us": c.fit.floor_us,
        "collectives_per_layer": 2.0, "collective": "+".join(c.us),
        "backend": c.backend, "world_size": c.world_size,
        "r2": c.fit.r2, "max_rel_error": c.fit.max_rel_error, "points": len(c.sizes),
    }


def _device_bound_meta(mb: MicroBatchResult) -> dict[str, Any]:
    """Both fixed costs, the device-bound steps and which one [micro_batch] fixed_us is
    (micro_batch.py): what the next re-fit or reader needs without a rerun."""
    out: dict[str, Any] = {"short_fixed_us": mb.short_fixed_us, "fixed_from": mb.fixed_from}
    b = mb.device_bound
    if b is None:
        return {**out, "device_bound_note": mb.device_bound_note}
    return {**out, "device_bound_fixed_us": b.fixed_us, "device_bound_docs": [b.length, b.length],
            "device_bound_counts": list(DEVICE_BOUND_COUNTS), "device_bound_step_us": list(b.us),
            "device_bound_cpu_step_us": list(b.cpu_us), "device_bound_calls_us": b.calls_us}


def profile_dict(p: Profile) -> dict[str, Any]:
    cp, mem, s = p.compute, p.memory, p.jm.shape
    d: dict[str, Any] = {
        "model": {"name": p.jm.name, "layers": s.layers, "hidden": s.hidden, "kv_width": s.kv_width,
                  "bytes_per_elem": s.bytes_per_elem},
        "compute": {"a_us_per_flop": cp.fit.slope, "b_us": cp.fit.intercept,
                    **({"attention_weight": cp.attention_weight} if cp.attention_weight != 1.0 else {}),
                    **({"whole_buffer": True} if cp.whole_buffer else {}),  # the scheduler prices as the kernel
                    # a layer call costs max(floor, line) in the scheduler too (cost_model.hpp comp_us)
                    **({"host_floor_us": cp.floor.us} if cp.floor is not None else {}),
                    "r2": cp.fit.r2,
                    "max_rel_error": cp.fit.max_rel_error, "points": len(cp.points),
                    "held_out_max_rel_error": cp.held_out_max_rel_error},
        "comm": _comm_section(p),
        "memory": {**profile_memory.ProfileMemory(
                       bucket_size=mem.bucket_size, a=mem.fit.slope, b=mem.fit.intercept, c=mem.fit.quadratic,
                       usable=mem.usable, static=mem.static.total, margin=mem.margin, cp=mem.cp,
                       kv=mem.kv_bytes_per_token, free_running=mem.static.free_running,
                       logits=mem.logits_bytes_per_token, head_chunk=mem.head_chunk,
                       head_grad=mem.head_grad_bytes).section(),
                   "r2": mem.fit.r2, "max_rel_error": mem.fit.max_rel_error, "points": len(mem.points)},
    }
    if p.micro_batch is not None:
        mb = p.micro_batch
        d["micro_batch"] = {"fixed_us": mb.fixed_us, "slope_us": mb.fit.slope, "calls_us": mb.calls_us,
                            "r2": mb.fit.r2, "max_rel_error": mb.fit.max_rel_error, "points": len(mb.counts),
                            "counts": list(mb.counts),
                            "method": f"step time over micro-batch counts, FSDP x{mb.fsdp_degree}"
                                      f"{', deferred grad sync' if mb.defer_grad_sync else ''}"}
        if mb.free_fit is not None:
            d["micro_batch"].update({"free_running_fixed_us": mb.free_running_fixed_us,
                                     "free_running_step_us": mb.free_running_step_us,
                                     "free_running_r2": mb.free_fit.r2,
                                     "free_running_max_rel_error": mb.free_fit.max_rel_error})
    if p.head is not None:
        d.setdefault("micro_batch", {}).update({"token_us": p.head.token_us, "token_points": len(p.head.tokens)})
    if p.step is not None:
        d["step"] = p.step.section()
    if p.modes and p.measured_mode is not None:
        d[checkpointing.SECTION] = checkpointing.section({m: r.cost for m, r in p.modes.items()}, p.measured_mode)
    d["meta"] = {**p.meta, **_raw(p)}
    profile_file.from_dict(d, where="profile being written")  # the scheduler must accept it
    return d


def _raw(p: Profile) -> dict[str, Any]:
    cp, mem = p.compute, p.memory
    raw: dict[str, Any] = {
        "compute": {
            "layers_timed": cp.layers_timed, "clock": cp.clock, "pinned": cp.pinned or "none",
            "lengths": [t.tokens for t in cp.points], "flops": [t.flops for t in cp.points],
            "us": [t.us for t in cp.points], "wall_us": [t.wall_us for t in cp.points],
            "held_out_lengths": [t.tokens for t in cp.held_out], "held_out_us": [t.us for t in cp.held_out],
            "held_out_wall_us": [t.wall_us for t in cp.held_out],
            "held_out_rel_error": [cp.rel_error(t) for t in cp.held_out],
            "packed_docs": [list(t.docs) for t in cp.packed], "packed_us": [t.us for t in cp.packed],
            "packed_rel_error": [cp.rel_error(t) for t in cp.packed],
            **floor_fields(cp.floor),
            **({"packed_whole_buffer": True, "packed_sum_rel_error": [cp.sum_rel_error(t) for t in cp.packed]}
               if cp.whole_buffer else {}),
        },
        "memory": {
            "fit_target": "peak", "tokens": [m.tokens for m in mem.points],
            "saved_bytes": [m.saved for m in mem.points], "peak_bytes": [m.peak for m in mem.points],
            "fsdp_degree": mem.static.fsdp_degree, "tp_degree": mem.static.tp_degree,
            "params_bytes": mem.static.params, "grads_bytes": mem.static.grads,
            "optimizer_bytes": mem.static.optimizer,
        },
    }
    if p.comm is not None:
        raw["comm"] = {"sizes": p.comm.sizes, **{f"{k}_us": v for k, v in p.comm.us.items()},
                       "a_us_per_byte": p.comm.fit.a_us_per_byte, "b_us": p.comm.fit.b_us}
    if p.check is not None:
        raw["check"] = p.check.as_dict()
    if p.micro_batch is not None:
        raw["micro_batch"] = {"counts": list(p.micro_batch.counts), "step_us": p.micro_batch.us,
                              "docs": list(p.micro_batch.docs), "intercept_us": p.micro_batch.fit.intercept,
                              "fsdp_degree": p.micro_batch.fsdp_degree, "clock": "wall",
                              "cpu_step_us": list(p.micro_batch.cpu_us),
                              **({"free_running_step_us": list(p.micro_batch.free_us),
                                  "free_running_intercept_us": p.micro_batch.free_fit.intercept}
                                 if p.micro_batch.free_fit is not None else {}),
                              **_device_bound_meta(p.micro_batch)}
    if p.modes:
        raw[checkpointing.SECTION] = {m: {
            "lengths": [t.tokens for t in r.compute.points], "us": [t.us for t in r.compute.points],
            "wall_us": [t.wall_us for t in r.compute.points], "r2": r.compute.fit.r2,
            "held_out_max_rel_error": r.compute.held_out_max_rel_error,
            # what tools/refit_compute.py needs to re-fit the mode (run 9's none could not be: 2026-11-30)
            "held_out_lengths": [t.tokens for t in r.compute.held_out], "held_out_us": [t.us for t in r.compute.held_out],
            "packed_docs": [list(t.docs) for t in r.compute.packed], "packed_us": [t.us for t in r.compute.packed],
            **floor_fields(r.compute.floor),
            "memory_tokens": [x.tokens for x in r.memory.points], "saved_bytes": [x.saved for x in r.memory.points],
            "peak_bytes": [x.peak for x in r.memory.points], "memory_r2": r.memory.fit.r2,
        } for m, r in p.modes.items()}
    if p.head is not None:
        raw["head"] = {"tokens": list(p.head.tokens), "us": p.head.us, "intercept_us": p.head.fit.intercept,
                       "r2": p.head.fit.r2, "max_rel_error": p.head.fit.max_rel_error, "clock": p.head.clock}
    return raw


def write(p: Profile, path: str | Path) -> dict[str, Any]:
    d = profile_dict(p)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = (f"# skrull-ext profile, measured by: python -m skrull_ext.profile (see docs/profile.md)\n"
              f"# {p.meta.get('device', '')}, {p.meta.get('date', '')}\n")
    path.write_text(header + tomli_w.dumps(d))
    return d


def _mib(b: float) -> str:
    return f"{b / 2**20:.1f} MiB"


def _wall_ratio(cp: ComputeResult) -> float:
    r = sorted(t.wall_us / t.us for t in (*cp.points, *cp.held_out, *cp.packed) if t.us > 0)
    return r[len(r) // 2] if r else float("nan")


def host_bound_note(cp) -> str | None:
    """A note when the ladder's layer time hardly grows with its FLOPs (x1.5 or less
    over x4 or more): the host (kernel launches, Python dispatch) bounds the layer,
    not the device, and the fitted slope means little. Seen on one H100, eager
    Qwen2.5-0.5B: 12.1-14.3 ms a layer from 2,048 to 16,384 tokens."""
    pts = sorted(cp.points, key=lambda t: t.flops)
    if len(pts) < 2 or pts[0].flops <= 0:
        return None
    lo, hi = min(t.us for t in pts), max(t.us for t in pts)
    work = pts[-1].flops / pts[0].flops
    if lo <= 0 or hi / lo > 1.5 or work < 4:
        return None
    return (f"  note     a layer took {lo / 1e3:.1f}-{hi / 1e3:.1f} ms from {pts[0].tokens} to {pts[-1].tokens} "
            f"tokens (x{work:.0f} the FLOPs): host-bound (kernel launches, "
            "Python dispatch), so the intercept is a fixed cost of every layer and the slope means little; "
            "compiling the model (--compile.enable, also in the job) removes most of it")


def floor_line(cp) -> str:
    """The host floor (compute.py): its level, its points, and what the line alone would miss
    (the scheduler prices the floor too: [compute] host_floor_us, cost_model.hpp comp_us)."""
    pts = sorted(cp.points, key=lambda t: t.flops)
    on = pts[:cp.floor.points]
    return (f"  floor    {cp.floor.us / 1e3:.2f} ms a layer from {on[0].tokens} to {on[-1].tokens} tokens "
            f"({', '.join(f'{t.us / 1e3:.2f}' for t in on)} ms): the host's launch work, not the FLOPs; the line is "
            f"fitted above it and the scheduler prices T = max(floor, line) (the line alone: "
            f"{(cp.fit(on[0].flops) - cp.floor.us) / cp.floor.us:+.0%} at {on[0].tokens} tokens)")


def mode_lines(p: Profile) -> list[str]:
    """Per activation-checkpointing mode, as measured (not fitted): a layer's forward+backward at
    the compute ladder's longest length and the peak at the memory ladder's, against the job's
    mode, and the BucketSize."""
    if not p.modes or p.measured_mode not in p.modes:
        return []
    top = lambda points: max(points, key=lambda t: t.tokens)  # noqa: E731
    base = p.modes[p.measured_mode]
    t0, m0 = top(base.compute.points), top(base.memory.points)
    lines = []
    for mode, r in p.modes.items():
        t, m = top(r.compute.points), top(r.memory.points)
        lines.append(f"  ac {mode:<9} layer {t.us / 1e3:.2f} ms at {t.tokens} tokens (x{t.us / t0.us:.2f} "
                     f"{p.measured_mode}'s), peak {_mib(m.peak)} at {m.tokens} tokens (x{m.peak / m0.peak:.2f}), "
                     f"BucketSize {r.memory.bucket_size}" + (" (the job's mode)" if mode == p.measured_mode else ""))
    return lines


def _device_bound_line(mb: MicroBatchResult) -> str:
    """The device-bound steps and which fixed cost the scheduler gets, and why."""
    b = mb.device_bound
    if b is None:
        said = f"  device-b not measured: {mb.device_bound_note}"
    else:
        diff = b.us[1] - b.us[0]
        said = (f"  device-b fixed {b.fixed_us:.4g} us per micro-batch = step difference {diff:.4g} us - "
                f"priced calls {b.calls_us:.4g} us (2 documents of {b.length} tokens in "
                f"{', '.join(map(str, DEVICE_BOUND_COUNTS))} micro-batches: "
                f"{', '.join(f'{u / 1e3:.1f}' for u in b.us)} ms wall{', clamped at 0' if diff < b.calls_us else ''})")
    why = ("the compute ladder has a host floor, which prices the short steps' host work; the planner's micro-batches "
           "are long" if mb.fixed_from == "device-bound" else
           "no host floor: the short steps are device-bound too, and their fit is checked" if not mb.floor else
           "the device-bound steps were not measured")
    return f"{said}; the scheduler gets the {mb.fixed_from} one, {mb.fixed_us:.4g} us ({why})"


def report(p: Profile) -> str:
    cp, mem = p.compute, p.memory
    top = max(mem.points, key=lambda m: m.tokens)
    lines = [
        f"profile of {p.jm.name} on {p.meta['device']} ({p.meta['elapsed_s']:.0f} s)",
        f"  compute  T = {cp.fit.slope:.4g} us/FLOP * F + {cp.fit.intercept:.4g} us per layer ({cp.clock} clock) "
        + (f"(F = linear + {cp.attention_weight:.3g} x attention FLOPs, fitted with the packed buffers) "
           if cp.attention_weight != 1.0 else "")
        + (f"({3 / cp.fit.slope / 1e3:.1f} GFLOP/s at 3x forward), " if cp.fit.slope > 0 else "")
        + f"R^2 {cp.fit.r2:.4f}, worst fit error {cp.fit.max_rel_error:.1%}",
        *([f"  note     the free fit's {cp.pinned} came out negative and is pinned to 0 (the scheduler needs both "
           ">= 0)" + ("; the layer time did not grow with its FLOPs" if cp.pinned == "slope" else "")]
          if cp.pinned else []),
        *([note] if (note := host_bound_note(cp)) else []),
        *([floor_line(cp)] if cp.floor is not None else []),
        *([f"  clock    process CPU time; wall time was {_wall_ratio(cp):.2f}x it (median)"
           + (": other load on the host" if _wall_ratio(cp) > 1.1 else "")]
          if cp.clock == "cpu" else []),
        "  held-out " + ", ".join(f"{t.tokens}: {cp.rel_error(t):+.1%}" for t in cp.held_out)
        + f"  (worst {cp.held_out_max_rel_error:.1%})",
        "  packed   " + ", ".join(f"{'+'.join(map(str, t.docs))}: {cp.rel_error(t):+.1%}" for t in cp.packed)
        + ("  (fitted with the ladder: two rates)" if cp.attention_weight != 1.0
           else "  (the kernel attends over each buffer whole: priced as one sequence of its length, as the "
                "scheduler prices it under [compute] whole_buffer; a sum of per-document FLOPs misses by "
                + ", ".join(f"{cp.sum_rel_error(t):+.1%}" for t in cp.packed) + ")" if cp.whole_buffer
           else "  (prediction = sum of per-document FLOPs)"),
        f"  memory   peak bytes = {mem.fit.intercept:.4g} + {mem.fit.slope:.4g} N + {mem.fit.quadratic:.4g} N^2,"
        f" R^2 {mem.fit.r2:.5f}, worst {mem.fit.max_rel_error:.1%}; at {top.tokens} tokens saved "
        f"{_mib(top.saved)} + backward transient {_mib(top.peak - top.saved)}",
        f"  static   {_mib(mem.static.total)} (params {_mib(mem.static.params)}, grads {_mib(mem.static.grads)}, "
        f"optimizer {_mib(mem.static.optimizer)}"
        + (f", free-running unsharded params + grads {_mib(mem.static.free_running)}" if mem.static.free_running
           else "") + "; "
        f"FSDP degree {mem.static.fsdp_degree}; its unsharded units are in the peak above)",
        f"  bucket   BucketSize {mem.bucket_size} tokens from {_mib(mem.usable)} usable, margin {mem.margin:.0%}, "
        f"for cp {mem.cp}"
        + (f"; head and loss in chunks of {mem.head_chunk} tokens, {mem.logits_bytes_per_token / 2**10:.1f} KiB a token "
           f"at the peak" if mem.head_chunk else "")
        + (f", gradients in forward: the head's float32 weight gradient {_mib(mem.head_grad_bytes)} held to backward "
           f"(in b)" if mem.head_grad_bytes else ""),
    ]
    if p.comm is None:
        lines.append(f"  comm     not measured (one process); [comm] copied from preset {p.comm_fallback!r}")
    else:
        f = p.comm.fit
        lines.append(f"  comm     {'+'.join(p.comm.us)} over {p.comm.backend} x{p.comm.world_size}: "
                     f"{f.floor_us:.1f} us below {f.threshold_bytes:.0f} B, else {f.a_us_per_byte * 1e6:.3g} us/MB + "
                     f"{f.b_us:.1f} us; R^2 {f.r2:.4f}, worst {f.max_rel_error:.1%}")
    if p.micro_batch is not None:
        mb = p.micro_batch
        lines.append(f"  micro-b  fixed {mb.short_fixed_us:.4g} us per micro-batch = slope {mb.fit.slope:.4g} us - layers * a call "
                     f"{mb.calls_us:.4g} us (steps of {sum(mb.docs)} tokens in {', '.join(map(str, mb.counts))} "
                     f"micro-batches: {', '.join(f'{u / 1e3:.1f}' for u in mb.us)} ms wall; FSDP x{mb.fsdp_degree}); "
                     f"R^2 {mb.fit.r2:.4f}, worst {mb.fit.max_rel_error:.1%}"
                     + (f"; process CPU {', '.join(f'{u / 1e3:.1f}' for u in mb.cpu_us)} ms, wall/CPU "
                        f"x{statistics.median(w / c for w, c in zip(mb.us, mb.cpu_us) if c > 0):.2f} (about 1.3 on an "
                        "idle host: the collectives' waits; higher: other load inflated the fixed cost)"
                        if mb.cpu_us and any(c > 0 for c in mb.cpu_us) else ""))
        lines.append(_device_bound_line(mb))
        if mb.free_fit is not None:
            lines.append(f"  free-run fixed {mb.free_running_fixed_us:.4g} us per micro-batch + {mb.free_running_step_us:.4g} "
                         f"us per step (the same steps free-running: {', '.join(f'{u / 1e3:.1f}' for u in mb.free_us)} "
                         f"ms wall); R^2 {mb.free_fit.r2:.4f}, worst {mb.free_fit.max_rel_error:.1%}")
    if p.head is not None:
        hd = p.head
        lines.append(f"  head     {hd.token_us:.4g} us a token (embedding, norm, output and loss, fwd+bwd: "
                     f"{', '.join(f'{u / 1e3:.2f}' for u in hd.us)} ms at {', '.join(map(str, hd.tokens))} tokens, "
                     f"{hd.clock} clock); R^2 {hd.fit.r2:.4f}, worst {hd.fit.max_rel_error:.1%}")
    if p.step is not None:
        lines.append(f"  step     {p.step.fixed_us:.4g} us a step outside its micro-batches = "
                     + " + ".join(f"{k} {us:.4g}" for k, us in p.step.phases_us.items())
                     + f" (median of {p.step.repeats}, slowest rank)")
    lines.extend(mode_lines(p))
    if p.check is not None:
        c = p.check
        lines.append(
            f"  check    {c.tokens} tokens ({c.docs} docs): peak {_mib(c.measured_peak)} vs fit "
            f"{_mib(c.predicted_activation)} and budget {_mib(c.activation_budget)} (saved {_mib(c.measured_saved)}); "
            f"static measured {_mib(c.static_measured)} vs account {_mib(c.static_account_unsharded)} -> "
            f"{'OK' if c.ok else 'FAILED'}")
    return "\n".join(lines)
