"""PNG plots of a simulation run: speedup per cell, iteration-time distributions."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

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


def _colors(policies: Sequence[str]) -> dict[str, str]:
    cmap = plt.get_cmap("tab10")
    return {p: cmap(i % 10) for i, p in enumerate(policies)}


def speedup_plot(results: Sequence[ScenarioResult], path: Path, note: str) -> Path:
    """Grouped bars: speedup of each policy over baseline, per dataset x model cell."""
    pols = [p for p in results[0].per_policy if p not in ("baseline", "bound")]
    colors = _colors(list(results[0].per_policy))
    n, k = len(results), len(pols)
    fig, ax = plt.subplots(figsize=(max(8.0, 1.15 * n + 2), 5.2))
    width = 0.8 / max(k, 1)
    for j, p in enumerate(pols):
        xs = [i + (j - (k - 1) / 2) * width for i in range(n)]
        ax.bar(xs, [r.speedup(p, "baseline") for r in results], width, label=p, color=colors[p])
    # In the legend, not on the plot: a label at the line's end sat on the last cell's bars.
    ax.axhline(1.0, color="black", linewidth=1, linestyle="--", label="baseline (1x)")
    ax.set_xticks(range(n))
    ax.set_xticklabels([_label(r) for r in results], fontsize=8)
    ax.set_ylabel("speedup of mean iteration time over baseline (x)")
    ax.set_title(f"Simulated speedup per dataset and model ({note})", fontsize=10)
    ax.legend(ncol=min(k + 1, 8), fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14))
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def iteration_time_plot(results: Sequence[ScenarioResult], path: Path, note: str) -> Path:
    """Small multiples: per cell, the distribution of iteration times of every policy (log scale)."""
    pols = list(results[0].per_policy)
    colors = _colors(pols)
    ncols = min(4, len(results))
    nrows = math.ceil(len(results) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.4 * nrows), squeeze=False)
    for ax, r in zip(axes.flat, results):
        data = [[m.time_us / 1e3 for m in r.per_policy[p]] for p in pols]
        box = ax.boxplot(data, patch_artist=True, widths=0.6, showfliers=True, flierprops={"markersize": 2})
        for patch, p in zip(box["boxes"], pols):
            patch.set_facecolor(colors[p])
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
    fig.suptitle(f"Iteration-time distribution per policy ({note})", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write(results: Sequence[ScenarioResult], out: Path, note: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    return [speedup_plot(results, out / "speedup.png", note),
            iteration_time_plot(results, out / "iteration_time.png", note)]
