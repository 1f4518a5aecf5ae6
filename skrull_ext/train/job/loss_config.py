"""``[loss]``: the chunk the head and the loss run in, and the loss of each chunk.

The section as the job file sets it (every job's default loss: job_file.base_config); the loss
that runs it is ``ChunkedHeadLoss`` (train/head_loss.py), which holds this class as its
``Config``, so its ``build()`` builds that loss once train/head_loss.py is imported (the
trainers import it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torchtitan.components.loss import BaseLoss, CrossEntropyLoss

__all__ = ["DEFAULT_CHUNK_BYTES", "HEAD_BACKWARDS", "HeadLossConfig"]

DEFAULT_CHUNK_BYTES = 2 << 30
"""``[loss] chunk_bytes``' default: what the head and loss of one chunk may hold at their peak
(2 GiB: about 880 tokens of a 152K vocabulary in bf16, assumed 16 B a token and vocabulary entry,
a [880, 896] x [896, 152K] product that keeps a GPU busy; 1.5% of an H200, which the profile's
BucketSize keeps free for one chunk, where a micro-batch of the H200 profile's BucketSize held about
40 GB of logits and as much again of their gradient: issue 57)."""


HEAD_BACKWARDS = ("auto", "in_forward", "recompute")
"""``[loss] head_backward``'s values (train/head_loss.py ``resolve_head_backward``)."""


@dataclass(kw_only=True, slots=True)
class HeadLossConfig(BaseLoss.Config):
    """``[loss]``: the head and the job's loss in chunks of tokens; ``ChunkedHeadLoss`` (train/head_loss.py)
    holds it as its ``Config`` and runs it."""

    _owner = None  # not BaseLoss's: build() before train/head_loss.py wires it fails, naming this class

    chunk_tokens: int = 0
    """Tokens a chunk of the head and loss; 0: the most whose peak fits ``chunk_bytes``,
    from the profile's ``[memory] logits_bytes_per_token`` (else from the model shape);
    a number at least the micro-batch's tokens runs the head unchunked."""

    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    """Peak bytes one chunk's head and loss may hold (read when ``chunk_tokens = 0``)."""

    head_backward: str = "auto"
    """How a chunk's backward gets its gradients: "recompute" (each chunk under activation
    checkpointing: its head's matmul again in backward), "in_forward" (each chunk's gradients
    computed in the loss's forward and kept, train/head_grad.py: three matmuls a chunk, not four,
    and a vocab x dim float32 weight-gradient buffer held until backward), or "auto" (in_forward
    where it composes: a plain Linear head, no TP, torchtitan's cross-entropy; one start-up line
    says which and why). A forced "in_forward" where it cannot compose is refused."""

    loss_fn: BaseLoss.Config = field(default_factory=CrossEntropyLoss.Config)
    """The loss of each chunk's logits (a sum over its tokens)."""

    def __post_init__(self) -> None:
        if isinstance(self.chunk_tokens, bool) or not isinstance(self.chunk_tokens, int) or self.chunk_tokens < 0:
            raise ValueError(f"loss.chunk_tokens: {self.chunk_tokens!r} must be an integer >= 0 "
                             "(0: from the memory model)")
        if isinstance(self.chunk_bytes, bool) or not isinstance(self.chunk_bytes, int) or self.chunk_bytes < 1:
            raise ValueError(f"loss.chunk_bytes: {self.chunk_bytes!r} must be a positive integer")
        if self.head_backward not in HEAD_BACKWARDS:
            raise ValueError(f"loss.head_backward: {self.head_backward!r} must be one of "
                             f"{', '.join(repr(m) for m in HEAD_BACKWARDS)}")
