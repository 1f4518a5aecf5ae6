"""Cost models by name: model-shape presets on a hardware profile.

The cost model itself lives in C++ (``skrull_ext._core.CostModel``, see
cpp/include/skrull/cost_model.hpp); profile files, measured or assumed, are
read by ``skrull_ext.scheduler.profile_file``. This module names what a config may
ask for without a file: a model shape (``MODEL_PRESETS``) priced on a
hardware profile (``HARDWARE_PRESETS``, today only the assumed H100, whose
figures live in ``hardware/h100_assumed.toml`` and nowhere else).
"""

from __future__ import annotations

from pathlib import Path

from skrull_ext._core import CostModel, ModelShape
from skrull_ext.scheduler.profile_file import Profile

# Model shapes: (layers, hidden h, KV width h_kv = kv_heads * head_dim, bytes).
MODEL_PRESETS: dict[str, ModelShape] = {
    "qwen2.5-0.5b": ModelShape(layers=24, hidden=896, kv_width=128, bytes_per_elem=2),
    "qwen2.5-7b": ModelShape(layers=28, hidden=3584, kv_width=512, bytes_per_elem=2),
    # torchtitan's llama3 debug model (dim 256, 6 layers, 16 heads, no GQA), float32.
    "llama3-debug": ModelShape(layers=6, hidden=256, kv_width=256, bytes_per_elem=4),
}

HARDWARE_PRESETS: dict[str, Path] = {
    "h100-assumed": Path(__file__).parent / "hardware" / "h100_assumed.toml",
}
"""Hardware profiles (no [model] section) a preset prices a model shape on."""


def hardware(name: str = "h100-assumed") -> Profile:
    """The hardware profile called ``name``."""
    if name not in HARDWARE_PRESETS:
        raise ValueError(f"unknown hardware preset {name!r}; choose one of {sorted(HARDWARE_PRESETS)}")
    return Profile.load(HARDWARE_PRESETS[name])


def shape(model: str) -> ModelShape:
    """The model shape called ``model``."""
    if model not in MODEL_PRESETS:
        raise ValueError(f"unknown model preset {model!r}; choose one of {sorted(MODEL_PRESETS)}")
    return MODEL_PRESETS[model]


def preset(model: str = "qwen2.5-0.5b", hardware_name: str = "h100-assumed") -> CostModel:
    """Cost model of a named model shape on a named hardware preset."""
    return hardware(hardware_name).cost_model(shape(model), repr(model))


def load(path: str | Path) -> CostModel:
    """Cost model of a measured profile file (with its own [model])."""
    return Profile.load(path).cost_model()
