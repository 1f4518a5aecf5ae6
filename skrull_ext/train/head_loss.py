"""The model's head and the loss in chunks of tokens (``[loss]``, docs/training.md).

Over a 152K vocabulary the logits of one token are 0.3 MB in bf16, and the
loss keeps them again in float32 for backward: a micro-batch of 130K tokens
would hold about 40 GB of logits, all taken from its BucketSize. Here the
model stops at its final norm (torchtitan's ``Decoder._skip_lm_head``, which
its Trainer sets for any ``ChunkedLossWrapper``) and the loss applies the
head and the cross-entropy to ``chunk_tokens`` tokens at a time, each chunk
under non-reentrant activation checkpointing: what is kept for backward is
the hidden states (``[tokens, dim]``, a view per chunk) and the labels; each
chunk's logits exist only while its forward, or its backward's recompute,
runs. The loss and every gradient are those of the unchunked head up to
float rounding (the sum of the chunks' sums; tests/unit_tests/test_head_loss.py:
fp32, loss 1e-6, gradients 1e-5 relative). The price is the head's forward
run twice (once more in backward), which the profiler's head timing
(profile/head.py) measures with the loss as the job runs it.

Why not torchtitan 0.3.0's own ``ChunkedLossWrapper`` (this class is one, so
torchtitan's Trainer wires it the same way): that wrapper runs each chunk's
backward inside the loss's forward and hands the decoder the accumulated
gradient, which does not compose with this project's paths:

- it needs the local sequence length divisible by ``num_chunks``; a Skrull
  micro-batch is a packed buffer of any length;
- ``overlength = "chunk"`` (train/chunked.py) calls the loss inside a
  checkpointed chunk of the document, whose recompute would run those
  backwards again and add the head's gradient twice;
- it toggles the head's FSDP resharding and gradient sync around its loop,
  overriding ``skrull.defer_grad_sync`` and ``skrull.free_running``;
- its gradient ignores the upstream ``grad_output`` (a loss scaled after it
  would leave the head's gradient unscaled).

Nor a fused linear cross-entropy library: liger-kernel (0.8.5, 2026-10) and
Apple's cut-cross-entropy (25.1.1, last released 2025-01) are Triton kernels,
with no CPU path for the tests here; liger's is the one to measure against
this on a GPU (it computes the gradients in forward, with no recompute).

Checkpointing composes with all of these: the backward runs in autograd's
own order and graph task, chunk by chunk, like an activation-checkpointed
block (nested inside train/chunked.py's checkpoint too).

How the chunks get their gradients is ``[loss] head_backward``. "recompute" is
the checkpointing above: four matmuls a chunk (forward, its recompute, the
hidden states' and the weight's gradients), the loss's elementwise work twice.
"in_forward" (train/head_grad.py) computes each chunk's loss and gradients in
the loss's forward, one ``autograd.Function`` over the chunks whose backward
hands autograd the kept gradients times ``grad_output``: three matmuls a chunk,
one elementwise pass, and a vocab x dim float32 weight gradient held from
forward to backward (the memory model's ``[memory] head_grad_bytes``). It is
what torchtitan's wrapper does, without the four misfits above: any length,
the upstream ``grad_output`` honoured, FSDP's hooks left to autograd's order
(the head module still passes the hidden states through in the model's
forward), and inside train/chunked.py's checkpoint the trainer's call says
``in_checkpoint=True`` and the chunks recompute there (in forward they would
be right, the recompute's gradients replacing the saved ones, but six matmuls
a chunk against five). "auto", the default, runs in_forward where it
composes (``in_forward_blocked``): a plain Linear head (a LoRA head's adapters
get their gradients through autograd, in the checkpointed chunks), no TP (the
head's weight a Shard(0) DTensor for loss_parallel), and torchtitan's
``CrossEntropyLoss`` as the chunk's loss (the gradient head_grad.py computes);
one start-up line says which and why, and a forced "in_forward" where it does
not compose is refused. Both equal the unchunked head up to float rounding
(tests/unit_tests/test_head_loss.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint
from torch.distributed.tensor import DTensor
from torchtitan.components.loss import BaseLoss, ChunkedLossWrapper, CrossEntropyLoss
from torchtitan.config import CompileConfig

from skrull_ext.errors import JobFileError
from skrull_ext.lora.converter import LORA_FORWARDS, lora_linear
from skrull_ext.train.dynamic_tokens import mark_dynamic
from skrull_ext.train.head_grad import ChunkStep, head_loss_in_forward, linear_cross_entropy_grad
from skrull_ext.train.job.loss_config import HeadLossConfig

__all__ = ["ChunkedHeadLoss", "HeadBackward", "HeadChunking", "assumed_head_bytes_per_token",
           "choose_chunk_tokens", "head_grad_bytes", "in_forward_blocked", "resolve_chunking",
           "resolve_head_backward"]


def _linear(head: torch.nn.Module, h: torch.Tensor) -> torch.Tensor:
    """A plain Linear head's output (``nn.Linear.forward``)."""
    return torch.nn.functional.linear(h, head.weight, head.bias)


