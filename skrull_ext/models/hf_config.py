"""HF model folder (config.json) -> torchtitan ModelSpec.

A pretrained model arrives as a HF folder: ``config.json``, ``*.safetensors``
and tokenizer files. Its ``architectures`` entry names the model class that
wrote it; ``HF_ARCHITECTURES`` maps each supported class to a skrull family
(``skrull_ext.models.decoders``) and to the config.json options that family cannot
represent, which are refused here, before any training starts, rather than
silently giving a different model. Weights are loaded separately
(``skrull_ext.hf.weights``), through the spec's state-dict adapter.

Both config.json layouts are read: transformers 4 (``rope_theta``,
``rope_scaling``) and 5 (``rope_parameters``).
"""

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torchtitan.protocols.model_spec import ModelSpec

from skrull_ext.errors import UserError
from skrull_ext.models.decoders import DecoderDims, LlamaRopeScaling, decoder_spec


class HFConfigError(UserError):
    """config.json describes a model skrull-ext cannot build exactly."""


def _rope_parameters(cfg: dict) -> dict:
    """transformers 5 nests RoPE under ``rope_parameters``; 4 kept
    ``rope_theta`` at top level and scaling (or null) in ``rope_scaling``."""
    params = dict(cfg.get("rope_scaling") or {})
    params.update(cfg.get("rope_parameters") or {})
    params.setdefault("rope_theta", cfg.get("rope_theta", 10000.0))
    params.setdefault("rope_type", params.get("type", "default"))
    return params


def _llama3_scaling(rope: dict) -> LlamaRopeScaling | None:
    if rope["rope_type"] == "default":
        return None
    if rope["rope_type"] != "llama3":
        raise HFConfigError(
            f"rope type {rope['rope_type']!r} is not supported for llama; "
            "supported: 'default', 'llama3'"
        )
    return LlamaRopeScaling(
        factor=float(rope["factor"]),
        low_freq_factor=float(rope["low_freq_factor"]),
        high_freq_factor=float(rope["high_freq_factor"]),
        original_max_position_embeddings=int(rope["original_max_position_embeddings"]),
    )


def _no_rope_scaling(rope: dict) -> None:
    if rope["rope_type"] != "default":
        raise HFConfigError(
            f"rope type {rope['rope_type']!r} is not supported for this architecture; "
            "supported: 'default'"
        )
    return None


def _refuse(cfg: dict, **unsupported: Any) -> None:
    """Fail on any option set to something other than its only supported value."""
    for key, supported in unsupported.items():
        value = cfg.get(key, supported)
        if value != supported:
            raise HFConfigError(f"{key} = {value!r} is not supported (only {supported!r})")


def _full_attention_only(cfg: dict) -> None:
    """Qwen2/Qwen3 configs may switch layers to sliding-window attention.

    Refused only where transformers' model would really use a window: its
    config gives layer ``i`` a window when ``use_sliding_window`` is set,
    ``sliding_window`` is not null and ``i >= max_window_layers`` (or
    ``layer_types`` says ``sliding_attention``). ``use_sliding_window: true``
    with ``max_window_layers >= num_hidden_layers`` (shipped by some Qwen2
    exports) is all full attention there, and here."""
    window = cfg.get("sliding_window", 4096) if cfg.get("use_sliding_window", False) else None
    types = cfg.get("layer_types")
    if types is None:
        first = cfg.get("max_window_layers", 28)
        types = ["sliding_attention" if window is not None and i >= first else "full_attention"
                 for i in range(cfg["num_hidden_layers"])]
    unknown = sorted(set(types) - {"full_attention", "sliding_attention"})
    if unknown:
        raise HFConfigError(f"layer_types {unknown} is not supported (only full_attention)")
    sliding = [i for i, t in enumerate(types) if t == "sliding_attention"]
    if sliding and window is not None:
        how = "layer_types" if cfg.get("layer_types") is not None else (
            f"use_sliding_window = true with max_window_layers = {cfg.get('max_window_layers', 28)}")
        which = f"{sliding[0]}-{sliding[-1]}" if sliding == list(range(sliding[0], sliding[-1] + 1)) else sliding
        raise HFConfigError(f"{how} gives layers {which} of {len(types)} sliding-window "
                            f"attention (window {window}), which is not supported (only full attention)")


def _check_llama(cfg: dict) -> None:
    _refuse(cfg, attention_bias=False, mlp_bias=False)


def _check_qwen3(cfg: dict) -> None:
    _refuse(cfg, attention_bias=False)
    _full_attention_only(cfg)


@dataclass(frozen=True)
class HFArchitecture:
    family: str
    """skrull_ext.models.decoders family name."""
    model_type: str
    """config.json ``model_type``; identifies folders that omit ``architectures``."""
    check: Callable[[dict], None]
    """Raises HFConfigError on options the family does not build."""
    rope_scaling: Callable[[dict], LlamaRopeScaling | None]


HF_ARCHITECTURES: dict[str, HFArchitecture] = {
    "LlamaForCausalLM": HFArchitecture("llama3", "llama", _check_llama, _llama3_scaling),
    "Qwen2ForCausalLM": HFArchitecture("qwen2_5", "qwen2", _full_attention_only, _no_rope_scaling),
    "Qwen3ForCausalLM": HFArchitecture("qwen3", "qwen3", _check_qwen3, _no_rope_scaling),
}


def read_hf_config(folder: str) -> dict:
    path = os.path.join(folder, "config.json")
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise HFConfigError(f"{path}: not found (hf_path must be a HF model folder)") from None
    except json.JSONDecodeError as e:
        raise HFConfigError(f"{path}: not valid JSON: {e}") from e


