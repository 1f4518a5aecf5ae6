"""A HF folder's tensors checked against its config.json before training.

torchtitan's HF load (DCP's HuggingFaceStorageReader, then the state-dict
adapter) reports a missing tensor, an extra one or a wrong shape deep inside
a distributed load, on every rank, after the model is built, or not at all
(an extra tensor is ignored). ``check_hf_weights`` reads only the
safetensors headers and compares them with the tensors the model built from
config.json expects (a meta-device model through the same adapter), so a
bad folder fails when the trainer starts, naming the file and the tensor.
"""

from __future__ import annotations

import glob
import json
import os
import struct

import torch
from torchtitan.protocols.model_spec import ModelSpec

from skrull_ext.hf.config import HFConfigError, read_hf_config

_SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64}
_DTYPE_NAMES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class HFWeightsError(ValueError):
    """A HF folder's tensors disagree with its config.json."""


def _header(path: str) -> dict:
    """The JSON header of a safetensors file: tensor name -> dtype, shape."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise HFWeightsError(f"{path}: not a safetensors file (truncated header)")
        (size,) = struct.unpack("<Q", raw)
        try:
            header = json.loads(f.read(size))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise HFWeightsError(f"{path}: not a safetensors file ({e})") from None
    header.pop("__metadata__", None)
    return header


def expected_hf_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """HF tensor name -> shape of the model ``spec`` builds (no memory used)."""
    with torch.device("meta"):
        model = spec.model.build()
    adapter = spec.state_dict_adapter(spec.model, None)
    return {k: tuple(v.shape) for k, v in adapter.to_hf(model.state_dict()).items()}


def _config_dtype(cfg: dict) -> torch.dtype | None:
    name = cfg.get("dtype") or cfg.get("torch_dtype")
    return _DTYPE_NAMES.get(name) if isinstance(name, str) else None


def check_hf_weights(folder: str, spec: ModelSpec) -> None:
    """Raise HFWeightsError naming the file and tensor where ``folder``'s
    safetensors differ from what ``spec`` (built from its config.json) loads:
    a missing or extra tensor, a shape, or a dtype other than config.json's
    ``torch_dtype`` (or, without one, other than the folder's other tensors)."""
    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if not files:
        raise HFWeightsError(f"{folder}: no *.safetensors files (hf_path must hold the model's weights)")
    config_path = os.path.join(folder, "config.json")
    want_dtype = _config_dtype(read_hf_config(folder))
    dtype_source = f"{config_path} (torch_dtype)"
    expected = expected_hf_shapes(spec)
    seen: dict[str, str] = {}
    for path in files:
        for name, info in _header(path).items():
            if name in seen:
                raise HFWeightsError(f"{path}: tensor {name!r} is also in {seen[name]}")
            seen[name] = path
            if name not in expected:
                raise HFWeightsError(
                    f"{path}: tensor {name!r} is not a parameter of the model {config_path} describes"
                )
            shape = tuple(info["shape"])
            if shape != expected[name]:
                raise HFWeightsError(
                    f"{path}: tensor {name!r} has shape {list(shape)}, but {config_path} "
                    f"makes it {list(expected[name])}"
                )
            dtype = _SAFETENSORS_DTYPES.get(info["dtype"])
            if dtype is None:
                raise HFWeightsError(f"{path}: tensor {name!r} has dtype {info['dtype']}, not a float type")
            if want_dtype is None:
                want_dtype, dtype_source = dtype, f"{path}'s first tensor {name!r}"
            if dtype != want_dtype:
                raise HFWeightsError(
                    f"{path}: tensor {name!r} is {dtype}, but {dtype_source} is {want_dtype}"
                )
    missing = sorted(set(expected) - set(seen))
    if missing:
        raise HFWeightsError(
            f"{folder}: tensor {missing[0]!r} missing from {[os.path.basename(f) for f in files]} "
            f"({len(missing)} missing in all), but {config_path} needs it"
        )


def check_hf_folder(folder: str, spec: ModelSpec) -> None:
    """config.json already made ``spec``; this checks the weights beside it."""
    if not os.path.isfile(os.path.join(folder, "config.json")):
        raise HFConfigError(f"{os.path.join(folder, 'config.json')}: not found (hf_path must be a HF model folder)")
    check_hf_weights(folder, spec)
