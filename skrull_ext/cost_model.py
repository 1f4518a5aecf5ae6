"""Cost-model presets and profile files.

The cost model itself lives in C++ (``skrull_ext._core.CostModel``, see
cpp/include/skrull/cost_model.hpp); this module only builds it: from named
presets (one dict for model shapes, one for hardware) or from a profile
file written by the offline profiler. A profile file is TOML::

    [model]     layers, hidden, kv_width, bytes_per_elem (and an optional name)
    [compute]   a_us_per_flop, b_us
    [comm]      bytes = [...], us = [...]  (optional: threshold_bytes, floor_us,
                collectives_per_layer)
    [memory]    optional: bucket_size, a_bytes_per_token, b_bytes,
                c_bytes_per_token2 (a quadratic term: dense-mask attention),
                cp and kv_bytes_per_token (the CP degree BucketSize was
                derived for, and the gathered K/V a sharded token keeps)
    [meta]      optional: source ("assumed" | "measured"), device, date, ...

Fit-quality keys (r2, max_rel_error, points, held_out_max_rel_error) are
informational; the offline profiler (skrull_ext/profile) writes them.

Unknown sections or keys and missing required keys are errors that name them.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skrull_ext import _core
from skrull_ext._core import CommModel, CostModel, ModelShape

# Model shapes: (layers, hidden h, KV width h_kv = kv_heads * head_dim, bytes).
MODEL_PRESETS: dict[str, ModelShape] = {
    "qwen2.5-0.5b": ModelShape(layers=24, hidden=896, kv_width=128, bytes_per_elem=2),
    "qwen2.5-7b": ModelShape(layers=28, hidden=3584, kv_width=512, bytes_per_elem=2),
    # torchtitan's llama3 debug model (dim 256, 6 layers, 16 heads, no GQA), float32.
    "llama3-debug": ModelShape(layers=6, hidden=256, kv_width=256, bytes_per_elem=4),
}

_MIB = float(1 << 20)

# Published collective latencies on H100 (SKRULL.md), microseconds by message MiB.
H100_COLLECTIVE_US: dict[str, tuple[float, ...]] = {
    "all_gather": (53.29, 72.52, 97.86, 199.3, 286.2, 488.6, 910.6, 1758.4, 3416.4, 6467.9),
    "all_to_all": (80.62, 78.63, 110.9, 163.2, 277.5, 502.4, 939.2, 1803.9, 3411.2, 6629.6),
    "reduce_scatter": (59.48, 79.26, 104.7, 177.4, 269.5, 458.8, 864.3, 1663.9, 3239.5, 6294.3),
    "all_reduce": (84.65, 113.3, 168.4, 312.2, 479.2, 859.7, 1642.9, 3197.9, 6181.2, 12126.0),
}
H100_MESSAGE_MIB = (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


@dataclass(frozen=True)
class Hardware:
    """Compute and communication coefficients of one device kind."""

    a_us_per_flop: float
    b_us: float
    comm_bytes: tuple[float, ...]
    comm_us: tuple[float, ...]
    source: str


# ASSUMED until a profile replaces it: compute at 400 TFLOP/s effective for
# fwd+bwd (3x the forward FLOPs), 30 us of per-call overhead per layer part,
# and the paper's H100 all-gather table.
HARDWARE_PRESETS: dict[str, Hardware] = {
    "h100-assumed": Hardware(
        a_us_per_flop=3.0 / 400e12 * 1e6,
        b_us=30.0,
        comm_bytes=tuple(m * _MIB for m in H100_MESSAGE_MIB),
        comm_us=H100_COLLECTIVE_US["all_gather"],
        source="assumed: SKRULL.md H100 all-gather table, 400 TFLOP/s, 30 us per call",
    ),
}


def preset(model: str = "qwen2.5-0.5b", hardware: str = "h100-assumed") -> CostModel:
    """Cost model of a named model shape on a named hardware preset."""
    if model not in MODEL_PRESETS:
        raise ValueError(f"unknown model preset {model!r}; choose one of {sorted(MODEL_PRESETS)}")
    if hardware not in HARDWARE_PRESETS:
        raise ValueError(f"unknown hardware preset {hardware!r}; choose one of {sorted(HARDWARE_PRESETS)}")
    hw = HARDWARE_PRESETS[hardware]
    shape = MODEL_PRESETS[model]
    return CostModel(
        shape=ModelShape(shape.layers, shape.hidden, shape.kv_width, shape.bytes_per_elem),
        a_us_per_flop=hw.a_us_per_flop,
        b_us=hw.b_us,
        comm=CommModel(bytes=list(hw.comm_bytes), us=list(hw.comm_us)),
    )


_SCHEMA: dict[str, tuple[set[str], set[str]]] = {
    # section: (required keys, optional keys)
    "model": ({"layers", "hidden", "kv_width", "bytes_per_elem"}, {"name"}),
    "compute": ({"a_us_per_flop", "b_us"}, {"r2", "max_rel_error", "points", "held_out_max_rel_error"}),
    "comm": ({"bytes", "us"}, {"threshold_bytes", "floor_us", "collectives_per_layer", "collective", "backend", "world_size",
                               "r2", "max_rel_error", "points"}),
    "memory": (set(), {"bucket_size", "a_bytes_per_token", "b_bytes", "c_bytes_per_token2", "usable_bytes",
                       "static_bytes", "margin", "r2", "max_rel_error", "points", "cp", "kv_bytes_per_token"}),
    "meta": (set(), None),  # free-form provenance
}
_REQUIRED_SECTIONS = ("model", "compute", "comm")


def _check_profile(d: dict[str, Any], where: str) -> None:
    for section in d:
        if section not in _SCHEMA:
            raise ValueError(f"{where}: unknown section [{section}]; allowed: {sorted(_SCHEMA)}")
    for section in _REQUIRED_SECTIONS:
        if section not in d:
            raise ValueError(f"{where}: missing section [{section}]")
    for section, body in d.items():
        required, optional = _SCHEMA[section]
        if not isinstance(body, dict):
            raise ValueError(f"{where}: [{section}] must be a table")
        for key in sorted(required - body.keys()):
            raise ValueError(f"{where}: missing field {section}.{key}")
        if optional is not None:
            for key in body:
                if key not in required | optional:
                    raise ValueError(f"{where}: unknown field {section}.{key}; allowed: {sorted(required | optional)}")


def from_dict(d: dict[str, Any], where: str = "profile") -> CostModel:
    """Cost model from a profile dict (the TOML layout in the module docstring)."""
    _check_profile(d, where)
    m, c, k = d["model"], d["compute"], d["comm"]
    try:
        return CostModel(
            shape=ModelShape(int(m["layers"]), int(m["hidden"]), int(m["kv_width"]), int(m["bytes_per_elem"])),
            a_us_per_flop=float(c["a_us_per_flop"]),
            b_us=float(c["b_us"]),
            comm=CommModel(
                bytes=[float(x) for x in k["bytes"]],
                us=[float(x) for x in k["us"]],
                threshold_bytes=float(k.get("threshold_bytes", 0.0)),
                floor_us=float(k.get("floor_us", 0.0)),
                collectives_per_layer=float(k.get("collectives_per_layer", 2.0)),
            ),
        )
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {e}") from None


def to_dict(cm: CostModel, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """Profile dict of a cost model (inverse of from_dict)."""
    s = cm.shape
    out: dict[str, Any] = {
        "model": {"layers": s.layers, "hidden": s.hidden, "kv_width": s.kv_width, "bytes_per_elem": s.bytes_per_elem},
        "compute": {"a_us_per_flop": cm.a_us_per_flop, "b_us": cm.b_us},
        "comm": {
            "bytes": list(cm.comm.bytes),
            "us": list(cm.comm.us),
            "threshold_bytes": cm.comm.threshold_bytes,
            "floor_us": cm.comm.floor_us,
            "collectives_per_layer": cm.comm.collectives_per_layer,
        },
    }
    if meta:
        out["meta"] = dict(meta)
    return out


def load(path: str | Path) -> CostModel:
    """Cost model from a profile TOML file."""
    path = Path(path)
    with path.open("rb") as f:
        return from_dict(tomllib.load(f), where=str(path))


def resolve(spec: str, model: str = "qwen2.5-0.5b") -> CostModel:
    """A hardware preset name or a profile file path, for config fields."""
    if spec in HARDWARE_PRESETS:
        return preset(model, spec)
    if Path(spec).is_file():
        return load(spec)
    raise ValueError(f"cost model {spec!r} is neither a hardware preset {sorted(HARDWARE_PRESETS)} nor a profile file")


def per_rank_coefficients(a_bytes_per_token: float, c_bytes_per_token2: float, cp: int = 1,
                          kv_bytes_per_token: float = 0.0) -> tuple[float, float]:
    """(a', c') of a rank of the cp group holding tokens whole or as shards: a shard
    also keeps the K/V gathered from the other cp - 1 ranks and (dense CPU mask)
    attends cp times as many keys, so a' = a + (cp - 1) * kv and c' = c * cp."""
    return a_bytes_per_token + (cp - 1) * kv_bytes_per_token, c_bytes_per_token2 * cp


def bucket_size(usable_bytes: float, static_bytes: float, a_bytes_per_token: float, b_bytes: float = 0.0,
                margin: float = 0.05, c_bytes_per_token2: float = 0.0, cp: int = 1,
                kv_bytes_per_token: float = 0.0) -> int:
    """BucketSize C: tokens one rank holds, the largest C with
    a'*C + c'*C^2 <= (usable - static - b) * (1 - margin).

    a and c are measured on whole sequences. With cp > 1 a rank may hold C
    tokens that are all shards of distributed sequences (DACP), and that
    costs more than C whole tokens: it keeps the K/V gathered from the other
    cp - 1 ranks (kv_bytes_per_token each: K and V of every layer), and its
    attention spans cp times as many keys as queries (the dense CPU mask's
    quadratic term; measured in docs/profile.md, "BucketSize in training"). So
    a' = a + (cp - 1) * kv_bytes_per_token and c' = c * cp, the worst case,
    which a rank of whole sequences only undershoots."""
    if not isinstance(cp, int) or cp < 1:
        raise ValueError(f"cp must be an integer >= 1, got {cp!r}")
    if kv_bytes_per_token < 0 or not math.isfinite(kv_bytes_per_token):
        raise ValueError(f"kv_bytes_per_token must be finite and >= 0, got {kv_bytes_per_token}")
    if a_bytes_per_token <= 0 or not math.isfinite(a_bytes_per_token):
        raise ValueError(f"a_bytes_per_token must be finite and > 0, got {a_bytes_per_token}")
    if c_bytes_per_token2 < 0 or not math.isfinite(c_bytes_per_token2):
        raise ValueError(f"c_bytes_per_token2 must be finite and >= 0, got {c_bytes_per_token2}")
    if not 0 <= margin < 1:
        raise ValueError(f"margin must be in [0, 1), got {margin}")
    free = (usable_bytes - static_bytes - b_bytes) * (1.0 - margin)
    if free < a_bytes_per_token + c_bytes_per_token2:
        raise ValueError(
            f"no room for activations: usable {usable_bytes:.3e} B - static {static_bytes:.3e} B - "
            f"fixed {b_bytes:.3e} B leaves less than one token ({a_bytes_per_token:.3e} B)"
        )
    a, c = per_rank_coefficients(a_bytes_per_token, c_bytes_per_token2, cp, kv_bytes_per_token)
    tokens = free / a if c == 0 else 2.0 * free / (a + math.sqrt(a * a + 4.0 * c * free))
    return min(int(tokens), _core.MAX_BUCKET_SIZE)
