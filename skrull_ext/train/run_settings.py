"""What a Skrull run settled at start-up, logged beside every logged step's figures.

Three choices are made once, at start-up, each said in a log line: the
activation-checkpointing mode (train/checkpointing.py: "Skrull activation
checkpointing: ..."), the BucketSize (train/settle.py, the "Skrull: global
batch ..." line) and the chunk the head and loss run in (train/head_loss.py,
"head and loss in chunks of ..."). A reader of the run's TensorBoard
(``python -m skrull_ext.bench train-report``) needs them beside the step's
figures without parsing a log, so they are scalars too, the same at every
logged step:

- ``skrull/activation_checkpoint``: the mode's index in ``MODES``
  (scheduler/checkpointing.py: 0 none, 1 selective, 2 full); NaN for a kind
  no profile measures (torchtitan's memory budget);
- ``skrull/bucket_size``: the BucketSize the plans were made at;
- ``skrull/head_chunk_tokens``: tokens a chunk of the head and loss; 0 where
  the head runs unchunked in the model's forward (one chunk holds every
  micro-batch, or a loss that does not chunk);
- ``skrull/head_in_forward``: 1 where the chunks compute their gradients in
  forward (``[loss] head_backward``, train/head_grad.py: the "head backward:
  ..." line), 0 where they recompute or the head runs unchunked.
"""

from __future__ import annotations

import math
from typing import Any

from skrull_ext.scheduler.checkpointing import MODES

__all__ = ["AC_TAG", "BUCKET_TAG", "CHUNK_TAG", "IN_FORWARD_TAG", "head_chunk_tokens", "mode_named",
           "run_settings"]

AC_TAG = "skrull/activation_checkpoint"
BUCKET_TAG = "skrull/bucket_size"
CHUNK_TAG = "skrull/head_chunk_tokens"
IN_FORWARD_TAG = "skrull/head_in_forward"


def head_chunk_tokens(loss_fn: Any) -> int:
    """The head's chunk as run (0: unchunked, in the model's forward)."""
    chunk = getattr(loss_fn, "chunk_tokens", 0)
    return 0 if getattr(loss_fn, "head_in_model", False) or not chunk else int(chunk)


def run_settings(mode: str | None, bucket_size: int, loss_fn: Any) -> dict[str, float]:
    """The scalars of the module docstring for a run of checkpointing ``mode`` (``mode_of``'s),
    ``bucket_size`` and ``loss_fn`` (a ChunkedHeadLoss, or any loss: unchunked)."""
    return {AC_TAG: float(MODES.index(mode)) if mode in MODES else math.nan,
            BUCKET_TAG: float(bucket_size),
            CHUNK_TAG: float(head_chunk_tokens(loss_fn)),
            IN_FORWARD_TAG: float(bool(head_chunk_tokens(loss_fn)) and
                                  getattr(loss_fn, "head_backward", None) == "in_forward")}


def mode_named(value: float) -> str | None:
    """``skrull/activation_checkpoint``'s value back as the mode's name (None: NaN or unknown)."""
    if not math.isfinite(value) or value != int(value) or not 0 <= value < len(MODES):
        return None
    return MODES[int(value)]
