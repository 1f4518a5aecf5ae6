"""Profile files: the one place that reads, checks and interprets them.

A profile file is what the offline profiler (skrull_ext/profile) measures
and what the scheduler plans with. TOML::

    [model]     layers, hidden, kv_width, bytes_per_elem (and an optional name)
    [compute]   a_us_per_flop, b_us (optional: attention_weight, the attention
                term's weight against the linear layers'; absent = 1)
    [comm]      bytes = [...], us = [...]  (optional: threshold_bytes, floor_us,
                collectives_per_layer, cross_group_factor: the exchange time
                across CP groups over the same bytes within one, skrull-pool's
                wide sets; absent = 9, NVLink over InfiniBand per GPU;
                plan_margin: the planner decides with every exchange at this
                multiple of its price and prices the plan at 1x, for an
                assumed table; absent = 1, cpp/include/skrull/hedge.hpp)
    [micro_batch] optional: fixed_us, the fixed time of one micro-batch on
                every rank, not per layer (FSDP's parameter all-gathers and
                gradient reduce-scatter, once per micro-batch); absent = 0.
                free_running_fixed_us and free_running_step_us: the same
                loop run free-running (``[skrull] free_running``: parameters
                gathered once, gradients reduced once), its cost per
                micro-batch and the cost the step pays once; absent = priced
                as lockstep (fixed_us per micro-batch, nothing per step).
                token_us: the cost per token outside the layers (head,
                loss); absent = 0.
                Fit keys (r2, max_rel_error, points, counts, method) informational
    [step]      optional: fixed_us, what a step pays once outside its
                micro-batches (gradient clipping and its norm's all-reduce,
                the optimizer and learning-rate step, the per-step checks:
                train/step_phases.py's per-step phases, measured by the
                profiler: profile/step.py); absent = 0, which the job says in
                one line (``Profile.step_term_note``). The cost model's
                ``step_fixed_us`` is fixed_us plus, free-running,
                ``[micro_batch] free_running_step_us``. Informational: the
                phases it sums (checks_us, clip_us, opt_us) and repeats
    [memory]    optional: one rank's memory model and BucketSize, the keys
                of ``MEMORY_KEYS`` (below: what each means, its check, and
                whether reading the model needs it), plus the fit keys
    [activation_checkpoint] optional: the mode [compute] and [memory] were
                measured under and, per mode measured (none, selective,
                full), its compute fit, memory fit and BucketSize
                (checkpointing.py; ``Profile.under_mode``)
    [meta]      optional: source ("assumed" | "measured"), device, date, ...

A *hardware* profile (the assumed H100 shipped in ``hardware/``) leaves out
[model]: the model shape is supplied by the caller, so one hardware file
serves every model. A measured profile carries its own [model] and prices
that shape only; asking it for another shape is an error naming both.

Fit-quality keys (r2, max_rel_error, points, held_out_max_rel_error) are
informational. Unknown sections or keys and missing required keys are
errors that name them. Besides the cost model, a profile gives the memory
model of one rank (``ProfileMemory``) and BucketSize, derived by
``derive_bucket_size`` (docs/design/cost_model.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomllib

from skrull_ext import _core
from skrull_ext._core import CommModel, CostModel, ModelShape
from skrull_ext.scheduler import checkpointing

__all__ = ["MEMORY_KEYS", "MemoryKey", "Profile", "ProfileMemory", "derive_bucket_size", "free_running_bytes",
           "from_dict", "head_bytes", "per_rank_coefficients", "to_dict"]


@dataclass(frozen=True)
class MemoryKey:
    """One key of a profile's ``[memory]`` section. ``MEMORY_KEYS`` is the one list of them: the
    file check (``_check``), the reader (``ProfileMemory.of``, ``Profile.bucket_size``, ``.cp``) and
    the writer (``ProfileMemory.section``) all go through it."""

    key: str
    """The TOML key."""
    field: str
    """``ProfileMemory``'s field for it."""
    doc: str
    """What it means."""
    default: int | float | None = None
    """Its value when absent; None: reading the memory model needs it."""
    integer: bool = False
    """A positive integer (else any number)."""
    written_at_default: bool = True
    """False: the writer leaves it out at its default (a file then reads as it did before the key)."""

    def check(self, value: Any, where: str) -> Any:
        """``value`` as given, or a ValueError naming the key, the value and what it must be."""
        if self.integer:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{where}: memory.{self.key} must be a positive integer, got {value!r}")
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{where}: memory.{self.key} must be a number, got {value!r}")
        return value

    def read(self, table: dict[str, Any], where: str) -> Any:
        """Its checked value in a [memory] table, or its default; a missing needed key is an error."""
        if self.key not in table:
            if self.default is None:
                raise ValueError(f"{where}: missing field memory.{self.key} (needed to check BucketSize)")
            return self.default
        return self.check(table[self.key], where)


