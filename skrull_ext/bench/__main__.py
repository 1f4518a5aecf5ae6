"""Entry point: ``python -m skrull_ext.bench <command> [options]`` (alias ``skrull-bench``).

Commands are a registry of "module:function" targets, imported only when
chosen, so one command's dependencies never slow or break another. A user
error (a bad input file) is one line and exit status 2 (``cli_errors``).
"""

from __future__ import annotations

import importlib
import sys

from skrull_ext.cli_errors import run_cli

COMMANDS: dict[str, tuple[str, str]] = {
    "simulate": ("skrull_ext.bench.simulate:main", "simulator: every policy vs baselines and the lower bound"),
    "latency": ("skrull_ext.bench.latency:main", "scheduler latency: C++ core vs the Python reference vs CP-SAT"),
    "cpsat": ("skrull_ext.bench.cpsat_gain:main", "the CP-SAT fallback: predicted gain per step vs its wall time"),
    "datawait": ("skrull_ext.bench.datawait:main", "data wait per step at DP 128 x CP 8, prefetch off vs on"),
    "adversarial": ("skrull_ext.bench.adversarial:main", "worst-case scheduler time on adversarial batches"),
    "cp": ("skrull_ext.bench.cp_train:main", "training: torchtitan's CP vs Skrull (K/V bytes, step time, overlap)"),
    "data": ("skrull_ext.bench.data:main", "data path at scale: prepare throughput, store size, rank memory at 100K/1M"),
    "train-report": ("skrull_ext.bench.train_report:main", "a `bench cp` run's table: tokens/s, MFU, memory, predicted"),
    "trace-report": ("skrull_ext.bench.trace_report:main", "torch.profiler traces: GPU busy/idle gaps, kernels by family, syncs"),
    "overlap": ("skrull_ext.bench.overlap:main", "DACP attention under torch.profiler: traces and the exchange hidden"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        width = max(map(len, COMMANDS))
        lines = [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
        print("usage: python -m skrull_ext.bench <command> [options]\n\ncommands:\n" + "\n".join(lines))
        if argv and argv[0] not in ("-h", "--help"):
            print(f"\nunknown command {argv[0]!r}; choose one of {sorted(COMMANDS)}", file=sys.stderr)
            return 2
        return 0 if argv else 2  # a bare call names no command
    module, func = COMMANDS[argv[0]][0].split(":")
    return getattr(importlib.import_module(module), func)(argv[1:]) or 0


def cli() -> None:
    """The console script: a user error as one line, exit 2 (as ``python -m``)."""
    run_cli(main)


if __name__ == "__main__":
    cli()
