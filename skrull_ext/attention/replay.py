# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""Activation checkpointing and the DACP K/V exchange."""

import torch

__all__ = ["in_backward"]


def in_backward() -> bool:
    """True while the autograd engine runs a backward on this thread.

    That is where non-reentrant ``torch.utils.checkpoint`` (what torchtitan's
    full and selective AC use) re-runs a checkpointed forward. FSDP2
    (``_fsdp_common.is_bw``) and ``torch.utils.module_tracker`` test the same.
    """
    return torch._C._current_graph_task_id() != -1
