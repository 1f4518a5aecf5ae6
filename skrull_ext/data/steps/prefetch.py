"""Steps built ahead of the training step, on one background thread.

``Prefetcher(produce, depth)`` calls ``produce()`` on a daemon thread, at most
``depth`` results ahead of the consumer, and ``get()`` hands them out in the
order they were made. The Skrull dataloader (scheduling.py) uses it to build
steps t+1..t+K (global batch draw, length limit, plan, validation, buffers)
while step t trains (``[dataloader] prefetch_steps`` = K).

Why a thread and not a process: the costly parts of a step do not hold the
GIL. The scheduler's C++ core releases it for the whole plan
(cpp/src/bindings.cpp), and so does the CP-SAT fallback inside or-tools'
``Solve`` (a Python thread beside a solve keeps most of its rate: docs/data.md,
"Why a thread, not a process"). What is left in Python (drawing the
batch, building the buffers' tensors) is a few ms against a step of
hundreds, and the training loop itself waits on the device most of the time,
with the GIL released. A process would add pickling every step's tensors
across, a second copy of the source and the scheduler, and its own shutdown,
for no gain (``python -m skrull_ext.bench datawait``, docs/data.md).

When: by default a result's slot is given back as it is handed out, so the
thread starts the next build at once. The trainer asks for ``get(hold=True)``
and ``resume()``s once the step's micro-batches are queued (train/trainer.py):
the build's Python then runs while the training thread waits for the device,
not in the host work between the step's phases that a GPU idles on (CPU,
host24 job, 15 steps: the host's time between the phases 2.6-3.0 ms a step
building at once, 1.1-1.4 ms held, 1.0 ms with no thread; docs/training.md).

Determinism: ``produce`` is the only thing the thread runs, and it is the
same function, called in the same order, as the synchronous path, so the
steps are the same. The results carry whatever state the consumer needs to
checkpoint (the dataloader puts its state after each step in them), so what
is saved is the state of the last step handed out, never the thread's.

Errors: an exception raised by ``produce`` is handed out in place of the
step it was building, after every step made before it; ``get()`` re-raises
it (the same object: type and message unchanged) and the thread stops.

Shutdown: ``close()`` stops the thread (it finishes the step in hand, then
exits without waiting for a free slot) and joins it; dropping the
Prefetcher stops its thread, and an ``atexit`` hook closes any still open, so no
thread is left inside the C++ core while the interpreter shuts down. The
thread references ``produce`` and its queue, never the Prefetcher, so an
unreferenced Prefetcher is collected (and closed) even while it runs.
"""

from __future__ import annotations

import atexit
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

_POLL_S = 0.1
"""How often a waiting thread looks at the stop flag."""

_OPEN: weakref.WeakSet[Prefetcher] = weakref.WeakSet()


class _Failed:
    """What the thread hands out in place of the step whose ``produce()`` raised."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


def _run(produce: Callable[[], object], out: queue.Queue, slots: threading.Semaphore, stop: threading.Event) -> None:
    while not stop.is_set():
        if not slots.acquire(timeout=_POLL_S):  # at most `depth` made and not yet taken
            continue
        if stop.is_set():
            return
        try:
            out.put(produce())
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, raised there
            out.put(_Failed(e))
            return


class Prefetcher(Generic[T]):
    """``produce()``'s results, made ``depth`` ahead on a daemon thread, in order."""

    def __init__(self, produce: Callable[[], T], depth: int, name: str = "skrull-prefetch") -> None:
        if depth < 1:
            raise ValueError(f"Prefetcher depth must be >= 1, got {depth}")
        self._out: queue.Queue = queue.Queue()
        self._slots = threading.Semaphore(depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=_run, args=(produce, self._out, self._slots, self._stop),
                                        name=name, daemon=True)
        self.failed: BaseException | None = None
        """The exception ``produce()`` raised, once ``get()`` has re-raised it."""
        self._held = False
        """A slot taken by ``get(hold=True)`` and not yet given back (``resume``)."""
        self._thread.start()
        _OPEN.add(self)

    def get(self, hold: bool = False) -> T:
        """The next result; re-raises ``produce()``'s exception at the result it replaced.

        ``hold``: the thread does not start the result that replaces this one until
        ``resume()`` (or the next ``get``) says so. The trainer resumes it where its own
        thread will wait for the device (its micro-batches queued): building a step holds the
        GIL for milliseconds of Python (17 ms a step on the H200 run), which, started as a step
        is handed out, the training thread would wait for in the host work a GPU then idles on
        (zero_grad, the first micro-batch's launches). A held slot is given back by the next
        ``get`` in any case, so a consumer that never resumes is at most one result less ahead."""
        self.resume()
        while True:
            try:
                item = self._out.get(timeout=_POLL_S)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._out.empty():
                    raise RuntimeError("the prefetch thread stopped without a result (closed?)") from None
        if isinstance(item, _Failed):
            self.failed = item.error
            self.close()
            raise item.error
        if hold:
            self._held = True
        else:
            self._slots.release()
        return item

    def resume(self) -> None:
        """Let the thread start the result held back by ``get(hold=True)`` (none held: nothing)."""
        if self._held:
            self._held = False
            self._slots.release()

    def wait_ready(self, n: int, timeout: float) -> bool:
        """Wait until ``n`` results are made and not yet taken (False on timeout,
        or when the thread ended first). A result counts once it is on the queue,
        after ``produce()`` returned: whatever ``produce`` changed is done by then."""
        with self._out.not_empty:  # queue.Queue notifies it on every put
            return self._out.not_empty.wait_for(
                lambda: self._out._qsize() >= n or not self._thread.is_alive(), timeout
            ) and self._out._qsize() >= n

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def close(self, timeout: float = 60.0) -> None:
        """Stop the thread and wait for it (it ends after the step in hand; a
        CP-SAT solve is bounded by its deterministic limit). Idempotent."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        _OPEN.discard(self)

    def __del__(self) -> None:
        stop = getattr(self, "_stop", None)  # None: __init__ raised before making it
        if stop is not None:
            stop.set()  # no join here: __del__ may run on any thread, at any time


@atexit.register
def _close_all() -> None:
    for p in list(_OPEN):
        p.close()