def hf_architecture(cfg: dict, where: str = "config.json") -> tuple[str, HFArchitecture]:
    """The supported architecture config.json names (``architectures``, or
    ``model_type`` when that is absent)."""
    names = cfg.get("architectures")
    if not names:
        by_type = {a.model_type: n for n, a in HF_ARCHITECTURES.items()}
        names = [by_type.get(cfg.get("model_type"), f"model_type={cfg.get('model_type')!r}")]
    for name in names:
        if name in HF_ARCHITECTURES:
            return name, HF_ARCHITECTURES[name]
    raise HFConfigError(
        f"{where}: architectures {names} is not supported; supported: {sorted(HF_ARCHITECTURES)}"
    )


def hf_dims(cfg: dict, arch: HFArchitecture) -> DecoderDims:
    """DecoderDims from config.json (after ``arch.check``)."""
    arch.check(cfg)
    _refuse(cfg, hidden_act="silu")
    n_heads = cfg["num_attention_heads"]
    return DecoderDims(
        vocab_size=cfg["vocab_size"],
        dim=cfg["hidden_size"],
        n_layers=cfg["num_hidden_layers"],
        n_heads=n_heads,
        n_kv_heads=cfg.get("num_key_value_heads") or n_heads,
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // n_heads,
        hidden_dim=cfg["intermediate_size"],
        rope_theta=float(_rope_parameters(cfg)["rope_theta"]),
        max_seq_len=cfg["max_position_embeddings"],
        norm_eps=float(cfg["rms_norm_eps"]),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        rope_scaling=arch.rope_scaling(_rope_parameters(cfg)),
    )


def spec_from_hf(folder: str, attn_backend: str = "flex") -> ModelSpec:
    """The ModelSpec of the HF model in ``folder``; flavor is the folder name.

    Raises HFConfigError naming the file and what is unsupported.
    """
    cfg = read_hf_config(folder)
    where = os.path.join(folder, "config.json")
    _, arch = hf_architecture(cfg, where)
    try:
        dims = hf_dims(cfg, arch)
    except HFConfigError as e:
        raise HFConfigError(f"{where}: {e}") from e
    except KeyError as e:
        raise HFConfigError(f"{where}: missing {e.args[0]!r}") from e
    flavor = os.path.basename(os.path.normpath(folder))
    return decoder_spec(arch.family, flavor, dims, attn_backend=attn_backend)


# --------------------------------------------------------------------------
# The other way: a ModelSpec -> config.json, for models not started from a
# HF folder (a job's name/flavor), so their export loads in transformers.

_MODEL_TYPE = {a.family: (name, a.model_type) for name, a in HF_ARCHITECTURES.items()}


def spec_dims(model_config) -> DecoderDims:
    """The DecoderDims of a decoder config built by ``decoder_spec`` or by
    torchtitan's llama3/qwen3 registries (same fields)."""
    attention = model_config.layers[0].attention
    heads = attention.qkv_linear
    rope = attention.rope
    scaling = None
    if getattr(rope, "scaling", None) == "llama":
        scaling = LlamaRopeScaling(
            factor=float(rope.scaling_factor),
            low_freq_factor=float(rope.low_freq_factor),
            high_freq_factor=float(rope.high_freq_factor),
            original_max_position_embeddings=int(rope.original_max_position_embeddings),
        )
    return DecoderDims(
        vocab_size=model_config.vocab_size,
        dim=model_config.dim,
        n_layers=len(model_config.layers),
        n_heads=heads.n_heads,
        n_kv_heads=heads.n_kv_heads or heads.n_heads,
        head_dim=heads.head_dim,
        hidden_dim=model_config.layers[0].feed_forward.w1.out_features,
        rope_theta=float(rope.theta),
        max_seq_len=rope.max_seq_len,
        norm_eps=float(model_config.norm.eps),
        tie_embeddings=bool(model_config.enable_weight_tying),
        rope_scaling=scaling,
    )


def hf_config_json(family: str, dims: DecoderDims, dtype: str = "float32") -> dict:
    """config.json of a ``family`` model at ``dims`` whose weights are saved in
    ``dtype``, in the transformers 4 layout (which transformers 5 reads too);
    ``hf_dims`` of it gives ``dims`` back."""
    if family not in _MODEL_TYPE:
        raise HFConfigError(f"no HF architecture for model family {family!r}; supported: {sorted(_MODEL_TYPE)}")
    architecture, model_type = _MODEL_TYPE[family]
    cfg = {
        "architectures": [architecture],
        "model_type": model_type,
        "vocab_size": dims.vocab_size,
        "hidden_size": dims.dim,
        "num_hidden_layers": dims.n_layers,
        "num_attention_heads": dims.n_heads,
        "num_key_value_heads": dims.n_kv_heads,
        "head_dim": dims.head_dim,
        "intermediate_size": dims.hidden_dim,
        "hidden_act": "silu",
        "max_position_embeddings": dims.max_seq_len,
        "rms_norm_eps": dims.norm_eps,
        "rope_theta": dims.rope_theta,
        "rope_scaling": None,
        "tie_word_embeddings": dims.tie_embeddings,
        "torch_dtype": dtype,
    }
    if family == "llama3":
        cfg.update(attention_bias=False, mlp_bias=False)
        if dims.rope_scaling is not None:
            s = dims.rope_scaling
            cfg["rope_scaling"] = {
                "rope_type": "llama3", "factor": s.factor, "low_freq_factor": s.low_freq_factor,
                "high_freq_factor": s.high_freq_factor,
                "original_max_position_embeddings": s.original_max_position_embeddings,
            }
    elif family == "qwen3":
        cfg.update(attention_bias=False, use_sliding_window=False)
    else:
        cfg.update(use_sliding_window=False)
    return cfg
