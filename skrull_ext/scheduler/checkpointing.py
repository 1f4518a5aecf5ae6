"""A profile's activation-checkpointing modes: what each costs in time and memory.

Activation checkpointing trades memory for time: a checkpointed block keeps
fewer activations for backward (a larger BucketSize, fewer sequences
sharded) and recomputes them in backward (a slower layer). The profiler
(skrull_ext/profile, ``--ac-modes``) measures each mode it offers, torchtitan
0.3.0's ``[activation_checkpoint] kind`` ``none``, ``selective`` and
``full``, and writes per mode the compute fit (forward+backward of a layer
with that mode, as ``[compute]``) and the memory fit with the BucketSize it
gives (as ``[memory]``)::

    [activation_checkpoint]
    measured = "none"             # the mode [compute] and [memory] were measured under (the job's)
    [activation_checkpoint.selective]
    a_us_per_flop = ...           # [compute]'s keys: the layer's time under this mode
    b_us = ...
    attention_weight = ...        # optional, absent = 1
    host_floor_us = ...           # optional, absent = 0 (no host floor under this mode)
    a_bytes_per_token = ...       # [memory]'s keys: the activation fit under this mode
    b_bytes = ...
    c_bytes_per_token2 = ...      # optional, absent = 0
    bucket_size = ...             # derive_bucket_size of this fit, the static account and margin of [memory]

``under_mode`` gives the profile as a job that runs one mode sees it: the
mode's keys in place of ``[compute]``'s and ``[memory]``'s, everything else
(communication, fixed costs, the static account) as measured, so the
BucketSize, the cost model and the free-running account all follow the mode.
A profile without the section prices the one mode it was measured with.
Which mode a job runs is chosen in train/checkpointing.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["COMPUTE_KEYS", "MEMORY_KEYS", "MODES", "ModeCost", "SECTION", "check_section", "measured_mode",
           "modes_of", "section", "under_mode"]

SECTION = "activation_checkpoint"
"""The profile's section: named as torchtitan's config field is."""
MODES: tuple[str, ...] = ("none", "selective", "full")
"""The modes measured and chosen among, least recompute first (the order ties are broken in)."""
COMPUTE_KEYS: dict[str, float | None] = {"a_us_per_flop": None, "b_us": None, "attention_weight": 1.0,
                                         "host_floor_us": 0.0}
"""A mode's [compute] keys and their defaults (None: required)."""
MEMORY_KEYS: dict[str, float | None] = {"a_bytes_per_token": None, "b_bytes": None, "c_bytes_per_token2": 0.0,
                                        "bucket_size": None}
"""A mode's [memory] keys and their defaults (None: required)."""


@dataclass(frozen=True)
class ModeCost:
    """One mode as the profile measured it."""

    mode: str
    a_us_per_flop: float
    b_us: float
    attention_weight: float
    a_bytes_per_token: float
    b_bytes: float
    c_bytes_per_token2: float
    bucket_size: int
    host_floor_us: float = 0.0

    def keys(self) -> dict[str, Any]:
        """Its subtable of the profile's section (attention_weight and c left out at their defaults)."""
        out = {k: getattr(self, k) for k in (*COMPUTE_KEYS, *MEMORY_KEYS)}
        for k, default in (*COMPUTE_KEYS.items(), *MEMORY_KEYS.items()):
            if default is not None and out[k] == default:
                del out[k]
        return out


def _number(value: Any, key: str, where: str, integer: bool = False) -> float | int:
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)) or value < 0 \
            or (integer and value < 1):
        what = "a positive integer" if integer else "a number >= 0"
        raise ValueError(f"{where}: {SECTION}.{key} must be {what}, got {value!r}")
    return value


def check_section(body: Any, where: str) -> None:
    """A ValueError naming the key when the profile's ``[activation_checkpoint]`` is malformed:
    an unknown mode or key, a missing key, a value of the wrong kind."""
    if not isinstance(body, dict):
        raise ValueError(f"{where}: [{SECTION}] must be a table")
    for key, value in body.items():
        if key == "measured":
            if value not in MODES:
                raise ValueError(f"{where}: {SECTION}.measured: {value!r} is not one of {list(MODES)}")
            continue
        if key not in MODES:
            raise ValueError(f"{where}: unknown field {SECTION}.{key}; allowed: measured and the modes {list(MODES)}")
        if not isinstance(value, dict):
            raise ValueError(f"{where}: [{SECTION}.{key}] must be a table")
        allowed = {**COMPUTE_KEYS, **MEMORY_KEYS}
        for k in value:
            if k not in allowed:
                raise ValueError(f"{where}: unknown field {SECTION}.{key}.{k}; allowed: {sorted(allowed)}")
        for k, default in allowed.items():
            if k not in value:
                if default is None:
                    raise ValueError(f"{where}: missing field {SECTION}.{key}.{k}")
                continue
            _number(value[k], f"{key}.{k}", where, integer=k == "bucket_size")
        if value["a_bytes_per_token"] <= 0:
            raise ValueError(f"{where}: {SECTION}.{key}.a_bytes_per_token must be > 0, got {value['a_bytes_per_token']}")


def modes_of(data: dict[str, Any]) -> dict[str, ModeCost]:
    """The modes a (checked) profile dict measured, in ``MODES`` order; {} without the section."""
    body = data.get(SECTION, {})
    out = {}
    for mode in MODES:
        if mode in body:
            t = body[mode]
            out[mode] = ModeCost(mode, **{k: float(t.get(k, d if d is not None else 0.0))
                                          for k, d in (*COMPUTE_KEYS.items(), *MEMORY_KEYS.items())
                                          if k != "bucket_size"}, bucket_size=int(t["bucket_size"]))
    return out


def measured_mode(data: dict[str, Any]) -> str | None:
    """The mode the profile's [compute] and [memory] were measured under (None: it does not say)."""
    return data.get(SECTION, {}).get("measured")


def section(modes: dict[str, ModeCost], measured: str) -> dict[str, Any]:
    """The profile's ``[activation_checkpoint]`` table of ``modes`` (inverse of ``modes_of``)."""
    return {"measured": measured, **{m: modes[m].keys() for m in MODES if m in modes}}


def under_mode(data: dict[str, Any], mode: str) -> dict[str, Any]:
    """A profile dict as a job running ``mode`` sees it: the mode's compute and memory keys in
    [compute] and [memory] (fit-quality keys of the measured mode dropped), ``measured`` set to
    it; a KeyError when it was not measured. (The measured mode's table repeats [compute]'s and
    [memory]'s values, so reading it under that mode changes no number.)"""
    cost = modes_of(data)[mode]
    compute = {k: v for k, v in data["compute"].items() if k not in ("r2", "max_rel_error", "held_out_max_rel_error")}
    compute.update(a_us_per_flop=cost.a_us_per_flop, b_us=cost.b_us)
    for key, default in (("attention_weight", 1.0), ("host_floor_us", 0.0)):
        if getattr(cost, key) != default:
            compute[key] = getattr(cost, key)
        else:
            compute.pop(key, None)
    memory = {k: v for k, v in data.get("memory", {}).items() if k not in ("r2", "max_rel_error")}
    memory.update(a_bytes_per_token=cost.a_bytes_per_token, b_bytes=cost.b_bytes,
                  c_bytes_per_token2=cost.c_bytes_per_token2, bucket_size=cost.bucket_size)
    return {**data, "compute": compute, "memory": memory, SECTION: {**data[SECTION], "measured": mode}}
