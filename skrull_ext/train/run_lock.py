"""A run owns its dump folder while it lives: ``<dump_folder>/.skrull_run.lock``.

Why: a launcher killed with ``kill -9`` left its workers training, and a
relaunch of the same command in the same folder loaded their newest
checkpoint while they were still writing the next: two runs wrote one
folder, and nothing said so.

Rank 0 takes the lock first thing in ``JobTrainer.__init__``, before
anything is written (checkpoint load, TensorBoard, plan logs, HF outputs).
The lock is ``fcntl.flock`` on the open file, which the kernel releases when
the process dies however it dies; the file holds the owner's host, pid,
launcher pid, start time and a heartbeat (its mtime, touched every
``BEAT_S``), for the message and for the stale checks. A second run on the
folder is refused with one line (``UserError``: ``error: ...``, exit 2)
naming the folder, the owner and what to do. Its other ranks do not go on
either: they wait for rank 0 in torchtitan's ``init_process_group``, which a
refused rank 0 never joins, and torchrun stops them when rank 0 exits.

A dead run's lock does not hold forever. The lock is taken over, with one
logged line naming the run it was, when:

- the flock is free (the owner died without releasing it: ``kill -9``);
- the flock is held but the owner ran on this host and its pid is gone (or
  is another process now): a child process kept the file open;
- the owner ran on another host and its heartbeat is older than ``STALE_S``
  (a host that died; flock is not reliable over every network filesystem).

One process that builds a second trainer on the folder it holds reuses its
lock (counted), so in-process tests and a validation trainer are not refused.
"""

from __future__ import annotations

import atexit
import errno
import fcntl
import json
import os
import socket
import threading
import time
from dataclasses import asdict, dataclass

from torchtitan.tools.logging import logger

from skrull_ext.errors import UserError

__all__ = ["BEAT_S", "LOCK_NAME", "STALE_S", "RunLock", "claim_dump_folder", "release_all", "take"]

LOCK_NAME = ".skrull_run.lock"
BEAT_S = 10.0
"""How often the owner touches the lock file (its mtime is the heartbeat)."""
STALE_S = 60.0
"""A lock of another host's run whose heartbeat is this old is taken over."""
_EMPTY_WAIT_S = 2.0
"""How long a lock held but still empty (its owner is writing it) is re-read."""


@dataclass(frozen=True, slots=True)
class Owner:
    """What a lock file says about the run that holds it."""

    host: str
    pid: int
    launcher_pid: int
    started: str
    start_ticks: str

    def describe(self) -> str:
        launcher = f", launcher pid {self.launcher_pid}" if self.launcher_pid else ""
        return f"pid {self.pid}{launcher} on {self.host}, started {self.started}"


def _start_ticks(pid: int) -> str:
    """A process's start time in clock ticks (/proc), to tell a reused pid; "" where unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _me() -> Owner:
    launcher = os.getppid() if os.environ.get("TORCHELASTIC_RUN_ID") else 0
    return Owner(host=socket.gethostname(), pid=os.getpid(), launcher_pid=launcher,
                 started=time.strftime("%Y-%m-%d %H:%M:%S"), start_ticks=_start_ticks(os.getpid()))


def _read(fd: int) -> Owner | None:
    """The owner a lock file names; None if it is empty or unreadable."""
    try:
        raw = os.pread(fd, 4096, 0)
        d = json.loads(raw.decode())
        return Owner(host=str(d["host"]), pid=int(d["pid"]), launcher_pid=int(d.get("launcher_pid", 0)),
                     started=str(d.get("started", "?")), start_ticks=str(d.get("start_ticks", "")))
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None


def _alive_here(owner: Owner) -> bool:
    """Whether ``owner`` (a process of this host) still runs, as the same process."""
    try:
        os.kill(owner.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's live process
    ticks = _start_ticks(owner.pid)
    return not (owner.start_ticks and ticks and ticks != owner.start_ticks)


def _stale(owner: Owner, fd: int, now: float) -> str | None:
    """Why a held lock's owner is gone, or None if it lives."""
    if owner.host == socket.gethostname():
        return None if _alive_here(owner) else "its process is gone"
    age = now - os.fstat(fd).st_mtime
    return f"its heartbeat is {age:.0f} s old (> {STALE_S:g} s)" if age > STALE_S else None


