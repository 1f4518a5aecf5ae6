# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""Dynamo's recompile limit for a compiled Skrull job.

torchtitan compiles each TransformerBlock with ``fullgraph=True``, under which
dynamo's recompile limit (8 graphs per code object by default) is a hard
failure, not a fallback to eager: the run stops at the 9th graph (torchtitan
raises the limit for GPT-OSS for the same reason). A Skrull micro-batch is
of variable length and its blocks see two attention inputs, so one block's
code object can hold, per attention input (the DACP meta, or an all-local
micro-batch's LocalOnlyBatch: attention/local_only.py) and per grad mode
(training, validation's no-grad forward): the dynamic graph (a compiled
job's blocks see their token dimension dynamic from the first micro-batch:
train/dynamic_tokens.py; before that, a static first graph came too); one
more where an int of the input (varlen's longest sequence) first changes;
and one per size class inductor's heuristics guard on (an H200 run
recompiled when a micro-batch fell below 5,852 tokens: docs/results/gpu.md,
run 4). That was 12 or more before the token marks,
each compiled once per run, and under ``overlength = "chunk"`` (traced in
a compiled job: train/chunk_path.py) up to six more in training and two in validation (a traced chunk's: the first
chunk's and the rest's, their recomputation's under FSDP, a lockstep pad
chunk's single token: train/chunked.py; 6 measured at DP 2 lockstep): 20.
The recomputation's pair is gone since the blocks' pre-hook hands it a view
as FSDP's forward does (train/dynamic_tokens.py ``settle``; 2 graphs, not 4,
in the CP 1 chunk run); the count above is kept as the bound.

The size classes are what recompiles a run after its warm-up: a new class
is met whenever the data first brings one, at any step (a 6.7 s step 28 of
34 on an H200). The only ones seen (runs 4-6, docs/results/gpu.md) are
inductor's mix-order reduction (``_inductor/scheduler.py``
``MixOrderReduction.can_fuse``: the RMSNorm backward's two reductions fused
only when ``rows * cols >= 5 * 2**20``, ``rows >= 2 * cols`` and
``rows >= 4096``), whose conditions on a dynamic token count become guards.
A compiled Skrull job turns that fusion off (``length_free_fusion``): the
same kernels at every length, one dynamic graph, no guard on the token
count. torchtitan's batchings train one row shape and keep it.
"""

import torch

from skrull_ext.train.dynamic_tokens import mark_blocks

__all__ = ["SKRULL_RECOMPILE_LIMIT", "compile_settings", "length_free_fusion", "raise_recompile_limit"]

SKRULL_RECOMPILE_LIMIT = 24
"""Twice the 12 graph classes counted above: room for a size class or two more, also beside a
CP 1 job's traced chunks (20)."""


def raise_recompile_limit(compiled: bool) -> str | None:
    """Raise dynamo's recompile limit to SKRULL_RECOMPILE_LIMIT for a compiled job
    (never lower it); returns the line to log, None when nothing changed."""
    config = torch._dynamo.config
    if not compiled or config.recompile_limit >= SKRULL_RECOMPILE_LIMIT:
        return None
    before, config.recompile_limit = config.recompile_limit, SKRULL_RECOMPILE_LIMIT
    return (f"Skrull: torch._dynamo.config.recompile_limit {before} -> {SKRULL_RECOMPILE_LIMIT}: variable-length "
            "micro-batches and two attention inputs give a compiled block more graphs than the default, and "
            "fullgraph=True fails the run past the limit (skrull_ext/train/compile_limit.py)")


def length_free_fusion(compiled: bool) -> str | None:
    """Turn off inductor's mix-order reduction for a compiled job (module
    docstring), where this torch has it; returns the line to log, None when
    nothing changed."""
    triton = torch._inductor.config.triton
    if not compiled or not getattr(triton, "mix_order_reduction", False):
        return None
    triton.mix_order_reduction = False
    return ("Skrull: torch._inductor.config.triton.mix_order_reduction off: its size conditions on the token "
            "count recompile the blocks whenever a micro-batch first crosses them (skrull_ext/train/compile_limit.py)")


def compile_settings(compiled: bool, model_parts) -> list[str]:
    """What a compiled Skrull job sets at start-up: the recompile limit, length-free fusions and
    each block's token dimension dynamic from the first micro-batch (train/dynamic_tokens.py);
    returns the lines to log (none for an uncompiled job, which changes nothing)."""
    if compiled:
        mark_blocks(model_parts)
    return [line for line in (raise_recompile_limit(compiled), length_free_fusion(compiled)) if line is not None]
