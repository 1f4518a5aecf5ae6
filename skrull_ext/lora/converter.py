# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""torchtitan's LoRAConverter with the two things a ``[lora]`` job adds.

torchtitan 0.3.0's ``LoRAConverter`` rewrites the model config tree: target
``Linear.Config``s become ``LoRALinear.Config`` (frozen base, trainable
``lora_a``/``lora_b``) and every other module config freezes its own
parameters when built. It matches targets by the last FQN segment only and
has no dropout, so this subclass adds

- ``layers``: only linears under ``layers.<i>.`` for the listed i (peft's
  ``layers_to_transform``); everything else is frozen as torchtitan does;
- ``dropout``: ``DropoutLoRALinear``, torchtitan's LoRALinear whose adapter
  sees ``dropout(x)`` in training (peft's ``lora_dropout``);
- the head: ``lm_head`` targets the model's head (the linear of that name at
  the root, outside the layers) and nothing else; refused on a model whose
  head is its embedding table (``enable_weight_tying``), whose HF folder
  stores one table for both, so the merged folder could not hold the
  adapted head without untying the model,

and fails, instead of warning, when a target matches nothing: a LoRA job
that adapts no linear would train nothing.

Each ``lora_a`` draws its initial values from its own generator (the job's
seed and the adapter's place in the model), not from the global RNG that
draws the base weights: torchtitan's adapters took their draws from that
stream between the base layers' own, so on random initialisation adding
``[lora]`` changed every base weight after the first adapter (step-1 loss
8.13606 without, 8.08156 with, under one seed), although the adapters start
at zero (``lora_b``).
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor, distribute_tensor
from torchtitan.components.lora import LoRAConverter, _get_lora_cls, _make_frozen_config
from torchtitan.models.common.linear import Linear
from torchtitan.protocols.module import Module

from skrull_ext.lora.config import HEAD

_LoRALinear = _get_lora_cls(Linear)
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


_GOLDEN = 0x9E3779B97F4A7C15  # spreads adapter indices over the seed space


@torch.no_grad()
def _draw_lora_a(weight: torch.Tensor, index: int) -> None:
    """torchtitan's lora_a init (kaiming uniform, a = sqrt(5)) from a generator of
    its own: the job's seed (``torch.initial_seed``, the same on every rank) and
    ``index``. The whole matrix is drawn on every rank (it is rank x in_features,
    small) and each keeps its shard, without communication."""
    seed = (torch.initial_seed() + _GOLDEN * (index + 1)) % 2**63
    full = torch.empty(weight.shape, dtype=torch.float32)
    torch.nn.init.kaiming_uniform_(full, a=math.sqrt(5), generator=torch.Generator().manual_seed(seed))
    if isinstance(weight, DTensor):
        full = distribute_tensor(full.to(weight.device, weight.dtype), weight.device_mesh, weight.placements,
                                 src_data_rank=None)
    weight.copy_(full)


class DropoutLoRALinear(_LoRALinear):
    """LoRALinear with dropout on the adapter input (base path untouched) and
    ``lora_a`` drawn from its own generator (see the module docstring)."""

    @dataclass(kw_only=True, slots=True)
    class Config(_LoRALinear.Config):
        dropout: float = 0.0
        index: int = 0
        """This adapter's place among the model's (seeds its lora_a draw)."""

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self._lora_dropout = config.dropout
        self.lora_a._param_init = {"weight": functools.partial(_draw_lora_a, index=config.index)}

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return lora_linear(self, input)


def lora_linear(module: torch.nn.Module, input: torch.Tensor) -> torch.Tensor:
    """A LoRA linear's output, ``W x + b + alpha / r * B(A(dropout(x)))``: ``DropoutLoRALinear``'s
    forward, and the head's per chunk where the model passes the hidden states through its head
    module (train/head_loss.py), so the two are one computation. The dropout (``_lora_dropout``,
    none on torchtitan's own LoRALinear, whose forward this equals there) only while training;
    the base path never sees it."""
    base_out = F.linear(input, module.weight, module.bias)
    dropout = getattr(module, "_lora_dropout", 0.0)
    lora_in = F.dropout(input, dropout, training=True) if module.training and dropout > 0 else input
    return base_out + module._lora_scaling * module.lora_b(module.lora_a(lora_in))


LORA_FORWARDS = (DropoutLoRALinear.forward, _LoRALinear.forward)
"""The LoRA linears' forwards that ``lora_linear`` computes (torchtitan's own without dropout)."""


def lora_modules(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """FQN -> every LoRA linear of a built model."""
    return {n: m for n, m in model.named_modules() if isinstance(m, _LoRALinear)}


def layer_of(fqn: str) -> int | None:
    """The decoder layer index in an FQN (``layers.3.attention.wo`` -> 3)."""
    m = _LAYER.search(fqn)
    return int(m.group(1)) if m else None


class SkrullLoRAConverter(LoRAConverter):
    @dataclass(kw_only=True, slots=True)
    class Config(LoRAConverter.Config):
        dropout: float = 0.0
        """Dropout on the adapter input (peft's lora_dropout)."""

        layers: list[int] | None = None
        """Decoder layer indices whose target linears are adapted; None: all."""

    def _make_lora_config(self, cfg: Linear.Config):
        if type(cfg) is not Linear.Config:  # e.g. a quantized linear: torchtitan's own class
            return super()._make_lora_config(cfg)
        return DropoutLoRALinear.Config(
            **{f.name: getattr(cfg, f.name) for f in fields(cfg) if f.init},
            rank=self.rank, alpha=self.alpha, dropout=self.config.dropout,
        )

    def _is_target(self, fqn: str, cfg: Module.Config) -> bool:
        if not isinstance(cfg, Linear.Config) or fqn.rsplit(".", 1)[-1] not in self.target_modules:
            return False
        if fqn == HEAD:  # the head: outside the layers (LoRAConfig refuses it with layers)
            return True
        layer = layer_of(fqn)
        return layer is not None and (self.config.layers is None or layer in self.config.layers)

    def convert(self, model_config: Module.Config) -> Module.Config:
        """LoRAConverter.convert with ``_is_target`` deciding (same leaves-to-root walk)."""
        if self.target_modules is None:
            raise ValueError("SkrullLoRAConverter needs target_modules")
        root, matched, layers, adapted = model_config, set(), set(), []
        for fqn, cfg, parent, attr in reversed(list(model_config.traverse(Module.Config, recurse=True))):
            if self._is_target(fqn, cfg):
                new_cfg = self._make_lora_config(cfg)
                if isinstance(new_cfg, DropoutLoRALinear.Config):
                    new_cfg.index = len(adapted)
                    adapted.append(fqn)
                matched.add(fqn.rsplit(".", 1)[-1])
                layers.add(layer_of(fqn))
            else:
                new_cfg = _make_frozen_config(cfg)
            if parent is None:
                root = new_cfg
            elif isinstance(parent, list):
                parent[attr] = new_cfg
            else:
                setattr(parent, attr, new_cfg)
        if self.config.layers is not None and (missing := sorted(set(self.config.layers) - layers)):
            raise ValueError(f"lora.layers: {missing} not in this model (or those layers hold no target linear)")
        if unmatched := sorted(self.target_modules - matched):
            raise ValueError(f"lora.target_modules: no decoder-layer linear named {unmatched} in this model"
                             if HEAD not in unmatched else f"lora.target_modules: this model has no {HEAD!r} linear")
        if HEAD in matched and getattr(model_config, "enable_weight_tying", False):
            raise ValueError(
                f"lora.target_modules: {HEAD!r} on a model whose head is its embedding table (tie_word_embeddings): "
                "its HF folder stores one table for both, so the merged folder could not hold the adapted head "
                f"without untying the model; leave {HEAD!r} out, or train a model with tie_word_embeddings false")
        return root
