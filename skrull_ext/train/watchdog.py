"""A rank that stops answering ends the job in a bounded time, by name.

A stopped rank (``kill -STOP``, a host that froze, a process swapped out)
left the other ranks waiting inside a collective until its timeout
(``[comm] train_timeout_seconds``, 100 s) fired with "Timed out waiting
100000ms for send operation", naming no rank; torchrun then waited its
shutdown timeout (30 s) before killing the stopped process: 132 s, and no
name.

Heartbeat: a thread on each rank stamps ``<beat> <step>`` in the launch's
TCPStore (torchrun's agent store, ``MASTER_ADDR:MASTER_PORT``) every
``interval_s`` (a tenth of the timeout, at most 1 s). A live process keeps
beating while its main thread computes or waits in a collective; a stopped
one cannot. Rank 0 watches every other rank, the others watch rank 0. A
stamp unchanged for ``[comm] heartbeat_timeout_seconds`` (30 s by default)
makes the first rank to see it print one line,

    error: rank 1 stopped answering at step 7 (no heartbeat for 30.4 s; comm.heartbeat_timeout_seconds = 30)

write it to its torchelastic error file, and exit (status 1); torchrun then
stops the other ranks. A stopped process ignores torchrun's SIGTERM until
torchrun's SIGKILL 30 s later (torch 2.13's agent does not pass
``--shutdown-timeout`` to that stop), so the reporter first SIGKILLs the
silent rank itself when it runs on the same host and is stopped (state T,
checked against the pid and start time the rank published). The bound, one
host: the job is over about ``heartbeat_timeout_seconds + interval_s`` after
the rank stopped (31 s by default); a rank on another
host is killed by its own torchrun, up to 30 s later.
``heartbeat_timeout_seconds = 0`` turns the watch off; keep it below
``train_timeout_seconds``, which otherwise fires first, unnamed.

The stamps are compared on the watcher's own clock (a stamp that changed is
alive), so hosts' clocks need not agree. Only the first reporter prints (a
counter in the store). Runs from ``JobTrainer.train`` (checkpoint load,
steps, saves, HF export) and writes ``done`` when the rank leaves it, so a
rank that finished first is not taken for a stopped one.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta

import torch.distributed as dist
from torchtitan.tools.logging import logger

from skrull_ext.cli_errors import record_error_line
from skrull_ext.train.launcher_watch import launcher_gone
from skrull_ext.train.run_lock import release_all

__all__ = ["Heartbeat", "start_heartbeat"]

DONE = "done"


class Heartbeat:
    """Stamps this rank's beat and step in ``store``; watches ``watched`` ranks' stamps.

    ``on_stale(message)`` is called once, from the thread, when a watched rank's
    stamp (or the store itself) has not answered for ``timeout_s``; the default
    prints the line, records it for torchrun and ends the process.
    """

    def __init__(self, store: dist.Store, rank: int, world_size: int, timeout_s: float,
                 step: Callable[[], int], on_stale: Callable[[str], None] | None = None,
                 interval_s: float | None = None, kill_stopped: bool = True,
                 clock: Callable[[], float] = time.monotonic):
        self.store, self.rank, self.timeout_s, self.step = store, rank, timeout_s, step
        self.clock = clock
        """Seconds, monotonic: every staleness is measured on it (a test drives ``_tick`` on its own clock)."""
        self.kill_stopped = kill_stopped
        """Whether the reporter SIGKILLs a stopped rank on its host (see the module docstring)."""
        self.interval_s = interval_s if interval_s is not None else min(1.0, timeout_s / 10)
        self.watched = [r for r in range(world_size) if r != rank] if rank == 0 else [0]
        self.on_stale = on_stale or end_job
        self._beat = 0
        self._seen: dict[int, tuple[str | None, float]] = {}
        """Per watched rank: its last stamp and when (our clock) it changed."""
        self._store_ok_at = self.clock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="skrull-heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        self.store.set(f"{self.rank}/process", _process_id())
        self._tick()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop beating and watching; tell the watchers this rank is done."""
        self._stop.set()
        if self._thread.ident is not None:  # started
            self._thread.join(timeout=self.timeout_s)
        if launcher_gone():
            return
        try:
            self.store.set(str(self.rank), DONE)
        except Exception:  # noqa: BLE001 - the store may be gone at the end of a job
            pass

    def silent(self) -> list[tuple[int, int, float]]:
        """(rank, last step, seconds since its stamp changed) of watched ranks silent for
        more than three beats, oldest first: who a collective that timed out waited for."""
        now = self.clock()
        out = [(r, _step(v), now - t) for r, (v, t) in self._seen.items()
               if v != DONE and now - t > 3 * self.interval_s]
        return sorted(out, key=lambda x: -x[2])

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._tick()

    def _tick(self) -> None:
        if launcher_gone():  # the store died with torchrun; launcher_watch.py ends this process
            return
        now = self.clock()
        try:
            self._beat += 1
            self.store.set(str(self.rank), f"{self._beat} {int(self.step())}")
            stamps = self._read()
        except Exception as e:  # noqa: BLE001 - a store timeout or a closed connection
            if now - self._store_ok_at >= self.timeout_s and not self._stop.is_set():
                self._report(f"the rendezvous store (MASTER_ADDR:MASTER_PORT) stopped answering for "
                             f"{now - self._store_ok_at:.1f} s ({type(e).__name__}); the rank hosting it "
                             f"(rank 0 without torchrun) or its host stopped")
            return
        self._store_ok_at = now
        for r, value in stamps.items():
            if r not in self._seen:  # first sight (stamped or not yet): its clock starts now
                self._seen[r] = (value, now)
                continue
            last, since = self._seen[r]
            if value != last:
                self._seen[r] = (value, now)
            elif value != DONE and now - since >= self.timeout_s:
                step = _step(value)
                where = f"at step {step}" if step else "before its first step"
                self._report(f"rank {r} stopped answering {where} (no heartbeat for {now - since:.1f} s; "
                             f"comm.heartbeat_timeout_seconds = {self.timeout_s:g})", silent_rank=r)
                return

    def _read(self) -> dict[int, str | None]:
        """Each watched rank's stamp (None: not stamped yet)."""
        keys = [str(r) for r in self.watched]
        if self.store.check(keys):
            return {r: v.decode() for r, v in zip(self.watched, self.store.multi_get(keys))}
        return {r: self.store.get(str(r)).decode() if self.store.check([str(r)]) else None for r in self.watched}

    def _report(self, message: str, silent_rank: int | None = None) -> None:
        self._stop.set()
        try:
            first = self.store.add("reported", 1) == 1
        except Exception:  # noqa: BLE001 - no store: say it anyway
            first = True
        if first and silent_rank is not None and self.kill_stopped:
            self._kill_if_stopped_here(silent_rank)
        self.on_stale(message if first else "")

    def _kill_if_stopped_here(self, rank: int) -> None:
        """SIGKILL ``rank``'s process if it runs on this host and is stopped (state T/t),
        the same process it published (pid and start time), and not this one."""
        try:
            host, pid, started = self.store.get(f"{rank}/process").decode().split()
            pid = int(pid)
            if host != socket.gethostname() or pid == os.getpid():
                return
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if fields[0] in ("T", "t") and fields[19] == started:
                os.kill(pid, signal.SIGKILL)
        except Exception:  # noqa: BLE001 - not ours to kill, or gone: torchrun ends it
            pass