MEMORY_KEYS: tuple[MemoryKey, ...] = (
    MemoryKey("bucket_size", "bucket_size", "BucketSize, tokens one rank holds (derive_bucket_size)", integer=True),
    MemoryKey("a_bytes_per_token", "a", "activation bytes per token of whole sequences (the fit's slope)"),
    MemoryKey("b_bytes", "b", "activation bytes of any buffer (the fit's intercept)"),
    MemoryKey("c_bytes_per_token2", "c", "a quadratic term per token squared: dense-mask attention", 0.0),
    MemoryKey("usable_bytes", "usable", "what one rank may use"),
    MemoryKey("static_bytes", "static", "the static account: parameters, gradients, optimizer state, FSDP buffers"),
    MemoryKey("margin", "margin", "the share of the room for activations BucketSize leaves free", 0.0),
    MemoryKey("cp", "cp", "the CP degree BucketSize was derived for (older profiles: 1)", 1, integer=True),
    MemoryKey("kv_bytes_per_token", "kv", "K/V bytes per token a shard keeps from each other CP rank", 0.0),
    MemoryKey("free_running_bytes", "free_running", "the unsharded parameters and gradients of [skrull] "
              "free_running (free_running_bytes) included in static_bytes; 0: measured for a lockstep job", 0.0,
              written_at_default=False),
    MemoryKey("logits_bytes_per_token", "logits", "peak bytes per token of the head and loss ([loss], "
              "train/head_loss.py), outside a_bytes_per_token; 0: older profiles, the logits counted in "
              "a_bytes_per_token", 0.0, written_at_default=False),
    MemoryKey("head_chunk_tokens", "head_chunk", "tokens a chunk of the head and loss BucketSize was derived "
              "with: the logits take logits_bytes_per_token x min(tokens, head_chunk_tokens); 0: older profiles",
              0, integer=True, written_at_default=False),
)
"""The ``[memory]`` keys, in the order the writer puts them."""
_MEMORY = {k.key: k for k in MEMORY_KEYS}
_MEMORY_FIT_KEYS = {"r2", "max_rel_error", "points"}
"""The memory fit's quality, informational (read by no model)."""

