"""Hardware profiles for the simulator: explicit TOML data, not code.

A hardware profile uses the profile layout of ``skrull_ext.cost_model``
([compute], [comm], optional [memory] and [meta]) and may leave out
[model]: the simulator fills it from ``MODEL_PRESETS`` so one hardware file
serves every model. A profile that carries its own [model] (a measured one
from the offline profiler) is used as is for that model only.

The shipped default, ``profiles/h100_assumed.toml``, is the assumed H100 of
SKRULL.md; every result made with it is labelled "assumed".
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from skrull_ext import cost_model as cost_models
from skrull_ext._core import CostModel

DEFAULT_PROFILE = Path(__file__).parent / "profiles" / "h100_assumed.toml"


def load_profile(path: str | Path | None = None) -> dict[str, Any]:
    """The profile dict of a TOML file (the assumed H100 one by default)."""
    path = Path(path) if path is not None else DEFAULT_PROFILE
    if not path.is_file():
        raise ValueError(f"hardware profile {str(path)!r} is not a file")
    with path.open("rb") as f:
        profile = tomllib.load(f)
    profile.setdefault("meta", {}).setdefault("path", str(path))
    return profile


def bucket_size(profile: dict[str, Any]) -> int | None:
    """BucketSize from the profile's [memory] section (a measured profile has one), else None.

    The assumed H100 file has none: BucketSize depends on the model, and the
    paper's values per model live in skrull_ext/sim/scenarios.py.
    """
    value = profile.get("memory", {}).get("bucket_size")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{profile.get('meta', {}).get('path', 'profile')}: memory.bucket_size must be a "
                         f"positive integer, got {value!r}")
    return value


def label(profile: dict[str, Any]) -> str:
    """Short provenance string for tables and plots, e.g. 'assumed: h100_assumed.toml'."""
    meta = profile.get("meta", {})
    return f"{meta.get('source', 'unknown source')}: {Path(meta.get('path', '?')).name}"


def cost_model(profile: dict[str, Any], model: str) -> CostModel:
    """The core's cost model of `model` (a MODEL_PRESETS name) on this hardware.

    A profile with its own [model] section describes one measured model: it
    is accepted only when that shape equals the preset's, so a 0.5B profile
    cannot silently price a 7B run.
    """
    if model not in cost_models.MODEL_PRESETS:
        raise ValueError(f"unknown model {model!r}; choose one of {sorted(cost_models.MODEL_PRESETS)}")
    shape = cost_models.MODEL_PRESETS[model]
    want = {"layers": shape.layers, "hidden": shape.hidden, "kv_width": shape.kv_width,
            "bytes_per_elem": shape.bytes_per_elem}
    d = dict(profile)
    where = d.get("meta", {}).get("path", "profile")
    if "model" in d:
        got = {k: d["model"].get(k) for k in want}
        if got != want:
            raise ValueError(f"{where}: its [model] {got} is not the shape of {model!r} {want}")
    else:
        d["model"] = want
    return cost_models.from_dict(d, where=where)
