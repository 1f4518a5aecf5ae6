# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""LoRA adapters out as peft folders, and the merged model as a HF folder.

peft's LoRA on a linear W (out x in) adds ``scaling * lora_B @ lora_A`` with
``scaling = lora_alpha / r``, as torchtitan's LoRALinear does, so the
adapters carry over once they are in HF's layout:

- names: the model's own state-dict adapter (``spec.state_dict_adapter``)
  maps torchtitan FQNs to HF keys, as for the base weights, once the
  wrappers the parallelize step put around blocks (activation checkpointing,
  compile, FSDP1) are out of the module names (``skrull_ext.models.fqn``);
- rows: HF's layout of an output row can differ (llama3 permutes q/k rows for
  its RoPE; the fused ``wqkv`` interleaves q, k, v per KV group). ``lora_B``
  is out x r, so it is laid out as a weight would be: padded with zero
  columns to the base weight's shape, sent through the same path as the
  weight (``FusedQKVLinear``'s split hook, then ``to_hf``) and cut back to r
  columns. Every step of that path moves whole rows, so the result is exact.
- columns: ``lora_A`` acts on the layer input, which is in HF's basis
  already, and is copied as is; the fused wqkv pair gives q_proj, k_proj and
  v_proj the same ``lora_A`` and each its rows of ``lora_B``.

Sharded (FSDP) parameters are gathered first; every rank must call these
functions (the gathers are collectives), and only the one with
``write=True`` touches the disk.
"""

from __future__ import annotations

import json
import os

import torch
from safetensors.torch import save_file
from torch.distributed.tensor import DTensor
from torchtitan.models.common.attention import FusedQKVLinear
from torchtitan.protocols.model_spec import ModelSpec

from skrull_ext.hf.folder import HFExport
from skrull_ext.lora.config import LoRAConfig
from skrull_ext.lora.converter import lora_modules
from skrull_ext.models.fqn import plain_fqn

PEFT_PREFIX = "base_model.model."
"""peft's key prefix for a PeftModelForCausalLM (LoraModel wrapping the HF model)."""


def _full(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    return (t.full_tensor() if isinstance(t, DTensor) else t).cpu()


def hf_rows(model: torch.nn.Module, spec: ModelSpec, fqn: str, rows: torch.Tensor) -> dict[str, torch.Tensor]:
    """``rows`` (one per output row of the linear ``fqn``, up to its in_features
    columns) in HF's layout: {HF weight key: rows} (one key, or three for a
    fused wqkv). ``fqn`` is the module's name in ``model`` as it runs, with any
    activation-checkpoint, compile or FSDP1 wrapper segment: they are dropped
    (``plain_fqn``) before the name meets the state-dict adapter."""
    weight = model.get_submodule(fqn).weight
    out, cols = weight.shape[0], rows.shape[1]
    if rows.shape[0] != out or cols > weight.shape[1]:
        raise ValueError(f"{fqn}: rows of shape {tuple(rows.shape)} do not fit its weight {tuple(weight.shape)}")
    padded = rows.new_zeros(out, weight.shape[1])
    padded[:, :cols] = rows
    name = plain_fqn(fqn)  # the state-dict name: no activation-checkpoint / compile / FSDP1 wrapper segment
    state = {f"{name}.weight": padded}
    parent = model.get_submodule(fqn.rsplit(".", 1)[0])
    if isinstance(parent, FusedQKVLinear):
        FusedQKVLinear._split_qkv_on_save(parent, state, f"{name.rsplit('.', 1)[0]}.", None)
    hf = spec.state_dict_adapter(spec.model, None).to_hf(state)
    if not hf:
        raise ValueError(f"{name}: the {spec.name} state-dict adapter has no HF name for it")
    return {k: v[:, :cols].contiguous() for k, v in hf.items()}


def adapter_tensors(model: torch.nn.Module, spec: ModelSpec) -> dict[str, torch.Tensor]:
    """peft's ``adapter_model.safetensors`` contents for ``model``'s adapters."""
    tensors = {}
    for fqn, m in lora_modules(model).items():
        a, b = _full(m.lora_a.weight), _full(m.lora_b.weight)
        for key, b_rows in hf_rows(model, spec, fqn, b).items():
            stem = PEFT_PREFIX + key.removesuffix(".weight")
            tensors[f"{stem}.lora_A.weight"] = a.clone()
            tensors[f"{stem}.lora_B.weight"] = b_rows
    return tensors


def adapter_config(lora: LoRAConfig, base_model_name_or_path: str | None) -> dict:
    """peft's ``adapter_config.json`` (LoraConfig fields; peft fills the rest with defaults)."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model_name_or_path,
        "r": lora.rank,
        "lora_alpha": lora.alpha,
        "lora_dropout": lora.dropout,
        "target_modules": lora.hf_targets(),
        "layers_to_transform": None if lora.layers is None else sorted(lora.layers),
        "layers_pattern": None if lora.layers is None else "layers",
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "inference_mode": True,
    }


def save_adapter(model: torch.nn.Module, spec: ModelSpec, lora: LoRAConfig, folder: str,
                 base_model_name_or_path: str | None = None, write: bool = True) -> None:
    """Write ``adapter_config.json`` + ``adapter_model.safetensors`` (a folder
    ``peft.PeftModel.from_pretrained`` loads onto the HF base model)."""
    tensors = adapter_tensors(model, spec)
    if not write:
        return
    os.makedirs(folder, exist_ok=True)
    save_file(tensors, os.path.join(folder, "adapter_model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(folder, "adapter_config.json"), "w") as f:
        json.dump(adapter_config(lora, base_model_name_or_path), f, indent=2)


def merged_hf_state_dict(model: torch.nn.Module, spec: ModelSpec, keep: bool = True) -> dict[str, torch.Tensor]:
    """The HF state dict of the base model with every adapter folded in
    (W + scaling * B @ A, in float32 then cast to the weight's dtype).

    ``keep=False`` (the ranks that do not write): take part in the gathers and
    return {}, so only the writing rank holds the whole model in host memory."""
    base = {}
    for k, v in model.state_dict().items():
        full = _full(v)  # a collective for a sharded (DTensor) weight: every rank, one tensor at a time
        if keep:
            base[plain_fqn(k)] = full
    adapters = {fqn: (_full(m.lora_a.weight).float(), _full(m.lora_b.weight).float(), m._lora_scaling)
                for fqn, m in lora_modules(model).items()}
    if not keep:
        return {}
    hf = {k: v.contiguous() for k, v in spec.state_dict_adapter(spec.model, None).to_hf(base).items()}
    for fqn, (a, b, scaling) in adapters.items():
        for key, delta in hf_rows(model, spec, fqn, scaling * (b @ a)).items():
            hf[key] = (hf[key].float() + delta).to(hf[key].dtype)
    return hf


def save_merged(model: torch.nn.Module, spec: ModelSpec, folder: str, files: HFExport, dtype: str = "float32",
                write: bool = True) -> dict[str, torch.Tensor]:
    """Write the merged model to ``folder`` as a complete HF folder: model.safetensors
    in ``dtype``, and ``files``' config.json, tokenizer files and chat template.
    Returns the merged tensors (HF keys; {} where ``write`` is False)."""
    tensors = merged_hf_state_dict(model, spec, keep=write)
    if write:
        files.write(folder, tensors, dtype)
    return tensors


def load_hf_base(model: torch.nn.Module, spec: ModelSpec, folder: str) -> None:
    """Load the HF checkpoint in ``folder`` into a LoRA model's base weights;
    the adapters keep their init. Strict otherwise: any other missing or
    unexpected tensor raises."""
    from skrull_ext.hf.weights import read_safetensors

    state = spec.state_dict_adapter(spec.model, folder).from_hf(read_safetensors(folder))
    result = model.load_state_dict(state, strict=False)
    missing = [k for k in result.missing_keys if ".lora_a." not in k and ".lora_b." not in k]
    if missing or result.unexpected_keys:
        raise ValueError(f"{folder}: missing {missing}, unexpected {result.unexpected_keys}")
