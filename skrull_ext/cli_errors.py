"""How every skrull-ext command line reports a user's mistake: one line.

A ``UserError`` (a bad key or value in a job file or flag, an unreadable data
file) is printed as ``error: <message>`` on stderr by rank 0 only, and the
process exits 2: no traceback, and not once per rank under torchrun. Any
other exception is a bug and keeps its traceback. ``--traceback`` on the
command line (or ``SKRULL_TRACEBACK=1``) shows the traceback of a user error
too.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from skrull_ext.errors import UserError

__all__ = ["TRACEBACK_FLAG", "run_cli"]

TRACEBACK_FLAG = "--traceback"


def run_cli(main: Callable[[list[str]], int | None], argv: list[str] | None = None) -> None:
    """``sys.exit(main(argv))``, a UserError turned into one line and exit status 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = TRACEBACK_FLAG in argv or os.environ.get("SKRULL_TRACEBACK", "") not in ("", "0")
    argv = [a for a in argv if a != TRACEBACK_FLAG]
    try:
        rc = main(argv)
    except UserError as e:
        if debug:
            raise
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        sys.exit(2)
    sys.exit(rc or 0)
