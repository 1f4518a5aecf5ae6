"""torchrun, whose failure ends in the workers' one line instead of a traceback.

    python -m skrull_ext.launch --standalone --nproc_per_node 2 \\
        -m skrull_ext.train --config-file skrull_ext/jobs/debug_cpu.toml \\
        --parallelism.context_parallel_degree 2

The arguments are torchrun's. Why not torchrun itself: when a worker exits
non-zero, torchrun's launcher raises ``ChildFailedError`` out of its
``main``, so Python prints the launcher's own traceback (torchrun's frames,
never the job's) and then the failure summary, after the one line rank 0
printed for a user error (``cli_errors``). This runs torchrun's ``run`` and,
on ``ChildFailedError``:

- the first failed worker exited 2 (a user error; its line is printed and is
  its error file's message): exit 2, adding nothing. "First" leaves out the
  workers torchrun itself stopped (SIGTERM) once one had failed: their error
  file's time is when they recorded the same error, which may be before the
  worker that exited first (each rank reads the bad record and ends in its
  own time), and torchrun's summary names the earliest file;
- any other failure: print torchrun's summary (each failed rank, its exit
  code or signal and its error file's message or traceback) without the
  launcher's frames, and exit 1.

And when torchrun itself gets a signal (Ctrl-C, ``kill``), it stops the
workers (each worker's last line says where the run stopped:
skrull_ext/train/interrupt.py) and raises ``SignalException`` out of its
``main``; this exits 128 + the signal's number without that traceback.

Everything else (rendezvous, restarts, log lines) is torchrun's.
"""

from __future__ import annotations

import signal
import sys

from torch.distributed.elastic.multiprocessing import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
from torch.distributed.run import parse_args, run

from skrull_ext.cli_errors import freeze_at_exit

__all__ = ["USER_ERROR_EXIT", "main"]

USER_ERROR_EXIT = 2
"""The exit status of a worker that printed a user error (cli_errors.run_cli)."""


def main(argv: list[str] | None = None) -> int:
    freeze_at_exit()
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        run(args)
    except ChildFailedError as e:
        if _cause(e).exitcode == USER_ERROR_EXIT:
            return USER_ERROR_EXIT
        print(str(e).strip("\n"), file=sys.stderr)
        return 1
    except SignalException as e:
        return 128 + int(e.sigval)
    return 0


def _cause(e: ChildFailedError) -> ProcessFailure:
    """The earliest failure among the workers torchrun did not stop itself (all, if it stopped each)."""
    failures = list(e.failures.values())
    own = [f for f in failures if f.exitcode != -signal.SIGTERM] or failures
    return min(own, key=lambda f: f.timestamp)


if __name__ == "__main__":
    sys.exit(main())
