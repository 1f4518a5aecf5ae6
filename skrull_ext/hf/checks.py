"""A HF folder's tensors checked against its config.json before training.

torchtitan's HF load (DCP's HuggingFaceStorageReader, then the state-dict
adapter) reports a missing tensor, an extra one or a wrong shape deep inside
a distributed load, on every rank, after the model is built, or not at all
(an extra tensor is ignored). ``check_hf_weights`` reads only the
safetensors headers (checking that every tensor's bytes are in the file:
safetensors_file.py) and compares them with the tensors the model built from
config.json expects (a meta-device model through the same adapter), so a
bad folder fails when the trainer starts, naming the file and the tensor.

A tied model (``tie_word_embeddings``) whose folder also stores
``lm_head.weight`` (some exports write both) is accepted when the stored head
equals the embedding: transformers then ties them, and so does the model
here (loading either gives the same weights); the check says so once. A
stored head that differs is refused: transformers 5 would untie the model
and train both, transformers 4 would drop the stored head, so what the
folder means is unclear.
"""

from __future__ import annotations

import glob
import os

import torch
from torchtitan.protocols.model_spec import ModelSpec
from torchtitan.tools.logging import logger

from skrull_ext.errors import UserError
from skrull_ext.models.hf_config import HFConfigError, read_hf_config
from skrull_ext.hf.safetensors_file import read_header

_SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64}
_DTYPE_NAMES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
TIED_HEAD = "lm_head.weight"


class HFWeightsError(UserError):
    """A HF folder's tensors disagree with its config.json."""


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
    tied = bool(spec.model.enable_weight_tying) and "model.embed_tokens.weight" in expected
    optional = {TIED_HEAD: expected["model.embed_tokens.weight"]} if tied else {}  # equal to the embedding
    expected = {**optional, **expected}
    seen: dict[str, str] = {}
    for path in files:
        for name, info in read_header(path).items():
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
    missing = sorted(set(expected) - set(seen) - set(optional))
    if missing:
        raise HFWeightsError(
            f"{folder}: tensor {missing[0]!r} missing from {[os.path.basename(f) for f in files]} "
            f"({len(missing)} missing in all), but {config_path} needs it"
        )
    if TIED_HEAD in optional and TIED_HEAD in seen:
        _check_tied_head(seen, config_path)


def _check_tied_head(seen: dict[str, str], config_path: str) -> None:
    """A stored lm_head.weight of a tied model must equal the embedding (module docstring)."""
    from safetensors import safe_open

    embed = "model.embed_tokens.weight"
    tensors = {}
    for name in (TIED_HEAD, embed):
        with safe_open(seen[name], "pt") as f:
            tensors[name] = f.get_tensor(name)
    if not torch.equal(tensors[TIED_HEAD], tensors[embed]):
        raise HFWeightsError(
            f"{seen[TIED_HEAD]}: {TIED_HEAD} differs from {embed}, but {config_path} ties them "
            "(tie_word_embeddings: true); set tie_word_embeddings to false to train both, or remove "
            f"{TIED_HEAD} to tie the head to the embedding"
        )
    logger.info(f"{seen[TIED_HEAD]}: {TIED_HEAD} equals {embed} and is tied to it "
                f"({config_path}: tie_word_embeddings), as transformers ties it")


def check_hf_folder(folder: str, spec: ModelSpec) -> None:
    """config.json already made ``spec``; this checks the weights beside it."""
    if not os.path.isfile(os.path.join(folder, "config.json")):
        raise HFConfigError(f"{os.path.join(folder, 'config.json')}: not found (hf_path must be a HF model folder)")
    check_hf_weights(folder, spec)