_SCHEMA: dict[str, tuple[set[str], set[str] | None]] = {
    # section: (required keys, optional keys; None: free-form)
    "model": ({"layers", "hidden", "kv_width", "bytes_per_elem"}, {"name"}),
    "compute": ({"a_us_per_flop", "b_us"}, {"attention_weight", "r2", "max_rel_error", "points",
                                           "held_out_max_rel_error"}),
    "comm": ({"bytes", "us"}, {"threshold_bytes", "floor_us", "collectives_per_layer", "cross_group_factor",
                               "plan_margin", "collective", "backend",
                               "world_size", "r2", "max_rel_error", "points"}),
    "micro_batch": (set(), {"fixed_us", "r2", "max_rel_error", "points", "counts", "method", "slope_us",
                            "calls_us", "free_running_fixed_us", "free_running_step_us", "free_running_r2",
                            "free_running_max_rel_error", "token_us", "token_points"}),
    "step": (set(), {"fixed_us", "checks_us", "clip_us", "opt_us", "repeats"}),
    "memory": (set(), {k.key for k in MEMORY_KEYS} | _MEMORY_FIT_KEYS),
    checkpointing.SECTION: (set(), None),  # per mode: checkpointing.check_section
    "meta": (set(), None),  # free-form provenance
}
_REQUIRED_SECTIONS = ("compute", "comm")
CROSS_GROUP_FACTOR = 9.0
"""[comm] cross_group_factor when a profile has none: conservative. NVLink (900 GB/s a GPU) over
one InfiniBand NIC a GPU (400 Gb/s, 50 GB/s) is 18x in bandwidth and less where latency
dominates; 9 prices a cross-node exchange until a multi-node profile measures it."""
_SHAPE_KEYS = ("layers", "hidden", "kv_width", "bytes_per_elem")


def _check(d: dict[str, Any], where: str, need_model: bool) -> None:
    for section in d:
        if section not in _SCHEMA:
            raise ValueError(f"{where}: unknown section [{section}]; allowed: {sorted(_SCHEMA)}")
    for section in (*_REQUIRED_SECTIONS, *(("model",) if need_model else ())):
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
    for k in MEMORY_KEYS:
        if k.key in d.get("memory", {}):
            k.check(d["memory"][k.key], where)
    if checkpointing.SECTION in d:
        checkpointing.check_section(d[checkpointing.SECTION], where)


def from_dict(d: dict[str, Any], where: str = "profile", tp: int = 1, free_running: bool = False) -> CostModel:
    """Cost model of a complete profile dict (with its [model] section), pricing one
    rank of a TP group of ``tp`` (the job's degree, not the profile's: ``ModelShape.tp``),
    for the execution the job runs: ``free_running`` prices a micro-batch at
    ``[micro_batch] free_running_fixed_us`` and the step once at ``free_running_step_us``
    (as lockstep where the profile did not measure them)."""
    _check(d, where, need_model=True)
    m, c, k = d["model"], d["compute"], d["comm"]
    mb, step = d.get("micro_batch", {}), d.get("step", {})

    def num(section: str, table: dict, key: str, kind: type = float, default: Any = None) -> Any:
        value = table.get(key, default)
        try:
            if isinstance(value, list):
                return [kind(x) for x in value]
            return kind(value)
        except (TypeError, ValueError):
            raise ValueError(f"[{section}] {key} must be a number, got {value!r}") from None

    try:
        return CostModel(
            shape=ModelShape(*(num("model", m, key, int) for key in _SHAPE_KEYS), tp=tp),
            a_us_per_flop=num("compute", c, "a_us_per_flop"),
            b_us=num("compute", c, "b_us"),
            comm=CommModel(
                bytes=num("comm", k, "bytes"),
                us=num("comm", k, "us"),
                threshold_bytes=num("comm", k, "threshold_bytes", default=0.0),
                floor_us=num("comm", k, "floor_us", default=0.0),
                collectives_per_layer=num("comm", k, "collectives_per_layer", default=2.0),
                cross_group_factor=num("comm", k, "cross_group_factor", default=CROSS_GROUP_FACTOR),
                plan_margin=num("comm", k, "plan_margin", default=1.0),
            ),
            **fixed_costs(mb, free_running, num, step),
            token_us=num("micro_batch", mb, "token_us", default=0.0),
            attention_weight=num("compute", c, "attention_weight", default=1.0),
        )
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {e}") from None


