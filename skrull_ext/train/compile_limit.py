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
(training, validation's no-grad forward): the first graph, static; the
dynamic one after the length first changes; and one per size class
inductor's heuristics guard on (an H200 run recompiled when a micro-batch
fell below 5,852 tokens: docs/results/gpu.md, run 4). That is 12 or more,
each compiled once per run.
"""

import torch

__all__ = ["SKRULL_RECOMPILE_LIMIT", "raise_recompile_limit"]

SKRULL_RECOMPILE_LIMIT = 24
"""Twice the graph classes counted above: room for a size class or two more."""


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
