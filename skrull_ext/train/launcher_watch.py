"""Workers stop within a bounded time when their launcher dies.

Why: ``kill -9`` of torchrun (or of its process group: torchrun starts each
worker in its own session, so the group signal misses them) left the workers
training to the last step and saving checkpoints, with no one left to
restart or stop them, while a relaunch in the same folder ran beside them.

torchrun's agent is each worker's parent. A daemon thread polls
``os.getppid()`` every ``POLL_S`` (0.5 s); when it is no longer the pid it
had at start (the orphan was re-parented to init or a subreaper), the worker
prints one line from its first local rank,

    error: the launcher (torchrun, pid 4242) died at step 3; stopping (last checkpoint: step-2 in DIR)

(stop_line.py) and exits with status 1 through ``os._exit``, which ends the
process even while its main thread waits in a collective. The bound: each
worker is gone within ``POLL_S`` plus its exit (about 1 s) of the launcher's
death. A worker whose collective fails first (its peer already left) checks
the watch before raising (``JobTrainer.train``) and ends the same way,
without a traceback. Rank 0 removes the dump folder's lock (run_lock.py)
before it exits, so a relaunch then finds the folder free.

Not ``prctl(PR_SET_PDEATHSIG)``: it fires when the *thread* that forked the
worker exits, not the process, kills without a last line, and is Linux only.
The watch runs only under torchrun (``TORCHELASTIC_RUN_ID``): a process
started from a shell outlives that shell by design (nohup).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from skrull_ext.train import stop_line

__all__ = ["POLL_S", "LauncherWatch", "current", "launcher_gone", "start_launcher_watch"]

POLL_S = 0.5
"""Seconds between two looks at the parent pid."""
EXIT_STATUS = 1

_watch: LauncherWatch | None = None


class LauncherWatch:
    """Calls ``on_orphan(launcher_pid)`` once, from its thread, when the parent changes."""

    def __init__(self, launcher_pid: int, on_orphan: Callable[[int], None], poll_s: float = POLL_S,
                 getppid: Callable[[], int] = os.getppid):
        self.launcher_pid, self.on_orphan, self.poll_s, self._getppid = launcher_pid, on_orphan, poll_s, getppid
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="skrull-launcher-watch", daemon=True)

    def start(self) -> LauncherWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def orphaned(self) -> bool:
        """Whether the launcher is gone (this process has another parent now)."""
        return self._getppid() != self.launcher_pid

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            if self.orphaned():
                self.on_orphan(self.launcher_pid)
                return


def end_orphan(launcher_pid: int) -> None:
    """The launcher's death line, then exit (stop_line.end)."""
    stop_line.end(stop_line.stop_message(f"the launcher (torchrun, pid {launcher_pid}) died"), EXIT_STATUS)


def current() -> LauncherWatch | None:
    """This process's watch, if one runs."""
    return _watch


def launcher_gone() -> bool:
    """Whether this process's launcher died (the watch is ending it): the store it
    hosted is gone too, and a call on it prints a C++ stack of its own."""
    return _watch is not None and _watch.orphaned()


def start_launcher_watch() -> LauncherWatch | None:
    """Start the watch once per process, under torchrun only; None elsewhere."""
    global _watch
    if _watch is None and os.environ.get("TORCHELASTIC_RUN_ID"):
        _watch = LauncherWatch(os.getppid(), end_orphan).start()
    return _watch
