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

Its state-dict adapter leaves the adapters out of every HF state dict
(``without_adapters``): a HF folder holds the base, or the merged weights
(peft_io.py folds the adapters in and writes them as a peft folder), never
``lora_a``/``lora_b``. torchtitan's adapters skip a decoder layer's key they
cannot name but fail on any other, so the head's adapter
(``lm_head.lora_a.weight``) stopped torchtitan's ``last_save_in_hf`` and the
merged export.
"""

from __future__ import annotations

import copy
import dataclasses
import functools

from torchtitan.protocols.model_spec import ModelSpec

from skrull_ext.lora.config import LoRAConfig
from skrull_ext.lora.converter import SkrullLoRAConverter


def is_adapter_key(fqn: str) -> bool:
    """Whether a state-dict key is a LoRA adapter's weight (``layers.0.attention.wo.lora_a.weight``)."""
    return ".lora_a." in fqn or ".lora_b." in fqn


@functools.cache
def without_adapters(adapter_cls: type) -> type:
    """``adapter_cls`` (a model's state-dict adapter) whose ``to_hf`` leaves out the LoRA adapters."""

    class LoRAStateDictAdapter(adapter_cls):
        def to_hf(self, state_dict):
            return super().to_hf({k: v for k, v in state_dict.items() if not is_adapter_key(k)})

    LoRAStateDictAdapter.__qualname__ = LoRAStateDictAdapter.__name__ = f"{adapter_cls.__name__}WithoutLoRA"
    return LoRAStateDictAdapter


def with_lora(spec: ModelSpec, lora: LoRAConfig) -> ModelSpec:
    """A copy of ``spec`` whose model has ``lora``'s adapters (base frozen), and whose state-dict
    adapter leaves them out of HF state dicts (module docstring)."""
    converter = SkrullLoRAConverter.Config(
        rank=lora.rank, alpha=lora.alpha, target_modules=lora.titan_targets(),
        dropout=lora.dropout, layers=None if lora.layers is None else list(lora.layers),
    ).build()
    model = converter.convert(copy.deepcopy(spec.model))
    adapter = spec.state_dict_adapter and without_adapters(spec.state_dict_adapter)
    out = dataclasses.replace(spec, model=model, state_dict_adapter=adapter)
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