class RunLock:
    """A held lock: the open, flocked file and the thread that touches it."""

    def __init__(self, folder: str, path: str, fd: int, taken_over: str | None):
        self.folder, self.path, self.fd = folder, path, fd
        self.taken_over = taken_over
        """The line saying whose dead lock this replaced (None: the folder was free)."""
        self.count = 1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="skrull-run-lock", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(BEAT_S):
            try:
                os.utime(self.fd)
            except OSError:
                pass  # a heartbeat missed is not a failure of the run

    def release(self) -> None:
        """Drop one hold; the last removes the file (if still ours) and unlocks it."""
        self.count -= 1
        if self.count > 0 or self.fd < 0:
            return
        self._stop.set()
        _held.pop(os.path.realpath(self.folder), None)
        try:
            if os.stat(self.path).st_ino == os.fstat(self.fd).st_ino:
                os.unlink(self.path)
        except OSError:
            pass
        os.close(self.fd)  # closing the last descriptor releases the flock
        self.fd = -1


_held: dict[str, RunLock] = {}
"""This process's locks, by the folder's real path."""


@atexit.register
def release_all() -> None:
    """Release every lock of this process (at exit, and before a stop's ``os._exit``),
    so the next run in the folder finds it free rather than taking it over."""
    for lock in list(_held.values()):
        lock.count = 1
        lock.release()


def _refusal(folder: str, owner: Owner | None) -> str:
    who = owner.describe() if owner is not None else "a run that has not written its name yet"
    stop = f"stop it (kill {owner.launcher_pid or owner.pid} on {owner.host})" if owner else "stop it"
    return (f"dump_folder = {folder} is in use by a live run ({who}; {os.path.join(folder, LOCK_NAME)}): "
            f"wait for it to end, {stop}, or give this run another --dump_folder")


def take(folder: str) -> RunLock:
    """Own ``folder`` (created if missing) for this process, or raise UserError naming the owner."""
    key = os.path.realpath(folder)
    if key in _held:
        _held[key].count += 1
        return _held[key]
    path = os.path.join(folder, LOCK_NAME)
    taken_over = None
    for _ in range(5):  # each retry follows a file that was replaced or removed under us
        try:
            os.makedirs(folder, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise UserError(f"dump_folder = {folder}: cannot create {path} ({e.strerror}); "
                            "give the run a folder it can write") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                os.close(fd)
                raise
            owner = _read(fd)
            deadline = time.monotonic() + _EMPTY_WAIT_S
            while owner is None and time.monotonic() < deadline:  # locked a moment ago, not yet written
                time.sleep(0.1)
                owner = _read(fd)
            why = _stale(owner, fd, time.time()) if owner is not None else None
            if why is None:
                os.close(fd)
                raise UserError(_refusal(folder, owner))
            taken_over = f"a run that is gone ({owner.describe()}: {why})"
            try:
                if os.stat(path).st_ino == os.fstat(fd).st_ino:
                    os.unlink(path)  # a fresh file, whose flock is free, replaces it
            except FileNotFoundError:
                pass
            os.close(fd)
            continue
        try:
            if os.stat(path).st_ino != os.fstat(fd).st_ino:  # removed or replaced after our open
                os.close(fd)
                continue
        except FileNotFoundError:
            os.close(fd)
            continue
        previous = _read(fd)
        if previous is not None and previous.host != socket.gethostname() and \
                time.time() - os.fstat(fd).st_mtime <= STALE_S:
            os.close(fd)  # its flock may not reach us (a network filesystem); its heartbeat does
            raise UserError(_refusal(folder, previous))
        if taken_over is None and previous is not None:
            taken_over = f"a run that ended without releasing it ({previous.describe()})"
        me = _me()
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(asdict(me)) + "\n").encode(), 0)
        os.fsync(fd)
        lock = RunLock(folder, path, fd, None if taken_over is None else
                       f"{folder}: took over the lock of {taken_over}")
        _held[key] = lock
        return lock
    raise UserError(f"dump_folder = {folder}: could not take {path} (it kept changing under 5 tries); "
                    "another launch is starting there")


def claim_dump_folder(dump_folder: str, rank: int) -> RunLock | None:
    """Rank 0's lock on the run's dump folder, a take-over logged in one line;
    None on the other ranks (they wait for rank 0: see the module docstring)."""
    if rank != 0:
        return None
    lock = take(dump_folder)
    if lock.taken_over is not None and lock.count == 1:
        logger.warning(lock.taken_over)
    return lock
