"""The last line of a run stopped from outside: at which step, and which checkpoint holds.

Why: a Ctrl-C printed a traceback per rank and torchrun's, and a run whose
launcher died trained on unseen; neither said where the run stopped or what
a relaunch would continue from. Both now end in one line from the first
local rank (rank 0 on one host), e.g.

    error: interrupted (SIGINT) at step 3; stopping (last checkpoint: step-2 in ./outputs/crash/checkpoint)

"at step N" is ``trainer.step``: the step in progress, or the last one done
if the stop came between steps. The checkpoint is the newest complete one
(``step-N/.metadata`` written, as torchtitan's own load counts them), the
one the same command continues from. ``JobTrainer`` registers itself here
(``track``) before it builds anything, so a stop during start-up says so.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref

from skrull_ext.cli_errors import record_error_line
from skrull_ext.train.job.resume_checks import saved_steps
from skrull_ext.train.run_lock import release_all

__all__ = ["end", "last_checkpoint", "position", "stop_message", "track"]

_ending = threading.Lock()
"""Held by the one call of ``end`` that prints and exits."""
SECOND_CALLER_WAIT_S = 5.0
"""How long a second ``end`` waits for the first one's ``os._exit`` before exiting itself."""

_run: tuple[weakref.ref, object] | None = None
"""(the trainer, its config) of this process's run."""


def track(trainer, config) -> None:
    """Name the run that a stop line describes (the newest trainer of the process)."""
    global _run
    _run = (weakref.ref(trainer), config)


def position() -> str:
    """Where the run is: "at step N", "before its first step", or "while starting"."""
    trainer = _run[0]() if _run is not None else None
    step = getattr(trainer, "step", None)
    if step is None:
        return "while starting"
    return f"at step {step}" if step > 0 else "before its first step"


def last_checkpoint(config) -> str:
    """The newest complete checkpoint of the run's folder, or why there is none."""
    ckpt = getattr(config, "checkpoint", None)
    if ckpt is None or not ckpt.enable:
        return "no checkpoint: checkpoint.enable is off"
    folder = os.path.join(config.dump_folder, ckpt.folder)
    full, _ = saved_steps(folder)
    return f"last checkpoint: step-{full[-1]} in {folder}" if full else f"no checkpoint saved in {folder}"


def stop_message(what: str) -> str:
    """``what`` (e.g. "interrupted (SIGINT)") with the position and the checkpoint."""
    config = _run[1] if _run is not None else None
    saved = last_checkpoint(config) if config is not None else "no checkpoint"
    return f"{what} {position()}; stopping ({saved})"


def end(message: str, status: int) -> None:
    """Print ``error: message`` (first local rank only), record it for torchrun,
    release the dump folder's lock and exit now with ``status``: from a signal
    handler or a thread, with the main thread possibly inside a collective, only
    ``os._exit`` ends the process at once. Writes go straight to fd 2 (a handler
    may interrupt a print in progress).

    Once per process: the launcher watch's thread and the main thread (whose
    collective failed because a peer's launcher died) can both reach here at
    once, and a run ends in one line. A second caller prints nothing and waits
    for the first one's exit (``SECOND_CALLER_WAIT_S``; a signal handler that
    interrupted the first call on its own thread exits after it)."""
    if not _ending.acquire(blocking=False):
        time.sleep(SECOND_CALLER_WAIT_S)
        os._exit(status)
        return  # only where os._exit returns (tests record it)
    try:
        _print_and_exit(message, status)
    finally:
        _ending.release()  # reached only where os._exit returns (tests record it)


def _print_and_exit(message: str, status: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - reentrant or closed: the line matters more
            pass
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        try:
            os.write(2, f"error: {message}\n".encode())
        except OSError:
            pass  # the terminal went with the launcher
    record_error_line(message)
    release_all()  # the dump folder is free for the next run (run_lock.py)
    os._exit(status)
