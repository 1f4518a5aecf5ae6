# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""A module's name as the model defines it, without the wrappers torch adds.

torchtitan's parallelize step wraps decoder blocks after the model is built:
activation checkpointing (``full`` or ``selective``) in a CheckpointWrapper,
``torch.compile`` of a module (not in place) in an OptimizedModule, FSDP1 in
a FullyShardedDataParallel. Each puts one segment into the names
``named_modules()`` / ``named_parameters()`` give
(``layers.0._checkpoint_wrapped_module.attention.wo``), while state-dict
adapters, checkpoints and HF keys know only the plain name
(``layers.0.attention.wo``). Anything that maps a live module's name to a
stored or HF name goes through ``plain_fqn`` first, whichever wrappers (and
however many) the run's parallelisms stacked.
"""

WRAPPER_SEGMENTS = frozenset({"_checkpoint_wrapped_module", "_orig_mod", "_fsdp_wrapped_module"})
"""The attribute under which each wrapper holds the module it wraps:
CheckpointWrapper (activation checkpointing), OptimizedModule (torch.compile),
FSDP1's FullyShardedDataParallel. FSDP2's ``fully_shard`` and in-place
``Module.compile`` (what torchtitan 0.3.0 uses) add none."""


def plain_fqn(name: str) -> str:
    """``name`` without wrapper segments: ``layers.0._orig_mod._checkpoint_wrapped_module.attention.wo``
    -> ``layers.0.attention.wo``."""
    return ".".join(part for part in name.split(".") if part not in WRAPPER_SEGMENTS)