def _process_id() -> str:
    """``host pid start-time`` of this process (start time in clock ticks, /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/stat") as f:
            started = f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        started = "0"
    return f"{socket.gethostname()} {os.getpid()} {started}"


def _step(value: str | None) -> int:
    try:
        return int(value.split()[1]) if value else 0
    except (IndexError, ValueError):
        return 0


def end_job(message: str) -> None:
    """Print ``message`` (unless another rank did), record it for torchrun, and exit
    now: the main thread is blocked in a collective that would wait out its timeout."""
    if message:
        print(f"error: {message}; ending the job", file=sys.stderr, flush=True)
        record_error_line(message)
    sys.stdout.flush()
    release_all()  # the dump folder's lock: the next run finds the folder free (run_lock.py)
    os._exit(1)


def start_heartbeat(timeout_s: float, step: Callable[[], int]) -> Heartbeat | None:
    """A started Heartbeat for this launch, or None (one process, no store address, or off)."""
    if timeout_s <= 0 or not dist.is_initialized() or dist.get_world_size() == 1:
        return None
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not host or not port:
        return None
    try:
        client = dist.TCPStore(host, int(port), is_master=False, wait_for_workers=False,
                               timeout=timedelta(seconds=max(1.0, timeout_s / 2)))
    except Exception as e:  # noqa: BLE001 - the watch is a help, never a new way to fail
        logger.warning(f"heartbeat: cannot reach the store at {host}:{port} ({e}); no stopped-rank watch")
        return None
    run = os.environ.get("TORCHELASTIC_RUN_ID", "run")
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store = dist.PrefixStore(f"skrull/heartbeat/{run}/{attempt}/", client)
    return Heartbeat(store, dist.get_rank(), dist.get_world_size(), timeout_s, step).start()
