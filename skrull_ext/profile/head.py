# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""The cost per token outside the layers (``CostModel.token_us``).

Every micro-batch runs the embedding, the final norm, the output projection
and the loss over the tokens each rank holds. The compute ladder
(compute.py) times the blocks alone, and the fixed cost (micro_batch.py) is
a slope over micro-batch counts at equal tokens, so neither holds this
per-token work; over a 152K vocabulary it is microseconds a token on a GPU
(measured/predicted x1.4 on an H200 without it: docs/design/cost_model.md).

Timed here as torchtitan's ``Decoder.forward`` runs those parts
(``tok_embeddings``, ``norm``, ``lm_head``) with the job's loss, forward and
backward, on one document of each length of the compute ladder, round-robin
over ``warmup`` + ``repeats`` rounds on the compute stage's clock, mean over
ranks. ``token_us`` is the slope of the line through them; the intercept
(the embedding gradient's zero fill, the calls themselves) is paid once per
micro-batch, which the fixed-cost stage's slope already counts. With the
head and loss in chunks (``[loss]``, train/head_loss.py) the loss applies the
head as the job's chunks run it (``head_backward``): with "recompute" the time
includes each chunk's head again in backward, with "in_forward" the gradients
computed in the loss's forward (train/head_grad.py).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch

from skrull_ext.profile.fit import PolyFit, fit_line_nonneg
from skrull_ext.profile.model import JobModel
from skrull_ext.profile.options import ProfileOptions
from skrull_ext.profile.ranks import pick_clock, reduce_floats, time_call

__all__ = ["HeadResult", "profile_head"]


@dataclass(frozen=True)
class HeadResult:
    tokens: tuple[int, ...]
    """Tokens of each timed pass, the fit's x."""
    us: list[float]
    """Forward+backward microseconds of the parts outside the layers (median over repeats, mean over ranks)."""
    fit: PolyFit
    """us = intercept + token_us * tokens."""
    clock: str

    @property
    def token_us(self) -> float:
        return self.fit.slope


_PARTS = ("tok_embeddings", "norm", "lm_head")  # torchtitan's Decoder.forward, outside its layers


def _parts(jm: JobModel) -> tuple[torch.nn.Module, torch.nn.Module, torch.nn.Module]:
    missing = [name for name in _PARTS if getattr(jm.model, name, None) is None]
    if missing:
        raise ValueError(f"{jm.name}: no {', '.join(missing)} to time the per-token head cost on "
                         "(torchtitan's Decoder has all three)")
    return tuple(getattr(jm.model, name) for name in _PARTS)


def profile_head(jm: JobModel, opts: ProfileOptions, tick: Callable[[str], None]) -> HeadResult:
    """Time the embedding, final norm, output projection and loss at each ladder length; fit the line."""
    embed, norm, head = _parts(jm)
    lengths = tuple(sorted({int(s) for s in opts.lengths}))
    bufs = [jm.buffer([s], seed=opts.seed) for s in lengths]

    calls_head = not getattr(jm.model, "_skip_lm_head", False)  # as Decoder.forward (a chunked loss: a pass-through)

    def step(buf: dict) -> None:
        h = embed(buf["tokens"])
        if not h.requires_grad:  # a frozen embedding (LoRA): in training the layers' adapters start the graph
            h = h.detach().requires_grad_()
        h = norm(h)
        loss, _ = jm.loss_fn(head(h) if calls_head else h, buf["labels"])
        loss.backward()

    def before() -> None:
        jm.model.zero_grad(set_to_none=True)

    clock = pick_clock(opts.clock, jm.device)
    samples: list[list[float]] = [[] for _ in lengths]
    rounds = opts.warmup + opts.repeats
    for r in range(rounds):
        for i, buf in enumerate(bufs):
            tick(f"head {lengths[i]} ({r + 1}/{rounds})")
            wall, cpu = time_call(lambda: step(buf), jm.device, before=before)  # noqa: B023
            if r >= opts.warmup:
                samples[i].append(cpu if clock == "cpu" else wall)
    jm.model.zero_grad(set_to_none=True)
    us = reduce_floats([statistics.median(s) for s in samples], "mean", jm.device)
    fit, _ = fit_line_nonneg([float(s) for s in lengths], us)
    return HeadResult(lengths, us, fit, clock)
