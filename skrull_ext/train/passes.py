"""A Skrull step's forward and backward passes: this rank's chunked samples, then its micro-batches.

Kept apart from trainer.py (which owns the step around them: checks, clipping,
the optimizer, logging) because the order of the passes and where the
gradients are reduced is one decision: a chunked sample's backward runs one
FSDP post-backward per chunk, so the chunked samples run first and the last
micro-batch reduces (free-running at DP > 1 must reduce-scatter the same
number of times on every rank). Lockstep DP ranks run the same number of chunk
passes at each position (scheduler/chunk_lockstep.py pads them).
"""

import torch
from torch.profiler import record_function

from skrull_ext import _core
from skrull_ext.attention.local_only import attention_input
from skrull_ext.data.steps.loader import SkrullStep
from skrull_ext.scheduler.chunk_lockstep import lockstep_documents
from skrull_ext.train.chunked import chunked_loss

__all__ = ["chunked_samples", "step_passes"]


def step_passes(trainer, step: SkrullStep, global_valid_tokens: torch.Tensor) -> torch.Tensor:
    """Forward and backward over this rank's chunked samples (phase ``chunk``), then its micro-batches
    (``mb``), each CP rank feeding its own buffer (DACP attention over the CP group), the gradient
    accumulated. Returns this rank's loss sum / global loss tokens. Under ``skrull.free_running`` FSDP
    parameters stay unsharded throughout; under ``skrull.defer_grad_sync`` gradients are reduced once,
    by the last micro-batch's backward."""
    for m in trainer.dacp_attention:
        m.stats.reset()
    accumulated = torch.zeros((), device=trainer.device)
    free = trainer.free_running
    phases = trainer.step_phases
    if free is not None:  # this rank's own micro-batches (>= 1), parameters unsharded throughout
        with phases.phase("mb"):
            free.begin()
    # Chunked samples run before the micro-batches, whose last then reduces the gradients: a
    # chunked sample's backward runs one FSDP post-backward per chunk, so were it last it would
    # reduce-scatter once per chunk where a DP rank without one reduces once (free-running at DP > 1).
    if step.chunked or _padded_lockstep(step):  # lockstep: pad passes where this rank has none
        with phases.phase("chunk"):
            accumulated += trainer._chunked_samples(step, global_valid_tokens)  # a hook: profile/train_check.py
    last = len(step.micro_batches) - 1
    with phases.phase("mb"):
        for j, mb in enumerate(step.micro_batches):
            if free is not None:
                if j == last:
                    free.last()  # its backward reduce-scatters the gradients and reshards
            elif trainer.config.skrull.defer_grad_sync:
                trainer._set_grad_sync(j == last)
            with record_function(f"skrull/micro_batch_{j}"):
                # Asynchronous from a CUDA run's pinned buffers (MicroBatchBuffer.staged).
                masks = attention_input(mb.meta, trainer.local_only_kernel, trainer.device, trainer.dacp_stats,
                                        trainer.full_ac, mb.cu_seqlens)
                extra = {"positions": mb.positions.to(trainer.device, non_blocking=True), "attention_masks": masks}
                labels = mb.labels.to(trainer.device, non_blocking=True)
                trainer.ntokens_seen += labels.numel()
                loss = trainer.fwd_bwd_fn(mb.input.to(trainer.device, non_blocking=True), labels, global_valid_tokens,
                                       extra)
                accumulated += loss.detach()
    if free is not None:
        with phases.phase("mb"):
            free.end()  # every unit resharded before the optimizer: no stale copy in the next step
    return accumulated

def chunked_samples(trainer, step: SkrullStep, global_valid_tokens: torch.Tensor) -> torch.Tensor:
    """Forward and backward of this rank's samples longer than the limit, each whole in chunks of
    ``skrull_job.chunk_for(length)`` (the chunk the scheduler priced it with: the largest that fits
    a rank's memory model, scheduler/chunk_cost.py fitting_chunk) sharded over the CP group
    (``overlength = "chunk"``, train/chunked.py); returns their loss sum / global loss tokens. They run before the micro-batches, gradients kept
    unreduced (free-running, or ``skrull.defer_grad_sync``); only a step with no micro-batch
    (a lockstep plan of chunked samples alone) reduces in the last one's backward.

    Lockstep at DP > 1: every DP rank runs as many chunk passes at each position as the rank with
    the most, its own documents extended with pad chunks and all-pad documents where it has none
    (scheduler/chunk_lockstep.py, from the plan every rank holds), so FSDP's collectives pair up."""
    total = torch.zeros((), device=trainer.device)

    def loss_fn(pred: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        # inside a chunk's checkpoint: the head's chunks recompute (train/head_loss.py, in_checkpoint)
        return trainer.loss_fn(pred, labels, global_valid_tokens, in_checkpoint=True)[0]

    runs = _runs(trainer, step)
    for k, (sample, pad_chunks) in enumerate(runs):
        last = k == len(runs) - 1 and not step.micro_batches
        if trainer.free_running is not None:
            if last:
                trainer.free_running.last()
        elif trainer.config.skrull.defer_grad_sync:
            trainer._set_grad_sync(last)
        with record_function(f"skrull/chunked_{k}"), trainer.train_context():  # a blocking copy waits for the stream
            if sample is None:  # an all-pad document: this rank's passes at a position it holds none of
                tokens = labels = torch.zeros(0, dtype=torch.long, device=trainer.device)
                chunk = trainer.parallel_dims.cp * trainer.parallel_dims.tp
            else:
                tokens, labels = (t.to(trainer.device, non_blocking=True) for t in (sample.input, sample.labels))
                chunk = trainer.skrull_job.chunk_for(sample.length)
            out = chunked_loss(trainer.model_parts[0], tokens, labels, chunk, loss_fn, layers=trainer.dacp_attention,
                               group=trainer.cp_group, pad_chunks=pad_chunks, traced=trainer.chunk_path.traced,
                               tp=trainer.parallel_dims.tp)
            out.loss.backward()
        if sample is not None:
            trainer.ntokens_seen += sample.length
        total += out.loss.detach()
    return total


def _runs(trainer, step: SkrullStep) -> list[tuple]:
    """(sample or None, pad chunks) per position this rank runs: its own samples as they are, or
    under lockstep at DP > 1 padded to the plan's per-position pass counts (scheduler/chunk_lockstep.py)."""
    plan = step.plan
    if not _padded_lockstep(step):
        return [(sample, 0) for sample in step.chunked]
    padded = lockstep_documents(plan.chunked, plan.chunked_group, plan.dp, step.dp_rank,
                                trainer.skrull_job.chunk_for)
    own = iter(step.chunked)  # this rank's documents, in the plan's order (loader.py: plan.chunked_of)
    out = [(None if d.document is None else next(own), d.pad_chunks) for d in padded]
    assert next(own, None) is None, "every chunked sample of this rank has a position"
    return out


def _padded_lockstep(step: SkrullStep) -> bool:
    """Whether this rank pads its chunk passes to the other DP ranks' (scheduler/chunk_lockstep.py):
    lockstep DP ranks (the plan's timeline: not free-running, nor replicate-only DP under
    ``defer_grad_sync``, config.job_timeline) with chunked documents somewhere in the step's plan."""
    plan = step.plan
    return plan.timeline == _core.Timeline.LOCKSTEP and plan.dp > 1 and bool(plan.chunked)