HEAD_FORWARDS: dict[Callable, Callable[[torch.nn.Module, torch.Tensor], torch.Tensor]] = {
    torch.nn.Linear.forward: _linear,
    **dict.fromkeys(LORA_FORWARDS, lora_linear),
}
"""A head module's class forward -> the same computation as a function of the module and the
hidden states, which the loss applies per chunk while the module itself passes the hidden
states through in the model's forward (``ChunkedHeadLoss.pass_head_through``): a plain Linear,
and a LoRA linear on the head (base weight + adapters, their dropout, skrull_ext/lora). A head
whose forward is not here is called from the loss, and DP ranks keep lockstep with it."""

@dataclass(frozen=True)
class HeadChunking:
    """The chunk the head and loss run in, and why (the start-up line)."""

    chunk_tokens: int
    """Tokens a chunk (a micro-batch of more tokens runs in ceil(tokens / chunk_tokens) chunks)."""
    head_bytes_per_token: float
    """Peak bytes of the head and loss per token of a chunk (logits, their float32 copy and gradients)."""
    why: str

    def line(self, micro_batch_tokens: int | None = None, bound: str = "the job's BucketSize") -> str:
        """The start-up line: the chunk is a bound ("up to"), what the largest micro-batch
        (``micro_batch_tokens``, set by ``bound``) runs in next to it, and why that chunk. A
        chunk of 89229 tokens printed for 256-token micro-batches read as chunks of 89229."""
        count = ""
        if micro_batch_tokens:
            n = math.ceil(micro_batch_tokens / self.chunk_tokens)
            count = (f", {n} chunk{'' if n == 1 else 's'} for the largest micro-batch ({micro_batch_tokens} "
                     f"tokens: {bound})")
        return (f"head and loss in chunks of up to {self.chunk_tokens} tokens{count} "
                f"({self.head_bytes_per_token / 2**20:.3f} MiB a token at the peak; {self.why})")


def assumed_head_bytes_per_token(vocab: int, elem_bytes: int, head_backward: str = "recompute") -> float:
    """The head and loss's peak per token where no profile measured it. Recompute: the logits in
    the compute dtype and in float32, the log-softmax kept for backward and its gradient in
    float32, the logits' gradient in the compute dtype: vocab x (2 x elem + 12) bytes, an upper
    bound (the debug model's head in float32 on CPU measured 11.75 x vocab: docs/profile.md).
    In forward (train/head_grad.py): the logits and the float32 log-softmax, which then becomes
    their gradient in place: vocab x (elem + 4) bytes."""
    if head_backward == "in_forward":
        return float(vocab * (elem_bytes + 4))
    return float(vocab * (2 * elem_bytes + 12))


def head_grad_bytes(head: torch.nn.Module) -> float:
    """Bytes the in-forward head holds from forward to backward outside its per-token terms: its
    weight's gradient (and its bias's) accumulated in float32 (train/head_grad.py)."""
    return float(sum(p.numel() * 4 for p in (head.weight, head.bias) if p is not None and p.requires_grad))


