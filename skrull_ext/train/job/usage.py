"""The usage of every entry point that takes a job (``python -m skrull_ext.train``, the
profiler, ``prepare``: each names itself, ``module``): what a command line without one prints,
and its exit status.

It imports nothing but ``os`` and ``sys``: ``python -m skrull_ext.train --help`` (or
no arguments) is answered before torch and torchtitan are imported, which take seconds
(``__main__`` asks here first). A command line without a job prints the usage and exits
0 for ``--help``, else 2 with an ``error:`` line after it, as every other refusal ends.
"""

from __future__ import annotations

import os
import shlex
import sys

__all__ = ["JOBS_DIR", "USAGE", "entry_module", "exit_without_job", "has_job", "job_args", "remember_job",
           "shipped_jobs"]

JOBS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "jobs")
"""The shipped job files (``skrull_ext/jobs``)."""

USAGE = """\
usage: python -m {module} --config-file JOB.toml [--SECTION.KEY VALUE ...] [--traceback]
       torchrun --nproc_per_node N -m {module} --config-file JOB.toml [...]

JOB.toml describes the model, data, parallelism and [skrull] scheduling
(README.md, "Training with Skrull"). Shipped jobs, in skrull_ext/jobs/ (each
file's header says what it trains and how to launch it):
{jobs}

  --config-file JOB.toml    the job (required)
  --SECTION.KEY VALUE       override one key of the job file, e.g. --training.steps 3
  --config-file JOB.toml --help
                            every key the job can set, its value there and help
  --module M --config NAME  a torchtitan config-registry function instead of a job file
  --traceback               on a config error, the full traceback too (or SKRULL_TRACEBACK=1)
"""

NO_JOB = "no job given: name one with --config-file JOB.toml (e.g. skrull_ext/jobs/debug_cpu.toml)"
"""The ``error:`` line after the usage when a command line names no job."""


def shipped_jobs() -> str:
    """The job files shipped in skrull_ext/jobs/, wrapped for the usage text."""
    names = sorted(n for n in os.listdir(JOBS_DIR) if n.endswith(".toml"))
    lines, line = [], " "
    for name in names:
        if len(line) + len(name) + 2 > 78:
            lines.append(line.rstrip())
            line = " "
        line += f" {name}"
    return "\n".join([*lines, line.rstrip()])


def has_job(argv: list[str]) -> bool:
    """Whether the command line names a job (a job file, or torchtitan's ``--module``)."""
    return any(a == "--module" or a.startswith(("--module=", "--config-file", "--config_file")) for a in argv)


def entry_module() -> str:
    """The module ``python -m`` ran (``skrull_ext.profile`` for ``python -m skrull_ext.profile``
    or its torchrun), for a usage whose caller named none; ``__main__`` where none ran (a script).
    The entry points name themselves: this job layer sits below them and names none."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return spec.name.removesuffix(".__main__") if spec is not None and spec.name else "__main__"


def exit_without_job(argv: list[str], module: str) -> None:
    """Return when ``argv`` names a job; else print the usage of ``python -m module`` (rank 0
    only) and exit: 0 to stdout for ``-h``/``--help``, else 2 to stderr, ending in one ``error:``
    line."""
    if has_job(argv):
        return
    asked = any(a in ("-h", "--help") for a in argv)
    if int(os.environ.get("RANK", "0")) == 0:
        text = USAGE.format(module=module, jobs=shipped_jobs())
        if asked:
            print(text, end="")
        else:
            print(f"{text}\nerror: {NO_JOB}", file=sys.stderr)
    raise SystemExit(0 if asked else 2)


_job_argv: list[str] | None = None
"""The command line of this process's job (``remember_job``), without the entry point."""


def remember_job(argv: list[str]) -> None:
    """Keep the command line ``load_config`` read this process's job from, when it names a job
    file: the trainer keeps no path of it (torchtitan's config has none), and a line that
    suggests a command on the same job names the file and flags the user gave (``job_args``)."""
    global _job_argv
    if any(a.startswith(("--config-file", "--config_file")) for a in argv):
        _job_argv = list(argv)


def job_args(placeholder: str = "--config-file <this job's file>") -> str:
    """``--config-file JOB.toml`` and the job's own flags as given, shell-quoted, for a command
    on this process's job (the profiler's: it takes the job's flags too); ``placeholder`` where
    no job file was read (torchtitan's ``--module``, or a trainer built without a command line)."""
    return placeholder if _job_argv is None else shlex.join(_job_argv)
