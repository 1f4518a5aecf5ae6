"""A trainer's construction that leaves torchtitan's parameters as ``to_empty`` left them.

Why: torchtitan's ``Trainer`` draws every parameter (``init_weights``) before ``train()``
loads the checkpoint over them; for a job whose load writes every parameter the draws are
wasted (skrull_ext/train/job/weights_from_checkpoint.py says which jobs, and why the run is
the same). Buffers (RoPE's cache) still initialize: ``Module._init_self_buffers`` is untouched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["skip_param_init"]


@contextlib.contextmanager
def skip_param_init(skip: bool) -> Iterator[bool]:
    """Within, when ``skip``: torchtitan's modules do not initialize their own parameters
    (yields ``skip``); the method is restored however the block ends."""
    if not skip:
        yield False
        return
    from torchtitan.protocols.module import Module

    init = Module.__dict__["_init_self_parameters"]
    Module._init_self_parameters = lambda self: None
    try:
        yield True
    finally:
        Module._init_self_parameters = init
