"""Ctrl-C ends a run in one line saying where it stopped, without tracebacks.

Why: SIGINT to torchrun printed three tracebacks (each rank's
KeyboardInterrupt and torchrun's SignalException) and no line saying at which
step the run stopped or which checkpoint holds.

torchrun answers SIGINT by sending SIGINT to each worker (its own session,
so a terminal's Ctrl-C reaches only torchrun) and waiting up to 30 s before
SIGKILL. Here each worker handles it: the first local rank prints

    error: interrupted (SIGINT) at step 3; stopping (last checkpoint: step-2 in DIR)

(stop_line.py) and every worker exits 130 (128 + SIGINT) through
``os._exit``, no KeyboardInterrupt unwinding through torchtitan's loop. A
checkpoint being written at that moment is left incomplete and is not
counted (its ``.metadata`` comes last). torchrun itself then raises
``SignalException`` out of its ``main``, a traceback of torchrun's own
frames that no worker can suppress; ``python -m skrull_ext.launch`` ends it
with status 130 and no traceback. A worker whose collective fails first (its
peer already exited) runs the pending handler as soon as Python code runs
again, before any traceback is printed.
"""

from __future__ import annotations

import signal
import threading

from skrull_ext.train import stop_line

__all__ = ["EXIT_STATUS", "install"]

EXIT_STATUS = 128 + signal.SIGINT


def _on_sigint(signum, frame) -> None:
    stop_line.end(stop_line.stop_message("interrupted (SIGINT)"), EXIT_STATUS)


def install() -> bool:
    """Handle SIGINT as above (main thread only; idempotent). Whether it is installed."""
    if threading.current_thread() is not threading.main_thread():
        return False
    signal.signal(signal.SIGINT, _on_sigint)
    return True
