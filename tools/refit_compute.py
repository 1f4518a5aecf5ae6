"""Re-fit a profile's compute rates from the timings it recorded, with the
profiler's current fit (skrull_ext/profile/compute.py ``fit_compute``: two
rates, linear and attention, where the profile timed packed buffers; the line
above the ladder's host floor where it has one).

    python tools/refit_compute.py profiles/h200-qwen2.5-0.5b.toml [--out NEW.toml]

No device is needed: the ladder's, the held-out and the packed buffers'
times are in ``[meta.compute]``. Rewrites ``[compute]`` (a_us_per_flop, b_us, host_floor_us,
attention_weight, fit quality), the measured checkpointing mode's
``[activation_checkpoint.<mode>]`` rates (they repeat [compute]'s), and the
per-buffer FLOPs, errors and host floor in ``[meta.compute]``, and records the
re-fit in ``[meta] refit``; everything else is kept but ``[micro_batch] fixed_us``,
derived again above a host floor (the short steps' slope less the layers' calls at the floor, or
the device-bound steps' difference less what the new line prices of it where the
profile timed them: profile/micro_batch.py). Another mode is re-fitted
where its ``[meta.activation_checkpoint.<mode>]`` holds its packed buffers'
times (profiles written since 2026-11-30). Where one cannot be, nothing is
re-fitted unless ``--partial``: ``skrull.activation_checkpoint = "auto"``
compares the modes' predicted steps, and a line fitted above a host floor set
against one pulled up by it favours the re-fitted mode (GPU run 9's profile:
selective re-fitted, none not, "auto" would pick selective, 268.0 against
272.9 ms, where none measured 4.5% faster a layer; docs/profile.md).
"""

from __future__ import annotations

import argparse
import copy
import sys
import tomllib
from pathlib import Path

import tomli_w

from skrull_ext._core import ModelShape
from skrull_ext.profile.compute import ComputeFit, fit_compute, flops_of
from skrull_ext.profile.fit import floor_fields
from skrull_ext.profile.micro_batch import (DEVICE_BOUND_COUNTS, call_us, choose_fixed, device_bound_split,
                                            fixed_from_fit, priced_calls_us)


def _fit(shape, raw: dict) -> ComputeFit:
    return fit_compute(shape, list(zip(raw["lengths"], raw["us"])),
                       list(zip(raw.get("packed_docs", []), raw.get("packed_us", []))))


def _held(shape, cf: ComputeFit, raw: dict) -> list[float]:
    return [(cf(flops_of(shape, [n], cf.attention_weight)) - us) / us
            for n, us in zip(raw.get("held_out_lengths", []), raw.get("held_out_us", []))]


def _said(before: tuple[float, float, float], cf: ComputeFit, held: list[float]) -> str:
    return (f"a {before[0]:.4g} -> {cf.fit.slope:.4g} us/FLOP, b {before[1]:.4g} -> {cf.fit.intercept:.4g} us, "
            f"attention_weight {before[2]:.3g} -> {cf.attention_weight:.3g}"
            + (f", host floor {cf.floor.us:.4g} us over the {cf.floor.points} shortest" if cf.floor else ", no host floor")
            + ("; held-out " + ", ".join(f"{e:+.1%}" for e in held) if held else ""))


def _modes(d: dict, shape) -> tuple[list[str], list[str]]:
    """Re-fit the other checkpointing modes that recorded their packed buffers: one clause
    each, and the modes that could not be."""
    section, raws = d.get("activation_checkpoint", {}), d["meta"].get("activation_checkpoint", {})
    out, kept = [], []
    for mode, raw in raws.items():
        if mode == section.get("measured") or mode not in section:
            continue
        if not raw.get("packed_docs"):
            out.append(f"{mode} kept (its packed buffers' times were not recorded)")
            kept.append(mode)
            continue
        cf, keys = _fit(shape, raw), section[mode]
        before = (keys["a_us_per_flop"], keys["b_us"], keys.get("attention_weight", 1.0))
        held = _held(shape, cf, raw)
        _store(keys, raw, cf, held)
        out.append(f"{mode}: {_said(before, cf, held)}")
    return out, kept