def fixed_costs(mb: dict[str, Any], free_running: bool, num=None,
                step: dict[str, Any] | None = None) -> dict[str, float]:
    """The cost model's fixed costs from a profile's ``[micro_batch]`` and ``[step]``: per
    micro-batch and per step, for lockstep execution or (``free_running``) free-running
    execution. The step pays ``[step] fixed_us`` (outside its micro-batches) either way, and
    free-running also ``free_running_step_us`` (inside them: the first gathers, the one reduction)."""
    if num is None:
        num = lambda section, table, key, default=None: float(table.get(key, default))  # noqa: E731
    lockstep = num("micro_batch", mb, "fixed_us", default=0.0)
    outside = num("step", step or {}, "fixed_us", default=0.0)
    if not free_running or "free_running_fixed_us" not in mb:
        return {"micro_batch_fixed_us": lockstep, "step_fixed_us": outside}
    return {"micro_batch_fixed_us": num("micro_batch", mb, "free_running_fixed_us"),
            "step_fixed_us": outside + num("micro_batch", mb, "free_running_step_us", default=0.0)}


def to_dict(cm: CostModel, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """Profile dict of a cost model (inverse of from_dict)."""
    s = cm.shape
    out: dict[str, Any] = {
        "model": {"layers": s.layers, "hidden": s.hidden, "kv_width": s.kv_width, "bytes_per_elem": s.bytes_per_elem},
        "compute": {"a_us_per_flop": cm.a_us_per_flop, "b_us": cm.b_us,
                    **({"attention_weight": cm.attention_weight} if cm.attention_weight != 1.0 else {})},
        "comm": {
            "bytes": list(cm.comm.bytes),
            "us": list(cm.comm.us),
            "threshold_bytes": cm.comm.threshold_bytes,
            "floor_us": cm.comm.floor_us,
            "collectives_per_layer": cm.comm.collectives_per_layer,
            "cross_group_factor": cm.comm.cross_group_factor,
        },
    }
    if cm.comm.plan_margin != 1.0:
        out["comm"]["plan_margin"] = cm.comm.plan_margin
    if cm.micro_batch_fixed_us:
        out.setdefault("micro_batch", {})["fixed_us"] = cm.micro_batch_fixed_us
    if cm.token_us:
        out.setdefault("micro_batch", {})["token_us"] = cm.token_us
    if cm.step_fixed_us:  # read back as lockstep, which pays exactly [step] fixed_us once
        out["step"] = {"fixed_us": cm.step_fixed_us}
    if meta:
        out["meta"] = dict(meta)
    return out


# --------------------------------------------------------------------------
# Memory: one rank's activation model and BucketSize


def per_rank_coefficients(a_bytes_per_token: float, c_bytes_per_token2: float, cp: int = 1,
                          kv_bytes_per_token: float = 0.0) -> tuple[float, float]:
    """(a', c') of a rank of the cp group holding tokens whole or as shards: a shard
    also keeps the K/V gathered from the other cp - 1 ranks and (dense CPU mask)
    attends cp times as many keys, so a' = a + (cp - 1) * kv and c' = c * cp."""
    return a_bytes_per_token + (cp - 1) * kv_bytes_per_token, c_bytes_per_token2 * cp


def head_bytes(tokens: int, logits_bytes_per_token: float, head_chunk_tokens: int) -> float:
    """Peak bytes of the head and loss ([loss], train/head_loss.py) over ``tokens``: one chunk's
    logits at most, ``logits_bytes_per_token`` each (0 when a profile counts them in ``a``)."""
    if head_chunk_tokens <= 0:
        return 0.0
    return logits_bytes_per_token * min(tokens, head_chunk_tokens)


def derive_bucket_size(usable_bytes: float, static_bytes: float, a_bytes_per_token: float, b_bytes: float = 0.0,
                       margin: float = 0.05, c_bytes_per_token2: float = 0.0, cp: int = 1,
                       kv_bytes_per_token: float = 0.0, logits_bytes_per_token: float = 0.0,
                       head_chunk_tokens: int = 0) -> int:
    """BucketSize C: tokens one rank holds, the largest C with
    a'*C + c'*C^2 <= (usable - static - b) * (1 - margin).

    a and c are measured on whole sequences. With cp > 1 a rank may hold C
    tokens that are all shards of distributed sequences (DACP), and that
    costs more than C whole tokens: it keeps the K/V gathered from the other
    cp - 1 ranks (kv_bytes_per_token each: K and V of every layer), and its
    attention spans cp times as many keys as queries (the dense CPU mask's
    quadratic term). So a' = a + (cp - 1) * kv_bytes_per_token and
    c' = c * cp, the worst case, which a rank of whole sequences only
    undershoots (measured in docs/profile.md, "BucketSize in training").

    The head and loss in chunks of ``head_chunk_tokens`` (train/head_loss.py) hold one
    chunk's logits, ``logits_bytes_per_token`` each, whatever C is: they join b as
    head_chunk_tokens x logits_bytes_per_token when C exceeds a chunk, else they are
    C x logits_bytes_per_token and join a (a BucketSize that never fills a chunk)."""
    if logits_bytes_per_token < 0 or not math.isfinite(logits_bytes_per_token):
        raise ValueError(f"logits_bytes_per_token must be finite and >= 0, got {logits_bytes_per_token}")
    if logits_bytes_per_token > 0 and head_chunk_tokens > 0:
        rest = (usable_bytes, static_bytes)
        tail = (margin, c_bytes_per_token2, cp, kv_bytes_per_token)
        try:
            chunked = derive_bucket_size(*rest, a_bytes_per_token,
                                         b_bytes + head_chunk_tokens * logits_bytes_per_token, *tail)
        except ValueError:  # no room for a whole chunk: BucketSize is below one
            chunked = 0
        if chunked >= head_chunk_tokens:
            return chunked
        return derive_bucket_size(*rest, a_bytes_per_token + logits_bytes_per_token, b_bytes, *tail)
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


def free_running_bytes(params: int, trainable: int, param_bytes: int, grad_bytes: int, model_shards: int = 1) -> float:
    """What ``[skrull] free_running`` adds to a rank's static memory: every parameter
    unsharded (``param_bytes`` each: FSDP's mixed_precision_param) and every trainable
    parameter's unsharded gradient (``grad_bytes``: FSDP accumulates an unsynchronised
    gradient in its reduce dtype, float32 in torchtitan 0.3.0, when that is wider than the
    parameter's), held from the step's first forward to its last backward. A frozen
    parameter (a LoRA base) has no gradient. ``model_shards``: TP x PP, which FSDP does not
    unshard. The sharded parameters, gradients and optimizer state stay as they are."""
    return (params * param_bytes + trainable * grad_bytes) / model_shards


@dataclass(frozen=True)
class ProfileMemory:
    """A profile file's [memory] section: what it predicts for one rank. One field per key of
    ``MEMORY_KEYS`` (``MemoryKey.field``), which says what each means."""

    bucket_size: int
    a: float
    b: float
    c: float
    usable: float
    static: float
    margin: float
    cp: int = _MEMORY["cp"].default
    kv: float = _MEMORY["kv_bytes_per_token"].default
    free_running: float = _MEMORY["free_running_bytes"].default
    logits: float = _MEMORY["logits_bytes_per_token"].default
    head_chunk: int = _MEMORY["head_chunk_tokens"].default

    @classmethod
    def of(cls, profile: dict) -> ProfileMemory:
        """The [memory] section of a profile dict, each key read by ``MEMORY_KEYS``."""
        m = profile.get("memory")
        if m is None:
            raise ValueError("profile: missing section [memory] (needed to check BucketSize)")
        return cls(**{k.field: k.read(m, "profile") for k in MEMORY_KEYS})

    def section(self) -> dict[str, Any]:
        """This model as a profile's [memory] table (the fit keys aside), inverse of ``of``."""
        return {k.key: getattr(self, k.field) for k in MEMORY_KEYS
                if k.written_at_default or getattr(self, k.field) != k.default}

    def activation(self, tokens: int) -> float:
        """The fit: activation bytes of a buffer of ``tokens`` whole sequences."""
        return self.b + self.a * tokens + self.c * tokens * tokens + head_bytes(tokens, self.logits, self.head_chunk)

    def activation_any(self, tokens: int) -> float:
        """Activation bytes of ``tokens`` on a rank of the cp group, whole or
        shards (the worst case derive_bucket_size derives BucketSize for)."""
        a, c = per_rank_coefficients(self.a, self.c, self.cp, self.kv)
        return self.b + a * tokens + c * tokens * tokens + head_bytes(tokens, self.logits, self.head_chunk)

    def budget(self, tokens: int) -> float:
        """All a rank holding ``tokens`` may use: static account + activation fit
        grown by the margin BucketSize was derived with (<= usable up to BucketSize)."""
        return self.static + self.activation_any(tokens) / (1.0 - self.margin)

    def free_running_need(self, unsharded: float, tokens: int) -> float:
        """All a free-running rank holding ``tokens`` may use: ``budget`` with the static
        account's own free-running share (if any) replaced by ``unsharded`` bytes."""
        return self.budget(tokens) - self.free_running + unsharded

    def free_running_bucket_size(self, unsharded: float) -> int:
        """The largest BucketSize whose ``free_running_need`` fits ``usable`` (0: none does):
        ``derive_bucket_size`` with the unsharded parameters and gradients in the static account."""
        try:
            return derive_bucket_size(self.usable, self.static - self.free_running + unsharded, self.a, self.b,
                                      self.margin, self.c, self.cp, self.kv, self.logits, self.head_chunk)
        except ValueError:
            return 0


# --------------------------------------------------------------------------
# The file


@dataclass(frozen=True)
class Profile:
    """One profile file, read and checked once; everything else is derived from it."""

    data: dict[str, Any]
    path: str = "profile"

    def __post_init__(self) -> None:
        _check(self.data, self.path, need_model=False)

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"profile {str(path)!r} is not a file")
        try:
            with path.open("rb") as f:
                data = tomllib.load(f)
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"{path}: not valid TOML: {e}") from None
        return cls(data, str(path))

    def with_plan_margin(self, margin: float) -> Profile:
        """This profile planning with another ``[comm] plan_margin`` (``bench simulate
        --plan-margin``: what the hedge costs or buys on a batch mix); checked where priced."""
        data = {**self.data, "comm": {**self.data["comm"], "plan_margin": margin}}
        return Profile(data, self.path)

    @property
    def checkpointing_modes(self) -> dict[str, checkpointing.ModeCost]:
        """Each activation-checkpointing mode it measured ({}: only the one of [compute] and [memory])."""
        return checkpointing.modes_of(self.data)

    @property
    def measured_checkpointing(self) -> str | None:
        """The mode its [compute] and [memory] were measured under (None: it does not say)."""
        return checkpointing.measured_mode(self.data)

    def under_mode(self, mode: str) -> Profile:
        """This profile as a job running activation-checkpointing ``mode`` sees it (its BucketSize,
        cost model and memory account that mode's: checkpointing.under_mode); itself when the
        profile has no per-mode measurement of ``mode``."""
        if mode not in self.checkpointing_modes:
            return self
        return Profile(checkpointing.under_mode(self.data, mode), self.path)

    @property
    def has_model(self) -> bool:
        return "model" in self.data

    @property
    def meta(self) -> dict[str, Any]:
        return self.data.get("meta", {})

    @property
    def label(self) -> str:
        """Short provenance for tables and plots, e.g. 'assumed: h100_assumed.toml, planned at
        1.5x the exchange' (the plan margin, where it is not 1: the figures' plans are hedged)."""
        margin = self.data["comm"].get("plan_margin", 1.0)
        hedge = f", planned at {margin:g}x the exchange" if margin != 1.0 else ""
        return f"{self.meta.get('source', 'unknown source')}: {Path(self.path).name}{hedge}"

    def cost_model(self, shape: ModelShape | None = None, name: str = "the model priced",
                   free_running: bool = False) -> CostModel:
        """The core's cost model. ``shape`` (called ``name`` in errors): the model
        to price; a hardware profile (no [model]) needs it, a measured one
        accepts only its own. ``free_running``: priced for free-running execution
        (``from_dict``)."""
        d = dict(self.data)
        if shape is not None:
            want = {k: getattr(shape, k) for k in _SHAPE_KEYS}
            if self.has_model:
                got = {k: d["model"].get(k) for k in _SHAPE_KEYS}
                if got != want:
                    raise ValueError(f"{self.path}: its [model] {got} is not the shape of {name} {want}")
            else:
                d["model"] = want
        elif not self.has_model:
            raise ValueError(f"{self.path}: a hardware profile (no [model]) needs the model shape to price")
        return from_dict(d, where=self.path, tp=1 if shape is None else shape.tp, free_running=free_running)

    @property
    def bucket_size(self) -> int | None:
        """BucketSize from [memory] (a measured profile has one; checked when read), else None."""
        return self.data.get("memory", {}).get("bucket_size")

    @property
    def cp(self) -> int:
        """The CP degree its BucketSize was derived for (``MEMORY_KEYS``' default if it does not say)."""
        return _MEMORY["cp"].read(self.data.get("memory", {}), self.path)

    @property
    def step_fixed_us(self) -> float | None:
        """``[step] fixed_us``, what a step pays outside its micro-batches; None: not measured."""
        value = self.data.get("step", {}).get("fixed_us")
        return None if value is None else float(value)

    def step_term_note(self, name: str) -> str | None:
        """One line when the profile has no per-step term (``[step] fixed_us``): what the job
        assumes (0) and the command that adds it (its own, from ``[meta] command``, for a
        measured profile); None when it has one. ``name``: how the job names the profile."""
        if self.step_fixed_us is not None:
            return None
        command = self.meta.get("command")
        if isinstance(command, str) and command.startswith("python -m skrull_ext.profile"):
            world = int(self.meta.get("world_size", 1) or 1)
            if world > 1:
                command = command.replace("python -m", f"torchrun --standalone --nproc_per_node {world} -m", 1)
            how = f"re-profile: {command}"
        else:
            how = ("measure this machine: torchrun --standalone --nproc_per_node <ranks> -m skrull_ext.profile "
                   "--config-file <this job's file> --out <profile.toml> (docs/profile.md)")
        return (f"skrull: the cost model {name} has no [step] fixed_us (the step's time outside its micro-batches: "
                "clipping, optimizer, checks); predicted steps assume 0 there, so measured/predicted reads the "
                f"whole step against its micro-batches only. To add it, {how}")

    def failed_check(self) -> str | None:
        """What the profiler's own BucketSize check found, when it failed (``[meta.check]
        ok = false``: a buffer of BucketSize tokens measured over the budget, or over the
        fit), in one clause; None when it passed or was not run. The profiler still writes
        such a file, to look at, so whoever takes BucketSize from it must ask."""
        check = self.meta.get("check")
        if not isinstance(check, dict) or check.get("ok", True) is not False:
            return None
        mib = lambda key: f"{float(check.get(key, float('nan'))) / 2**20:.1f} MiB"  # noqa: E731
        budget = f" against an activation budget of {mib('activation_budget')}" if check.get("fits") is False else ""
        fit = f" (the memory fit predicted {mib('predicted_activation')})" if check.get("fit_holds") is False else ""
        return (f"[meta.check] ok = false: a buffer of its BucketSize, {check.get('tokens', '?')} tokens, peaked at "
                f"{mib('measured_peak')}{budget}{fit}")

    def memory(self) -> ProfileMemory:
        """Its [memory] model (an error naming the missing key if incomplete)."""
        try:
            return ProfileMemory.of(self.data)
        except ValueError as e:
            raise ValueError(f"{self.path}: {str(e).removeprefix('profile: ')}") from None
