# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""PNG of measured points against the fits: compute, memory, communication.

Reads only the profile dict (``writer.profile_dict`` or a loaded file), so
a committed profile can be re-plotted without rerunning anything:

    python -m skrull_ext.profile.plot profiles/cpu-debug-gloo2.toml out.png
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import tomllib

from skrull_ext.scheduler.profile_memory import ProfileMemory

__all__ = ["plot"]


def _line(xs, f, n=200):
    lo, hi = min(xs), max(xs)
    grid = [lo + (hi - lo) * i / (n - 1) for i in range(n)]
    return grid, [f(x) for x in grid]


def plot(d: dict[str, Any], path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    meta = d.get("meta", {})
    raw_c, raw_m, raw_k = meta.get("compute", {}), meta.get("memory", {}), meta.get("comm")
    raw_k = raw_k if isinstance(raw_k, dict) else None
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))

    ax = axes[0]
    c = d["compute"]
    a, b = c["a_us_per_flop"], c["b_us"]
    gf = [x / 1e9 for x in raw_c.get("flops", [])]
    ax.plot(gf, [y / 1e3 for y in raw_c.get("us", [])], "o", label="fit points")
    if raw_c.get("held_out_lengths"):
        from skrull_ext._core import ModelShape
        from skrull_ext.profile.compute import flops_of, priced_docs  # the scheduler's FLOPs of each length

        m = d["model"]
        shape = ModelShape(m["layers"], m["hidden"], m["kv_width"], m["bytes_per_elem"])
        w = c.get("attention_weight", 1.0)
        hf = [flops_of(shape, [s], w) / 1e9 for s in raw_c["held_out_lengths"]]
        ax.plot(hf, [y / 1e3 for y in raw_c["held_out_us"]], "s", mfc="none", label="held out")
        whole = raw_c.get("packed_whole_buffer", False)  # priced as the kernel computes it (compute.py)
        pf = [flops_of(shape, priced_docs(docs, whole), w) / 1e9 for docs in raw_c.get("packed_docs", [])]
        if pf:
            ax.plot(pf, [y / 1e3 for y in raw_c["packed_us"]], "x", label="packed (several docs" + (", priced whole)" if whole else ")"))
        gf = gf + hf + pf
    if gf:
        xs, ys = _line([0.0, *gf], lambda x: (a * x * 1e9 + b) / 1e3)
        ax.plot(xs, ys, "-", label=f"fit: {a * 1e9:.3g} us/GFLOP + {b:.3g} us")
    quality = [f"R^2={c['r2']:.4f}"] if "r2" in c else []
    if "held_out_max_rel_error" in c and raw_c.get("held_out_lengths"):
        quality.append(f"held-out worst {c['held_out_max_rel_error']:.1%}")
    packed_err = [abs(e) for e in raw_c.get("packed_rel_error", [])]
    if packed_err:
        quality.append(f"packed worst {max(packed_err):.1%}")
    ax.set(xlabel="forward GFLOPs of one layer", ylabel="fwd+bwd ms per layer",
           title="compute\n" + (", ".join(quality) or "fit quality not recorded"))
    ax.legend(fontsize=8)

    ax = axes[1]
    mm = d["memory"]
    toks = raw_m.get("tokens", [])
    if toks:
        ax.plot(toks, [v / 2**20 for v in raw_m["saved_bytes"]], "o", label="saved for backward (hooks)")
        ax.plot(toks, [v / 2**20 for v in raw_m["peak_bytes"]], "^", mfc="none", label="peak above start")
        top = max(max(toks), mm.get("bucket_size", 0))
        fit = ProfileMemory.of(d).activation  # [memory] read as the scheduler reads it
        xs, ys = _line([0, top], lambda n: fit(n) / 2**20)
        ax.plot(xs, ys, "-", label=f"fit ({raw_m.get('fit_target', '?')})")
    if "bucket_size" in mm:
        ax.axvline(mm["bucket_size"], ls="--", c="gray", label=f"BucketSize {mm['bucket_size']}")
        if "usable_bytes" in mm:
            ax.axhline((mm["usable_bytes"] - mm["static_bytes"]) / 2**20, ls=":", c="red",
                       label="activation budget (usable - static)")
    chk = meta.get("check")
    if chk:
        ax.plot([chk["tokens"]], [chk["measured_saved"] / 2**20], "P", ms=9, c="tab:blue", label="check: saved at BucketSize")
        ax.plot([chk["tokens"]], [chk["measured_peak"] / 2**20], "*", ms=12, c="k", label="check: peak at BucketSize")
    # centre left: the points rise from the lower left and the budget line runs along the top
    ax.set(xlabel="tokens in the buffer", ylabel="MiB",
           title="activation memory\n" + (f"R^2={mm['r2']:.5f}" if "r2" in mm else "fit quality not recorded"))
    ax.legend(fontsize=8, loc="center left")

    ax = axes[2]
    k = d["comm"]
    if raw_k:
        for key in (k for k, v in raw_k.items()  # each direction of the exchange, timed per size
                    if k.endswith("_us") and isinstance(v, list) and len(v) == len(raw_k["sizes"])):
            ax.loglog(raw_k["sizes"], raw_k[key], "o", mfc="none", label=key.removesuffix("_us"))
    from skrull_ext.scheduler import profile_file

    cm = profile_file.from_dict(d)
    sizes = raw_k["sizes"] if raw_k else k["bytes"]
    lo, hi = max(1.0, min(sizes) / (1 if raw_k else 4)), max(sizes)
    grid = [lo * (hi / lo) ** (i / 199) for i in range(200)]
    ax.loglog(grid, [cm.collective_us(v) for v in grid], "-", label="table the scheduler reads")
    if "r2" in k:
        comm_title = f"comm ({k.get('backend', '?')} x{k.get('world_size', '?')})\nR^2={k['r2']:.4f}"
    else:  # one process measured no collective: the table is a hardware preset's
        comm_title = f"comm: not measured (one process)\ntable from {str(k.get('backend', '?')).removeprefix('assumed:')}"
    ax.set(xlabel="message bytes (gathered K/V, all ranks)", ylabel="us per collective", title=comm_title)
    ax.legend(fontsize=8)

    fig.suptitle(f"{d['model'].get('name', '')} on {meta.get('device', '?')}, {meta.get('date', '')}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m skrull_ext.profile.plot PROFILE.toml OUT.png")
    with open(sys.argv[1], "rb") as fh:
        plot(tomllib.load(fh), sys.argv[2])