def resolve_chunking(config: ChunkedHeadLoss.Config, vocab: int, elem_bytes: int, profile=None,
                     measured: float = 0.0, head_backward: str = "recompute") -> HeadChunking:
    """The job's chunk: ``chunk_tokens`` when set, else the most tokens whose peak fits
    ``chunk_bytes``, the bytes a token ``measured`` (the profiler), or from ``profile``'s
    ``[memory] logits_bytes_per_token`` (a measured profile, or None), else assumed from the
    vocabulary (``why`` says which, and the command that measures it). ``head_backward``: the
    mode the chunks run in ("recompute" or "in_forward"), whose peak a token differs; a profile
    measured with the other mode is said (its per-token bytes and BucketSize are that mode's)."""
    source = "measured"
    memory = profile.data.get("memory", {}) if profile is not None else {}
    if not measured and profile is not None:
        measured = float(memory.get("logits_bytes_per_token", 0.0))
        source = f"measured by the profile {profile.path}"
    if measured > 0:
        per_token = measured
    else:
        per_token = assumed_head_bytes_per_token(vocab, elem_bytes, head_backward)
        source = (f"assumed: vocabulary {vocab} x ({elem_bytes} + 4) B" if head_backward == "in_forward"
                  else f"assumed: vocabulary {vocab} x (2 x {elem_bytes} + 12) B")
        if profile is not None:
            command = profile.meta.get("command", "python -m skrull_ext.profile --config-file JOB")
            source += (f", the profile {profile.path} has no [memory] logits_bytes_per_token "
                       f"(its BucketSize counts the logits of every token; `{command}` measures it)")
    if config.chunk_tokens:
        chunk, why = config.chunk_tokens, f"forced by loss.chunk_tokens; {source}"
    else:
        chunk = choose_chunk_tokens(per_token, config.chunk_bytes)
        why = f"the most whose peak fits loss.chunk_bytes {config.chunk_bytes / 2**20:.0f} MiB; {source}"
    profiled = int(profile.data.get("memory", {}).get("head_chunk_tokens", 0)) if profile is not None else 0
    if profiled and profiled != chunk:
        why += (f"; the profile's BucketSize holds chunks of {profiled} tokens (profile the job with this "
                f"chunk for one that holds these)")
    if profile is not None and float(memory.get("logits_bytes_per_token", 0.0)) > 0:
        profiled_mode = "in_forward" if float(memory.get("head_grad_bytes", 0.0)) > 0 else "recompute"
        if profiled_mode != head_backward:
            why += (f"; the profile measured the head's chunks with head_backward {profiled_mode}, the job runs "
                    f"{head_backward} (its BucketSize counts the other's bytes: profile the job for this mode's)")
    return HeadChunking(chunk, per_token, why)


@dataclass(frozen=True)
class HeadBackward:
    """How the head's chunks get their gradients (``[loss] head_backward``), and why (one start-up line)."""

    mode: str
    """"in_forward" (train/head_grad.py) or "recompute" (each chunk checkpointed)."""
    why: str

    def line(self) -> str:
        return f"head backward: {self.mode} ({self.why})"


def in_forward_blocked(head: torch.nn.Module | None, loss_fn: BaseLoss, tp: bool) -> str | None:
    """Why the head's gradients cannot be computed in forward here (None: they can)."""
    forward = getattr(type(head), "forward", None)
    blocks = (
        (tp, "TP shards the head's weight (a Shard(0) DTensor) for loss_parallel's vocabulary-sharded logits"),
        (HEAD_FORWARDS.get(forward) is not _linear,
         f"the head is a {type(head).__name__}, not a plain Linear: its own forward's gradients (a LoRA head's "
         "adapters) come from autograd, in the checkpointed chunks"),
        (type(loss_fn) is not CrossEntropyLoss,
         f"loss.loss_fn is {type(loss_fn).__name__}, not torchtitan's CrossEntropyLoss, whose gradient "
         "train/head_grad.py computes"),
    )
    return next((why for blocked, why in blocks if blocked), None)


