"""Entry point: ``python -m skrull_ext.bench <command> [options]`` (alias: ``skrull-bench``).

    python -m skrull_ext.bench simulate            # simulator: policies vs baselines and the bound
    python -m skrull_ext.bench latency             # scheduler latency

Each command is "module:function", imported lazily; the function takes the
remaining argv and returns an exit code.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

COMMANDS: dict[str, str] = {
    "simulate": "skrull_ext.bench.simulate:main",
    "latency": "skrull_ext.bench.latency:main",
}


def _usage() -> str:
    return "usage: python -m skrull_ext.bench {" + ",".join(COMMANDS) + "} [options]  (--help after a command)"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"unknown command {name!r}\n{_usage()}", file=sys.stderr)
        return 2
    module, func = COMMANDS[name].split(":")
    return int(getattr(importlib.import_module(module), func)(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
