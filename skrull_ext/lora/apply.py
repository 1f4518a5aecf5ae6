# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""Put a job's ``[lora]`` into its model spec, where every builder reads it.

The trainer and the offline profiler both build ``config.model_spec.model``,
so LoRA is applied to the spec, once, when either starts (not when the job
file is read: CLI flags such as ``--lora.rank`` are applied after that).
The converted spec is a copy (torchtitan's converter edits the config tree in
place) and carries the LoRAConfig it was made with, so a second call is a
no-op and a changed ``[lora]`` is caught.
"""

from __future__ import annotations

import copy
import dataclasses

from torchtitan.protocols.model_spec import ModelSpec

from skrull_ext.lora.config import LoRAConfig
from skrull_ext.lora.converter import SkrullLoRAConverter


def with_lora(spec: ModelSpec, lora: LoRAConfig) -> ModelSpec:
    """A copy of ``spec`` whose model has ``lora``'s adapters (base frozen)."""
    converter = SkrullLoRAConverter.Config(
        rank=lora.rank, alpha=lora.alpha, target_modules=lora.titan_targets(),
        dropout=lora.dropout, layers=None if lora.layers is None else list(lora.layers),
    ).build()
    model = converter.convert(copy.deepcopy(spec.model))
    out = dataclasses.replace(spec, model=model)
    out.lora = dataclasses.replace(lora)  # ModelSpec is a plain (non-slots) dataclass
    return out


def apply_lora(config) -> None:
    """Convert ``config.model_spec`` in place on the config when ``config.lora`` is on."""
    lora: LoRAConfig | None = getattr(config, "lora", None)
    if lora is None or not lora.enable:
        return
    done = getattr(config.model_spec, "lora", None)
    if done is not None:
        if done != lora:
            raise ValueError(f"lora: the model spec was converted with {done}, the job now says {lora}")
        return
    config.model_spec = with_lora(config.model_spec, lora)
