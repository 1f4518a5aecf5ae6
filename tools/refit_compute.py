"""Re-fit a profile's compute rates from the timings it recorded, with the
profiler's current fit (skrull_ext/profile/compute.py: two rates, linear and
attention, where the profile timed packed buffers).

    python tools/refit_compute.py profiles/h200-qwen2.5-0.5b.toml [--out NEW.toml]

No device is needed: the ladder's, the held-out and the packed buffers'
times are in ``[meta.compute]``. Rewrites ``[compute]`` (a_us_per_flop, b_us,
attention_weight, fit quality) and the per-buffer FLOPs and errors in
``[meta.compute]``, and records the re-fit in ``[meta] refit``; everything
else is kept. A profile without packed buffers keeps its one-rate fit.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path

import tomli_w

from skrull_ext._core import ModelShape
from skrull_ext.profile.compute import flops_of, split_flops
from skrull_ext.profile.fit import fit_two_rates


def refit(d: dict) -> str:
    """Re-fit ``d`` (a profile dict) in place; returns what changed, one line."""
    m, c, raw = d["model"], d["compute"], d["meta"]["compute"]
    shape = ModelShape(m["layers"], m["hidden"], m["kv_width"], m["bytes_per_elem"])
    ladder = [[n] for n in raw["lengths"]]
    packed = raw.get("packed_docs", [])
    if raw.get("packed_whole_buffer", False):  # a whole buffer's attention is a single document's (compute.py)
        return "kept: the kernel attends over each buffer whole, so the packed buffers tell the rates nothing"
    fitted = fit_two_rates([split_flops(shape, docs) for docs in ladder + packed], raw["us"] + raw.get("packed_us", []))
    if fitted is None:
        return "kept: no packed buffers, or the two-rate fit has a rate or the intercept below 0"
    fit, w = fitted
    before = (c["a_us_per_flop"], c["b_us"], c.get("attention_weight", 1.0))

    def err(docs, us):
        return (fit(flops_of(shape, docs, w)) - us) / us

    held = [err([n], us) for n, us in zip(raw.get("held_out_lengths", []), raw.get("held_out_us", []))]
    c.update(a_us_per_flop=fit.slope, b_us=fit.intercept, attention_weight=w, r2=fit.r2, max_rel_error=fit.max_rel_error,
             points=len(ladder) + len(packed))
    if held:
        c["held_out_max_rel_error"] = max(abs(e) for e in held)
        raw["held_out_rel_error"] = held
    raw["flops"] = [flops_of(shape, docs, w) for docs in ladder]
    raw["packed_rel_error"] = [err(docs, us) for docs, us in zip(packed, raw.get("packed_us", []))]
    raw["pinned"] = "none"
    line = (f"a {before[0]:.4g} -> {fit.slope:.4g} us/FLOP, b {before[1]:.4g} -> {fit.intercept:.4g} us, "
            f"attention_weight {before[2]:.3g} -> {w:.3g}; packed errors "
            + ", ".join(f"{e:+.1%}" for e in raw["packed_rel_error"])
            + (f"; held-out " + ", ".join(f"{e:+.1%}" for e in held) if held else ""))
    d["meta"]["refit"] = f"tools/refit_compute.py (two rates, from [meta.compute]): {line}"
    return line


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("profile")
    p.add_argument("--out", help="where to write (default: over the profile)")
    a = p.parse_args(argv)
    path = Path(a.profile)
    text = path.read_text()
    header = "".join(line + "\n" for line in text.splitlines() if line.startswith("#"))
    d = tomllib.loads(text)
    if "compute" not in d.get("meta", {}):
        raise SystemExit(f"{path}: no [meta.compute] timings to re-fit from (a preset, or a hand-written profile)")
    print(refit(d))
    Path(a.out or path).write_text(header + tomli_w.dumps(d))
    return 0


if __name__ == "__main__":
    sys.exit(main())
