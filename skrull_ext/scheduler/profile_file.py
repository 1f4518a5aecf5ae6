"""Profile files: the one place that reads, checks and interprets them.

A profile file is what the offline profiler (skrull_ext/profile) measures
and what the scheduler plans with. TOML::

    [model]     layers, hidden, kv_width, bytes_per_elem (and an optional name)
    [compute]   a_us_per_flop, b_us (optional: attention_weight, the attention
                term's weight against the linear layers'; absent = 1;
                whole_buffer, true where the profiled kernel attends over a
                rank's buffer whole, the CPU's dense SDPA: each part of a
                buffer then priced as one sequence of its length, not per
                document; absent = false, per document as a varlen kernel;
                host_floor_us, the host floor of one layer call: a call
                costs max(host_floor_us, a F + b), written by the profiler
                where its fit found a floor, docs/profile.md "The host
                floor"; absent = 0, the line alone)
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
model of one rank (``ProfileMemory``, profile_memory.py) and BucketSize
(docs/design/cost_model.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomllib

from skrull_ext._core import CommModel, CostModel, ModelShape
from skrull_ext.scheduler import checkpointing
from skrull_ext.scheduler.profile_memory import _MEMORY, MEMORY_KEYS, ProfileMemory

__all__ = ["Profile", "from_dict", "to_dict"]


_MEMORY_FIT_KEYS = {"r2", "max_rel_error", "points"}
"""The memory fit's quality, informational (read by no model)."""

_SCHEMA: dict[str, tuple[set[str], set[str] | None]] = {
    # section: (required keys, optional keys; None: free-form)
    "model": ({"layers", "hidden", "kv_width", "bytes_per_elem"}, {"name"}),
    "compute": ({"a_us_per_flop", "b_us"}, {"attention_weight", "whole_buffer", "host_floor_us", "r2", "max_rel_error", "points",
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
    sizes, times = d["comm"].get("bytes"), d["comm"].get("us")
    if isinstance(sizes, list) and isinstance(times, list) and len(sizes) != len(times):
        # the file's own fault: named here, not when a job prices its model (as a shape mismatch)
        raise ValueError(f"{where}: comm.bytes and comm.us differ in length ({len(sizes)} vs {len(times)}); "
                         "[comm] holds one time per message size")
    for k in MEMORY_KEYS:
        if k.key in d.get("memory", {}):
            k.check(d["memory"][k.key], where)
    if checkpointing.SECTION in d:
        checkpointing.check_section(d[checkpointing.SECTION], where)


def from_dict(d: dict[str, Any], where: str = "profile", tp: int = 1, free_running: bool = False,
              chunk_regather: bool = False) -> CostModel:
    """Cost model of a complete profile dict (with its [model] section), pricing one
    rank of a TP group of ``tp`` (the job's degree, not the profile's: ``ModelShape.tp``),
    for the execution the job runs: ``free_running`` prices a micro-batch at
    ``[micro_batch] free_running_fixed_us`` and the step once at ``free_running_step_us``
    (as lockstep where the profile did not measure them); ``chunk_regather``: a checkpointed
    chunk's recompute gathers its K/V again (a compiled job's traced chunks: CostModel.chunk_regather)."""
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
            whole_buffer=_flag("compute", c, "whole_buffer"),
            host_floor_us=num("compute", c, "host_floor_us", default=0.0),
            chunk_regather=chunk_regather,
        )
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {e}") from None


def _flag(section: str, table: dict, key: str) -> bool:
    """A true/false key, absent = false (a number is refused: 1 is not a TOML boolean)."""
    value = table.get(key, False)
    if not isinstance(value, bool):
        raise ValueError(f"[{section}] {key} must be true or false, got {value!r}")
    return value


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
                    **({"attention_weight": cm.attention_weight} if cm.attention_weight != 1.0 else {}),
                    **({"whole_buffer": True} if cm.whole_buffer else {}),
                    **({"host_floor_us": cm.host_floor_us} if cm.host_floor_us else {})},
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
        except UnicodeDecodeError as e:  # it said only "'utf-8' codec can't decode byte 0xff ...", no file
            raise ValueError(f"{path}: not a profile: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset "
                             f"{e.start}); a profile is the TOML python -m skrull_ext.profile writes") from None
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
                   free_running: bool = False, chunk_regather: bool = False) -> CostModel:
        """The core's cost model. ``shape`` (called ``name`` in errors): the model
        to price; a hardware profile (no [model]) needs it, a measured one
        accepts only its own. ``free_running``, ``chunk_regather``: the execution
        priced (``from_dict``)."""
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
        return from_dict(d, where=self.path, tp=1 if shape is None else shape.tp, free_running=free_running,
                         chunk_regather=chunk_regather)

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

    def step_term_note(self, name: str, job: str = "--config-file <this job's file>",
                       ranks: int | None = None) -> str | None:
        """One line when the profile has no per-step term (``[step] fixed_us``): what the job
        assumes (0) and the command that adds it (its own, from ``[meta] command``, for a
        measured profile); None when it has one. ``name``: how the job names the profile;
        ``job``: the job's file and flags, ``ranks`` its world size, for the command that measures
        a preset's machine."""
        if self.step_fixed_us is not None:
            return None
        command = self.meta.get("command")
        if isinstance(command, str) and command.startswith("python -m skrull_ext.profile"):
            world = int(self.meta.get("world_size", 1) or 1)
            if world > 1:
                command = command.replace("python -m", f"torchrun --standalone --nproc_per_node {world} -m", 1)
            how = f"re-profile: {command}"
        else:
            launcher = ("python -m" if ranks == 1
                        else f"torchrun --standalone --nproc_per_node {ranks or '<ranks>'} -m")
            how = f"measure this machine: {launcher} skrull_ext.profile {job} --out <profile.toml> (docs/profile.md)"
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
