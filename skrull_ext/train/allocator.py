# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""The CUDA caching allocator's settings for a training or profiling run.

Skrull's micro-batches change length every step, and the caching allocator
keeps a block of each size it has served: on an H200 the shipped GPU job
reserved 97 GiB for a need of 38 GB, and eager runs reserved 124-127 GiB of
139.8 with allocation retries on every step (docs/results/gpu.md). With
``expandable_segments:True`` segments grow in place and the same compiled
run reserved 38.2 GiB at the same speed. torchtitan's own launch script
(run_train.sh) sets it; so does every entry point here, unless the user
chose their own settings (``PYTORCH_CUDA_ALLOC_CONF`` or its newer name
``PYTORCH_ALLOC_CONF``). It must be set before the first CUDA allocation,
hence at the entry points, before any model is built. On CPU the variable is
set too (harmless) and nothing is logged.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

__all__ = ["ALLOC_CONF", "EXPANDABLE", "allocator_line", "use_expandable_segments"]

ALLOC_CONF = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
"""The variables torch reads its allocator settings from (the first is torchtitan's)."""

EXPANDABLE = "expandable_segments:True"


def use_expandable_segments(environ: MutableMapping[str, str] | None = None) -> str:
    """Set ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` in ``environ``
    (default the process's) unless either allocator variable is already set;
    returns the line to log, which says which one applies and who chose it."""
    env = os.environ if environ is None else environ
    for name in ALLOC_CONF:
        if env.get(name):
            return f"CUDA allocator: {name}={env[name]} (set by you; skrull_ext leaves it as it is)"
    env[ALLOC_CONF[0]] = EXPANDABLE
    return (f"CUDA allocator: {ALLOC_CONF[0]}={EXPANDABLE} (skrull_ext's default: variable-length micro-batches "
            f"otherwise leave a cached block of every size; set {ALLOC_CONF[0]} to choose otherwise)")


def allocator_line(line: str) -> str | None:
    """``line`` on a CUDA machine, None elsewhere (nothing to say on CPU)."""
    import torch

    return line if torch.cuda.is_available() else None
