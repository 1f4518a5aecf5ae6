"""PNG plots of a simulation run: speedup per cell, iteration-time distributions."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from skrull_ext.sim.policies import LOOKAHEAD  # noqa: E402
from skrull_ext.sim.simulator import ScenarioResult  # noqa: E402

_SHORT_MODEL = {"qwen2.5-0.5b": "0.5B", "qwen2.5-7b": "7B"}
_SHORT_DATASET = {
    "wikipedia": "Wikipedia\n(paper)",
    "lmsyschat1m": "LMsysChat1M\n(paper)",
    "chatqa2": "ChatQA2\n(paper)",
    "wikipedia_en_dumpslice.qwen": "wiki-en\n(real)",
    "sharegpt_v3_conversations.qwen": "ShareGPT\n(real)",
    "mix_sharegpt_conv95+longbench_en5": "ShareGPT+5%\nLongBench",
    "mix_azureconv90+longbench_en10": "Azure+10%\nLongBench",
}


def _label(r: ScenarioResult) -> str:
    d = r.scenario.dataset
    d = _SHORT_DATASET.get(d, d if len(d) <= 16 else d[:15] + "~")
    return f"{d}\n{_SHORT_MODEL.get(r.scenario.model, r.scenario.model)}"


PALETTE = (*plt.get_cmap("tab10").colors, "#1f1f7a", "#b15928", "#ffd92f", "#000000", "#66c2a5", "#e7298a")
"""Distinct colours for the policies in the order they run (tab10 alone gave the eleventh the first's)."""


def _styles(policies: Sequence[str]) -> dict[str, tuple[tuple, str]]:
    """(colour, hatch) per policy. Look-ahead rows are skrull run with a window, so they take
    skrull's colour, darker with the width, hatched: never another policy's colour."""
    plain = [p for p in policies if not p.startswith(LOOKAHEAD)]
    styles = {p: (matplotlib.colors.to_rgb(PALETTE[i % len(PALETTE)]), "") for i, p in enumerate(plain)}
    base = styles.get("skrull", (matplotlib.colors.to_rgb("tab:purple"), ""))[0]
    ahead = [p for p in policies if p.startswith(LOOKAHEAD)]
    for k, p in enumerate(ahead):
        dark = 0.2 + 0.55 * k / max(len(ahead) - 1, 1)  # share of black mixed in
        styles[p] = (tuple(c * (1 - dark) for c in base), "//")
    return styles


def _title(text: str, fig) -> str:
    """``text`` wrapped to the figure's width (about 9 characters an inch at 10 pt)."""
    return "\n".join(textwrap.wrap(text, max(40, int(fig.get_figwidth() * 9))))


def speedup_plot(results: Sequence[ScenarioResult], path: Path, note: str) -> Path:
    """Grouped bars: speedup of each policy over baseline, per dataset x model cell."""
    pols = [p for p in results[0].per_policy if p not in ("baseline", "bound")]
    styles = _styles(list(results[0].per_policy))
    n, k = len(results), len(pols)
    fig, ax = plt.subplots(figsize=(max(8.0, 1.15 * n + 2), 5.2))
    width = 0.8 / max(k, 1)
    for j, p in enumerate(pols):
        xs = [i + (j - (k - 1) / 2) * width for i in range(n)]
        color, hatch = styles[p]
        ax.bar(xs, [r.speedup(p, "baseline") for r in results], width, label=p, color=color, hatch=hatch,
               edgecolor="white" if hatch else None, linewidth=0)
    # In the legend, not on the plot: a label at the line's end sat on the last cell's bars.
    ax.axhline(1.0, color="black", linewidth=1, linestyle="--", label="baseline (1x)")
    ax.set_xticks(range(n))
    ax.set_xticklabels([_label(r) for r in results], fontsize=8)
    ax.set_ylabel("speedup of mean iteration time over baseline (x)")
    ax.set_title(_title(f"Simulated speedup per dataset and model ({note})", fig), fontsize=10)
    ax.legend(ncol=min(k + 1, 6), fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16))
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")  # the legend below the axes and a long title inside the file
    plt.close(fig)
    return path


def iteration_time_plot(results: Sequence[ScenarioResult], path: Path, note: str) -> Path:
    """Small multiples: per cell, the distribution of iteration times of every policy (log scale)."""
    pols = list(results[0].per_policy)
    styles = _styles(pols)
    ncols = min(4, len(results))
    nrows = math.ceil(len(results) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.4 * nrows), squeeze=False)
    for ax, r in zip(axes.flat, results):
        data = [[m.time_us / 1e3 for m in r.per_policy[p]] for p in pols]
        box = ax.boxplot(data, patch_artist=True, widths=0.6, showfliers=True, flierprops={"markersize": 2})
        for patch, p in zip(box["boxes"], pols):
            patch.set_facecolor(styles[p][0])
            patch.set_hatch(styles[p][1])
            patch.set_alpha(0.8)
        ax.set_yscale("log")
        ax.set_xticks(range(1, len(pols) + 1))
        ax.set_xticklabels(pols, rotation=45, ha="right", fontsize=7)
        ax.set_title(_label(r).replace("\n", " "), fontsize=9)
        ax.set_ylabel("iteration time (ms)", fontsize=8)
        ax.tick_params(axis="y", labelsize=7)
        ax.grid(axis="y", alpha=0.3, which="both")
    for ax in list(axes.flat)[len(results):]:
        ax.axis("off")
    fig.suptitle(_title(f"Iteration-time distribution per policy ({note})", fig), fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path


CHUNK_ROWS = ("skrull", "skrull+chunk", "chunkflow+whole")


def chunk_plot(results: Sequence[ScenarioResult], path: Path, note: str) -> Path:
    """Grouped bars: mean iteration time of skrull+chunk and chunkflow+whole (every sequence whole)
    per cell, and skrull on the cut sequences for scale; each cell's count of chunked sequences."""
    pols = [p for p in CHUNK_ROWS if p in results[0].per_policy]
    styles = _styles(list(results[0].per_policy))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(results) + 2), 4.2))
    width = 0.8 / len(pols)
    for i, p in enumerate(pols):
        xs = [k + (i - (len(pols) - 1) / 2) * width for k in range(len(results))]
        ax.bar(xs, [r.mean_time_us(p) / 1e3 for r in results], width, label=p + (" (cut)" if p == "skrull" else ""),
               color=styles[p][0], hatch="//" if p == "skrull" else "", alpha=0.85)
    ax.set_xticks(range(len(results)))
    ax.set_xticklabels([f"{_label(r)}\n{r.over_limit} chunked" for r in results], fontsize=8)
    ax.set_yscale("log")  # cells differ by orders of magnitude
    ax.set_ylabel("mean iteration time (ms, log)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.suptitle(_title(f"Chunked training, every sequence whole: skrull+chunk vs chunkflow+whole ({note})", fig),
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path


def write(results: Sequence[ScenarioResult], out: Path, note: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = [speedup_plot(results, out / "speedup.png", note),
               iteration_time_plot(results, out / "iteration_time.png", note)]
    if results and {"skrull+chunk", "chunkflow+whole"} <= results[0].per_policy.keys():
        written.append(chunk_plot(results, out / "chunked.png", note))
    return written