def resolve_head_backward(config: ChunkedHeadLoss.Config, head: torch.nn.Module | None, loss_fn: BaseLoss,
                          tp: bool, overlength_chunk: bool = False) -> HeadBackward:
    """The mode ``[loss] head_backward`` asks for, where it composes; a forced "in_forward" that
    cannot is refused in one message naming the key, the value and why."""
    blocked = in_forward_blocked(head, loss_fn, tp)
    key = config.head_backward
    if key == "recompute":
        return HeadBackward("recompute", "forced by loss.head_backward")
    if blocked is not None:
        if key == "in_forward":
            raise JobFileError(f'loss.head_backward = "in_forward" cannot run here: {blocked}; '
                               'use "auto" or "recompute"')
        return HeadBackward("recompute", f"loss.head_backward auto: {blocked}")
    why = ("forced by loss.head_backward" if key == "in_forward" else
           "loss.head_backward auto: a plain Linear head, no TP, torchtitan's cross-entropy")
    why += "; three matmuls a chunk, not four, and a float32 weight gradient held until backward"
    if overlength_chunk:
        why += ('; documents trained whole in chunks (skrull.overlength = "chunk") run the recompute path '
                "inside their checkpoint, whose recompute would compute the gradients again")
    return HeadBackward("in_forward", why)


