"""How every skrull-ext command line reports a user's mistake: one line.

A ``UserError`` (a bad key or value in a job file or flag, an unreadable data
file) is printed as ``error: <message>`` on stderr by rank 0 only, and the
process exits 2: no traceback, and not once per rank under torchrun. Any
other exception is a bug and keeps its traceback. ``--traceback`` on the
command line (or ``SKRULL_TRACEBACK=1``) shows the traceback of a user error
too.

Under torchrun, torchtitan's ``Trainer.__init__``/``train`` are wrapped in
torchelastic's ``@record``, which writes the exception's traceback to the
worker's error file (``TORCHELASTIC_ERROR_FILE``) before the exception
reaches us; torchrun then prints that file in its failure summary. A user
error rewrites the file with the one-line message (``record_error_line``),
so the summary says what went wrong instead of where in torchtitan it was
raised.

A launch with nothing left to train (``NothingToTrain``: the checkpoint it
continues is already at ``training.steps``) prints its one line on stdout,
from rank 0, and exits 0: the job is done, so a script that re-submits it
sees success.
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from skrull_ext.errors import NothingToTrain, UserError

__all__ = ["TRACEBACK_FLAG", "argument_type", "freeze_at_exit", "record_error_line", "run_cli"]

TRACEBACK_FLAG = "--traceback"


def argument_type(parse: Callable[[str], Any], name: str) -> Callable[[str], Any]:
    """``parse`` as an argparse ``type`` whose ValueError is the usage line's own message
    (``argument --lengths: ...``, exit 2): argparse reads any other exception from a type as
    "invalid <name> value", naming neither the value's fault nor the limit."""
    import argparse

    def read(text: str):
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    read.__name__ = name
    return read


def record_error_line(message: str) -> None:
    """Write ``message`` as this worker's torchelastic error file (no traceback);
    a no-op outside torchrun. The format is torchelastic's plain-message one
    (``ProcessFailure`` shows a str ``message`` as is)."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    try:
        with open(path, "w") as f:
            json.dump({"message": message, "timestamp": str(int(time.time()))}, f)
    except OSError:
        pass  # the summary falls back to torchrun's own line; the message was printed


def freeze_at_exit() -> None:
    """Freeze the heap (``gc.freeze``) once the interpreter starts shutting down.

    Why: the shutdown's cyclic collections walk the millions of objects that
    torch, torchtitan and transformers leave, 1-3 s of CPU in every process
    that imported them, each torchrun rank included (2026-11-30, a process
    that imported the trainer: 11-12 s of CPU in all, 7-8 s frozen, as with
    ``os._exit``). An atexit handler runs after the threads are joined and
    before the modules are cleared, so the rest of the shutdown still runs
    (the other atexit handlers, modules cleared, their files closed); a
    caller in a longer-lived process (a test) is untouched until it exits.
    """
    atexit.register(gc.freeze)


def run_cli(main: Callable[[list[str]], int | None], argv: list[str] | None = None) -> None:
    """``sys.exit(main(argv))``, a UserError turned into one line and exit status 2."""
    freeze_at_exit()
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = TRACEBACK_FLAG in argv or os.environ.get("SKRULL_TRACEBACK", "") not in ("", "0")
    argv = [a for a in argv if a != TRACEBACK_FLAG]
    try:
        rc = main(argv)
    except NothingToTrain as e:  # a finished run launched again: done, say so, succeed
        if int(os.environ.get("RANK", "0")) == 0:
            print(" ".join(str(e).split()), flush=True)
        sys.exit(0)
    except BrokenPipeError:  # stdout closed by its reader (``... | head``): not an error of ours, no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's flush at exit would raise again
        sys.exit(141)  # 128 + SIGPIPE, what a shell reports for a writer whose reader left
    except UserError as e:
        if debug:
            raise
        line = " ".join(str(e).split())
        record_error_line(line)
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"error: {line}", file=sys.stderr)
        sys.exit(2)
    sys.exit(rc or 0)
