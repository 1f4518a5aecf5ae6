"""Safetensors weights in and out of a torchtitan model, through its
ModelSpec's state-dict adapter (HF key names and layouts).

These are the single-process paths: a model on one device, a plain
``state_dict``. Inside the trainer (sharded DTensors), torchtitan's own
checkpointer does the same with the same adapter
(``[checkpoint] initial_load_in_hf`` / ``last_save_in_hf``).
"""

import glob
import os

import torch
from safetensors.torch import load_file, save_file
from torchtitan.protocols.model_spec import ModelSpec

from skrull_ext.hf.safetensors_file import read_header


def read_safetensors(folder: str) -> dict[str, torch.Tensor]:
    """Every tensor of every ``*.safetensors`` file in ``folder`` (HF keys);
    a cut or malformed file is a DataError naming it (``read_header``)."""
    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"{folder}: no *.safetensors files")
    tensors: dict[str, torch.Tensor] = {}
    for path in files:
        read_header(path)
        tensors.update(load_file(path))
    return tensors


def load_hf_weights(model: torch.nn.Module, spec: ModelSpec, folder: str) -> None:
    """Load the HF checkpoint in ``folder`` into ``model`` (built from
    ``spec.model``). Strict: a missing or unexpected tensor raises."""
    adapter = spec.state_dict_adapter(spec.model, folder)
    state_dict = adapter.from_hf(read_safetensors(folder))
    model.load_state_dict(state_dict, strict=True)


def hf_state_dict(model: torch.nn.Module, spec: ModelSpec) -> dict[str, torch.Tensor]:
    """``model``'s weights under HF key names and layouts (tied lm_head left
    out, as HF saves it)."""
    adapter = spec.state_dict_adapter(spec.model, None)
    state_dict = {k: v.detach() for k, v in model.state_dict().items()}
    return {k: v.contiguous() for k, v in adapter.to_hf(state_dict).items()}


def save_hf_weights(model: torch.nn.Module, spec: ModelSpec, folder: str) -> str:
    """Write ``model.safetensors`` into ``folder``; returns its path.

    Only weights: config.json and tokenizer files come from the source
    folder the model was loaded from.
    """
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "model.safetensors")
    save_file(hf_state_dict(model, spec), path, metadata={"format": "pt"})
    return path