def choose_chunk_tokens(head_bytes_per_token: float, chunk_bytes: int) -> int:
    """The most tokens whose head and loss peak fits ``chunk_bytes`` (at least one)."""
    if head_bytes_per_token <= 0 or not math.isfinite(head_bytes_per_token):
        raise ValueError(f"head bytes per token must be finite and > 0, got {head_bytes_per_token}")
    return max(1, int(chunk_bytes // head_bytes_per_token))


class ChunkedHeadLoss(ChunkedLossWrapper):
    """The head and the job's loss over chunks of tokens (module docstring)."""

    Config = HeadLossConfig
    """``[loss]`` (train/job/loss_config.py); holding it here wires its ``build()`` to this class
    (torchtitan's Configurable), as torchtitan's Trainer builds ``config.loss``."""

    def __init__(self, config: Config, *, compile_config: CompileConfig | None = None):
        self.config = config
        self.loss_fn: BaseLoss = config.loss_fn.build(compile_config=compile_config)
        self.lm_head: torch.nn.Module | None = None
        self.head_backward = "recompute"
        """How the chunks get their gradients (set at start-up, ``set_head_backward``): "recompute" (each
        chunk checkpointed) or "in_forward" (train/head_grad.py)."""
        self.chunk_step: ChunkStep = linear_cross_entropy_grad
        """The in-forward chunk's loss and logits' gradient; compiled where the job compiles its loss."""
        if compile_config is not None and compile_config.enable and "loss" in compile_config.components:
            self.chunk_step = torch.compile(linear_cross_entropy_grad, backend=compile_config.backend)
        self.num_chunks = 0  # ChunkedLossWrapper's field; chunks here are counted in tokens
        self.chunking: HeadChunking | None = None
        """Set at start-up (``set_chunking``); until then ``config.chunk_tokens`` or one chunk."""
        self.head_apply: Callable[[torch.nn.Module, torch.Tensor], torch.Tensor] | None = None
        """The head's computation applied per chunk here, where the model calls its head module and
        that passes the hidden states through (``pass_head_through``; None: the head is called)."""
        self.head_in_model = False
        """The model applies its own head (``pred`` is the logits): set at start-up where one chunk
        holds every micro-batch (``put_head_back``), so nothing is chunked and the head runs where
        FSDP expects it, inside the root module's forward."""

    def set_chunking(self, chunking: HeadChunking) -> None:
        self.chunking = chunking

    def set_head_backward(self, mode: str) -> None:
        if mode not in ("in_forward", "recompute"):
            raise ValueError(f"head backward mode must be 'in_forward' or 'recompute', got {mode!r}")
        self.head_backward = mode

    @property
    def head_passes_through(self) -> bool:
        return self.head_apply is not None

    @property
    def free_running_blocked(self) -> str | None:
        """Why DP ranks cannot run free with this head (None: they can): the head in chunks is
        called outside the root module's forward, several times a micro-batch, and the FSDP unit
        torchtitan groups it in (with the final norm) then runs its forward hooks out of step, so
        free-running DP ranks with different micro-batch counts reduce-scatter mismatched buffers
        (gloo: "Received data size doesn't match expected size"). Lockstep runs it."""
        if self.head_in_model or self.head_passes_through:
            return None
        head = type(self.lm_head).__name__ if self.lm_head is not None else "the head"
        return (f"the head ({head}) runs in chunks of {self.chunk_tokens} tokens (loss.chunk_tokens / "
                "loss.chunk_bytes) called from the loss, its forward not one the model can pass "
                "through (train/head_loss.py HEAD_FORWARDS)")

    def put_head_back(self, model_parts) -> None:
        """The head back inside the model's forward (``_skip_lm_head`` off), for a job whose every
        micro-batch fits one chunk: the same computation and bytes, since one chunk is never
        checkpointed. Called outside the root module's forward, the head's FSDP unit (grouped with
        the final norm) ran its post-forward after the root's, and free-running DP ranks with
        different micro-batch counts then reduce-scattered mismatched buffers (gloo: "Received
        data size doesn't match expected size", the text job with a mixture at DP 2)."""
        _call_head_in_forward(model_parts)
        self.head_in_model = True

    @property
    def chunk_tokens(self) -> int:
        """Tokens a chunk now (0: one chunk, the whole micro-batch)."""
        if self.chunking is not None:
            return self.chunking.chunk_tokens
        return self.config.chunk_tokens

    def _head_loss(self, h: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        assert self.lm_head is not None, "ChunkedHeadLoss: set_lm_head before the first call"
        if self.head_apply is not None:  # the module ran in the model's forward; its computation here
            logits = self.head_apply(self.lm_head, h)
        else:
            logits = self.lm_head(h)
        mark_dynamic((logits, 1), (labels, 1))  # a compiled loss: one graph for every chunk size
        return self.loss_fn(logits, labels)[0]  # a sum over the chunk's tokens

    @property
    def _head_draws(self) -> bool:
        """Whether a chunk's head may draw random numbers (a LoRA head's dropout, or a head this
        module does not know): its recompute in backward then replays the forward's RNG state, so
        it draws the same mask (a plain Linear draws none, and saves no state)."""
        return HEAD_FORWARDS.get(getattr(type(self.lm_head), "forward", None)) is not _linear

    def pass_head_through(self, model_parts) -> bool:
        """The head module called in the model's forward, passing the hidden states through, and
        its computation (``HEAD_FORWARDS``: a plain Linear's weight, or a LoRA head's base weight
        and adapters) applied per chunk here (False, nothing changed: a head whose forward is not
        there). Its FSDP unit (grouped with the final norm) then runs its hooks inside the root
        module's forward, once a micro-batch, as without chunks: its parameters (the adapters
        too) are unsharded there and stay so until backward reaches the unit (torchtitan keeps
        the last unit after forward; free-running keeps every one), and their gradients, from
        each chunk, are in before the unit's post-backward reduces them, so free-running DP ranks
        may run different micro-batch counts again (``free_running_blocked``).

        Under TP too: torchtitan's head is the same Linear, its instance forward a wrapper that
        redistributes its input to Replicate and its output to Shard(-1) (the sharding config,
        decoder_sharding.py). The final norm already hands it Replicate hidden states and the
        linear of those and the Shard(0) weight is Shard(-1), so both redistributions are no-ops:
        the per-chunk linear on the DTensors gives the logits the wrapper gave, vocabulary-sharded
        for loss_parallel (the debug job at TP 2, 4 steps: the losses of the head called from the
        loss, to the bit). A LoRA head's adapters compose the same way: torchtitan shards its B as
        the head (Shard(0)) and keeps A Replicate, so A(h) is Replicate and B of it Shard(-1), added
        to the base logits (tests/integration_tests/test_lora_parity.py, TP 2 x CP 2 in chunks of
        48 tokens: the 1-process reference's losses and gradients, the merged head gathered whole)."""
        head = self.lm_head
        apply = HEAD_FORWARDS.get(getattr(type(head), "forward", None))
        if apply is None:
            return False
        head.forward = _pass_through
        _call_head_in_forward(model_parts)
        self.head_apply = apply
        return True

    def __call__(
        self,
        pred: torch.Tensor,
        labels: torch.Tensor,
        global_valid_tokens: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``pred``: the model's hidden states [batch, seq, dim] (the head skipped); returns the
        loss as the job's loss over the full logits would (sum / ``global_valid_tokens``).
        ``in_checkpoint=True``: the call runs inside a checkpointed region (train/chunked.py's chunks
        of a long document), whose recompute would compute in-forward gradients again: the
        chunks run the recompute path there."""
        in_checkpoint = kwargs.pop("in_checkpoint", False)
        del kwargs  # positions: not read by cross-entropy
        if self.head_in_model:  # pred: the logits
            mark_dynamic((pred, 1), (labels, 1))  # a compiled loss: one graph for every length
            total = self.loss_fn(pred, labels)[0]
            return (total / global_valid_tokens if global_valid_tokens is not None else total), {}
        if self.head_backward == "in_forward" and torch.is_grad_enabled() and not in_checkpoint:
            return self._in_forward(pred, labels, global_valid_tokens), {}
        seq = pred.shape[1]
        per_row = max(1, self.chunk_tokens // max(1, pred.shape[0])) if self.chunk_tokens else seq
        grad = torch.is_grad_enabled()
        total: torch.Tensor | None = None
        for a in range(0, seq, per_row):
            h, lab = pred[:, a:a + per_row], labels[:, a:a + per_row]
            if grad and per_row < seq:  # the chunk's logits recomputed in backward, not kept
                # A chunk of its own strides ([n x dim, dim, 1]; a copy only where rows are apart): with
                # the head's weight frozen (LoRA) matmul folds [b, n, dim] into one mm only when the
                # strides say so, and FSDP's forward hooks rewrap the chunk in forward but not in the
                # recompute, so a slice's strides ([seq x dim, dim, 1]) recomputed with another op.
                h = h.reshape(-1, h.shape[-1]).view(h.shape)
                part = checkpoint(self._head_loss, h, lab, use_reentrant=False, preserve_rng_state=self._head_draws)
            else:
                part = self._head_loss(h, lab)
            total = part if total is None else total + part
        assert total is not None, "ChunkedHeadLoss: an empty micro-batch"
        if global_valid_tokens is not None:
            total = total / global_valid_tokens
        return total, {}

    def _in_forward(self, pred: torch.Tensor, labels: torch.Tensor,
                    global_valid_tokens: torch.Tensor | None) -> torch.Tensor:
        """The chunks with their gradients computed in forward (train/head_grad.py)."""
        head = self.lm_head
        assert head is not None, "ChunkedHeadLoss: set_lm_head before the first call"
        if isinstance(head.weight, DTensor):
            raise RuntimeError("ChunkedHeadLoss: head_backward in_forward met a DTensor head weight (TP, or an "
                               "FSDP head not passed through the model's forward): run loss.head_backward "
                               '"recompute"')
        chunk = self.chunk_tokens or pred.shape[0] * pred.shape[1]
        return head_loss_in_forward(pred, head.weight, head.bias, labels, global_valid_tokens, chunk, self.chunk_step)


def _pass_through(h: torch.Tensor) -> torch.Tensor:
    """The head module's forward under ``pass_head_through``: the hidden states, unchanged."""
    return h


def _call_head_in_forward(model_parts) -> None:
    """Undo what torchtitan's Trainer set for a ChunkedLossWrapper: the model calls its head again."""
    for part in model_parts:
        if hasattr(part, "_skip_lm_head"):
            part._skip_lm_head = False
