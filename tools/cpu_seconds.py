"""CPU seconds of a command and of every process it leaves behind, orphans included.

    python tools/cpu_seconds.py python -m pytest -p no:cacheprovider -o addopts="" -q tests/integration_tests/X.py

Why not ``/usr/bin/time``: it reports what the command's own wait() collects. The integration
tests' ranks are forks of a multiprocessing forkserver (tests/integration_tests/forked.py) that
pytest never waits for: when pytest exits, the forkserver (with every rank's CPU, which it reaped)
is reparented to init, and ``time`` shows none of it (a forkserver child burning 2 s of CPU reads
0.03 s). Here this process is a child subreaper (Linux prctl): the orphans are reparented to it
and reaped, so RUSAGE_CHILDREN holds the whole tree. Prints one line to stderr; exits with the
command's status.
"""

import ctypes
import os
import resource
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36


def main(argv: list[str]) -> int:
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed (Linux only)")
    start = time.monotonic()
    rc = subprocess.call(argv)
    while True:  # the orphans: reparented here, reaped here
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"{r.ru_utime:.1f} user {r.ru_stime:.1f} sys {r.ru_utime + r.ru_stime:.1f} CPU s "
          f"{time.monotonic() - start:.1f} wall (the command and every descendant)", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