def _set_weight(keys: dict, cf: ComputeFit) -> None:
    """The fit's attention weight into a compute section (absent: 1, the formula's)."""
    if cf.attention_weight != 1.0:
        keys["attention_weight"] = cf.attention_weight  # in its place where it was there
    else:
        keys.pop("attention_weight", None)


def _set_floor(keys: dict, raw: dict, cf: ComputeFit) -> None:
    """The fit's host floor into a priced section (its ``host_floor_us``: the scheduler prices
    max(floor, line)) and its meta section, in place of any earlier one."""
    for section in (keys, raw):
        section.pop("host_floor_us", None)
    raw.pop("host_floor_points", None)
    raw.update(floor_fields(cf.floor))
    if cf.floor is not None:
        keys["host_floor_us"] = cf.floor.us


def _store(keys: dict, raw: dict, cf: ComputeFit, held: list[float]) -> None:
    """A mode's rates into its section and its fit's quality and floor into its meta."""
    keys.update(a_us_per_flop=cf.fit.slope, b_us=cf.fit.intercept)
    _set_weight(keys, cf)
    raw["r2"] = cf.fit.r2
    if held:
        raw["held_out_max_rel_error"] = max(abs(e) for e in held)
    _set_floor(keys, raw, cf)


def _micro_batch(d: dict, cf: ComputeFit, shape) -> str:
    """[micro_batch] fixed_us again above a host floor: its measured slope less the layers'
    calls at the floor (micro_batch.py call_us), or, where the profile timed the device-bound
    steps, their difference less what the new fit prices of it (micro_batch.choose_fixed);
    a clause, '' without a floor (kept as measured)."""
    mb, raw = d.get("micro_batch", {}), d["meta"].get("micro_batch", {})
    if cf.floor is None or "slope_us" not in mb or "calls_us" not in mb:
        return ""
    old_calls, before = mb["calls_us"], mb["fixed_us"]
    calls = d["model"]["layers"] * call_us(cf.fit.intercept, cf.floor)
    short, bound = fixed_from_fit(mb["slope_us"], calls), None
    said = f"; micro-batch fixed {before:.4g} -> "
    if "device_bound_step_us" in raw:  # profiles since 2026-11-30 (micro_batch.py)
        split, step = device_bound_split(raw["device_bound_docs"][0]), raw["device_bound_step_us"]
        bound_calls = priced_calls_us(cf, cf.attention_weight, shape, split[DEVICE_BOUND_COUNTS[0]],
                                      split[DEVICE_BOUND_COUNTS[1]], d["compute"].get("whole_buffer", False))
        bound = fixed_from_fit(step[1] - step[0], bound_calls)
        fixed, source = choose_fixed(short, bound, True)
        raw.update(short_fixed_us=short, fixed_from=source, device_bound_fixed_us=bound,
                   device_bound_calls_us=bound_calls)
        said += (f"{fixed:.4g} us, the {source} steps' (device-bound: difference {step[1] - step[0]:.4g} - calls "
                 f"{bound_calls:.4g}; short: slope {mb['slope_us']:.4g} - calls {calls:.4g} = {short:.4g})")
    else:
        fixed = short
        said += f"{fixed:.4g} us (slope {mb['slope_us']:.4g} - calls {calls:.4g})"
    mb.update(calls_us=calls, fixed_us=fixed)
    if "free_running_fixed_us" in mb:  # its slope is the fixed cost plus the old calls, unless clamped at 0
        free = mb["free_running_fixed_us"]
        if free > 0 or calls >= old_calls:
            mb["free_running_fixed_us"] = fixed_from_fit(free + old_calls, calls) if free > 0 else 0.0
        else:
            said += " (free-running's kept: clamped at 0, its slope unknown)"
    return said


def refit(d: dict, partial: bool = False) -> str:
    """Re-fit ``d`` (a profile dict) in place; returns what changed, one line. Where a
    checkpointing mode cannot be re-fitted with the others, ``d`` is left as it was (the line
    starts "kept") unless ``partial`` (module docstring)."""
    new = copy.deepcopy(d)
    line, kept = _refit(new)
    if kept and not partial:
        return (f"kept: {', '.join(kept)} cannot be re-fitted (packed buffers not recorded), and re-fitting the "
                f"others alone would skew skrull.activation_checkpoint = 'auto' (--partial re-fits them anyway): {line}")
    d.clear()
    d.update(new)
    return line


def _refit(d: dict) -> tuple[str, list[str]]:
    m, c, raw = d["model"], d["compute"], d["meta"]["compute"]
    shape = ModelShape(m["layers"], m["hidden"], m["kv_width"], m["bytes_per_elem"])
    if raw.get("packed_whole_buffer", False):  # a whole buffer's attention is a single document's (compute.py)
        return "kept: the kernel attends over each buffer whole, so the packed buffers tell the rates nothing", []
    cf = _fit(shape, raw)
    if cf.floor is None and cf.attention_weight == 1.0:
        return "kept: no host floor, and no packed buffers or the two-rate fit has a rate or the intercept below 0", []
    w = cf.attention_weight
    before = (c["a_us_per_flop"], c["b_us"], c.get("attention_weight", 1.0))
    packed = list(zip(raw.get("packed_docs", []), raw.get("packed_us", [])))
    held = _held(shape, cf, raw)
    c.update(a_us_per_flop=cf.fit.slope, b_us=cf.fit.intercept, r2=cf.fit.r2, max_rel_error=cf.fit.max_rel_error,
             points=len(raw["lengths"]) + (len(packed) if w != 1.0 else 0))
    _set_weight(c, cf)
    if held:
        c["held_out_max_rel_error"] = max(abs(e) for e in held)
        raw["held_out_rel_error"] = held
    raw["flops"] = [flops_of(shape, [n], w) for n in raw["lengths"]]
    raw["packed_rel_error"] = [(cf(flops_of(shape, docs, w)) - us) / us for docs, us in packed]
    raw["pinned"] = cf.pinned or "none"
    _set_floor(c, raw, cf)
    measured = d.get("activation_checkpoint", {}).get("measured")
    if measured in d.get("activation_checkpoint", {}):
        mode_raw = d["meta"].get("activation_checkpoint", {}).get(measured, {})
        _store(d["activation_checkpoint"][measured], mode_raw, cf, held)
    modes, kept = _modes(d, shape)
    line = (_said(before, cf, held) + "; packed errors " + ", ".join(f"{e:+.1%}" for e in raw["packed_rel_error"])
            + _micro_batch(d, cf, shape) + "".join(f"; {said}" for said in modes))
    d["meta"]["refit"] = f"tools/refit_compute.py (fit_compute, from [meta.compute]): {line}"
    return line, kept


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("profile")
    p.add_argument("--out", help="where to write (default: over the profile)")
    p.add_argument("--partial", action="store_true",
                   help="re-fit the modes that can be even where another cannot (module docstring)")
    a = p.parse_args(argv)
    path = Path(a.profile)
    if not path.is_file():
        raise SystemExit(f"{path}: no such profile file")
    text = path.read_text()
    header = "".join(line + "\n" for line in text.splitlines() if line.startswith("#"))
    d = tomllib.loads(text)
    if "compute" not in d.get("meta", {}):
        raise SystemExit(f"{path}: no [meta.compute] timings to re-fit from (a preset, or a hand-written profile)")
    print(refit(d, a.partial))
    Path(a.out or path).write_text(header + tomli_w.dumps(d))
    return 0


if __name__ == "__main__":
    sys.exit(main())
