"""``SkrullConfig``: the ``[skrull]`` section of a job, and what it builds.

The scheduling knobs are ``skrull_ext.scheduler.config.SchedulingOptions``, inherited,
so a knob and its default are declared once for the core and the job file
(lookahead excepted: "auto" here, 1 for a SchedulerConfig).
This adds what only training needs: the on/off switch, the cost model, the
DACP attention's kernel and K/V transport, and debug switches. DP and CP
sizes come from ``[parallelism]``: ``resolve(dp, cp, shape, model_name, timeline,
free_running, bucket_size, lookahead)`` (called by train/settle.py, which
settles the last four) makes the job's one resolved ``SchedulerJob``
(scheduler/job.py), and ``build`` (same arguments) the Scheduler on it.

Values are checked when the config is made, so a bad TOML or CLI value fails
before any process group or model is built, naming the key and what it
allows. The section is plain values: a profile file named by ``cost_model`` is
read once, on first use (``measured_profile``; the job checks ask first), and
what needs it (BucketSize under ``"profile"``, the cost model) is resolved
into the job's ``SchedulerJob`` by ``resolve``.

``cost_model`` names the *hardware* only. The model shape it prices is the
model the job trains (``skrull_ext.scheduler.model_shape.job_shape``: layers, hidden,
K/V width, compute dtype), passed to ``build``; a measured profile carries
its own ``[model]``, which must be that shape (``check_shape``, called when
the trainer starts, before the model is built).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Annotated, ClassVar, Literal

from skrull_ext._core import ModelShape, Timeline
from skrull_ext.attention.kernels import KERNEL_CHOICES, check_kernel
from skrull_ext.attention.transport import TRANSPORT_CHOICES, check_exchange
from skrull_ext.scheduler import cost_model as cost_models
from skrull_ext.scheduler.config import FROM_PROFILE, LOOKAHEAD_AUTO, Lookahead, SchedulerConfig, SchedulingOptions
from skrull_ext.scheduler.job import SchedulerJob
from skrull_ext.scheduler.profile_file import Profile
from skrull_ext.scheduler.profile_memory import ProfileMemory
from skrull_ext.train.job.usage import job_args

FreeRunning = bool | Literal["auto"]
# the mode itself is torchtitan's key; this one says who picks it
ActivationCheckpoint = Annotated[Literal["job", "auto"], "a mode (none, selective, full) is forced with "
                                 "activation_checkpoint.kind and this key left 'job'"]
KVExchange = Literal[TRANSPORT_CHOICES]  # pyrefly: ignore[invalid-literal]
AttentionKernel = Literal[KERNEL_CHOICES]  # pyrefly: ignore[invalid-literal]


@dataclass(kw_only=True, slots=True)
class SkrullConfig(SchedulingOptions):
    enable: bool = True
    """Schedule global batches with Skrull; False runs torchtitan's own batching."""

    cost_model: str = "h100-assumed"
    """The hardware the scheduler prices the job's model on: a hardware preset of
    skrull_ext.scheduler.cost_model (HARDWARE_PRESETS) or a profile TOML path (measured for this
    model; its [model] must be the job's shape). ``bucket_size = "profile"`` takes BucketSize
    from the profile's ``[memory] bucket_size`` (what the offline profiler measured)."""

    check_plan_hash: bool = False
    """Debug: compare every rank's plan digest each step and fail loudly on a mismatch."""

    lookahead: Lookahead = LOOKAHEAD_AUTO
    """Global batches read ahead and regrouped together (docs/design/lookahead.md): "auto" (the
    default) takes the width the job's cost model predicts pays on its first global batches (2, 4
    or 8; 1 if none is predicted 5% faster), said in one log line at start-up; an integer W in
    [1, 1024] sets it (1: every step trains its own global batch). Every sample is trained once,
    at most W - 1 steps from the step it arrived in, with the same loss weight."""

    plan_log: bool = False
    """Append each step's plan and buffer digests to <dump_folder>/skrull_plans/rank<R>.jsonl."""

    defer_grad_sync: bool = False
    """Reduce-scatter FSDP gradients once per step, after the last micro-batch, instead of after
    every micro-batch (torchtitan's behaviour). Saves (micro-batches - 1) gradient collectives per
    step; costs one unsharded gradient per rank held between micro-batches (4 bytes x parameters
    in float32). Same gradient up to float summation order."""

    free_running: FreeRunning = "auto"
    """Hold FSDP parameters unsharded for the whole step: no reshard after forward or backward
    until the rank's last micro-batch, gradients reduce-scattered once, after it. DP ranks then
    run their own micro-batch counts, with no pad passes and no per-micro-batch parameter
    collectives (the plan is timed on the free-running timeline, config.job_timeline). Costs
    the unsharded parameters and gradients on every rank (mixed_precision_param bytes per
    parameter + float32 bytes per trainable one). "auto": whenever a measured profile's [memory]
    says they fit (train/execution.py, which logs the choice and its numbers); true: always,
    refused when they do not fit; false: never. Not with policy skrull-pool."""

    kv_exchange: KVExchange = "auto"
    """How DACP moves the distributed sequences' K/V over the CP group: one all-gather
    (reduce-scatter backward), point-to-point sends ("p2p"), or "auto": by the group's
    backend (skrull_ext.attention.transport.AUTO_BY_BACKEND; measured in docs/benchmarks.md)."""

    attention_kernel: AttentionKernel = "auto"
    """Inner attention of DACP's local and distributed parts (skrull_ext.attention.kernels):
    "auto" (varlen for bf16/fp16 on CUDA, else dense), "dense" (SDPA with dense masks),
    "tiles" (SDPA per tile of at most 64 queries of the segment plan),
    "varlen" (flash attention over the segment plan; CUDA bf16/fp16), "cudnn" and
    "cudnn-expanded" (the local part on cuDNN's ragged attention, K/V heads grouped or repeated
    to the query heads, the distributed part on varlen; CUDA bf16/fp16) or "segments" (the
    plan's slow CPU reference executor)."""

    activation_checkpoint: ActivationCheckpoint = "job"
    """Who picks the activation-checkpointing mode (train/checkpointing.py): "job" (the
    default), the job's [activation_checkpoint] kind; "auto", the mode (none, selective, full)
    with the best predicted step time on the job's first global batches among those the
    measured profile offers, each at its own BucketSize (the memory rule), said in one log
    line at start-up. A profile that measured one mode leaves the job's kind, and says so."""

    _profile: Profile | None = field(default=None, init=False, repr=False, compare=False)
    _ac_mode: str | None = field(default=None, init=False, repr=False, compare=False)
    """The activation-checkpointing mode the job runs (``use_checkpointing``): the profile is read under it."""

    BUCKET_FROM_PROFILE: ClassVar[bool] = True  # bucket_size = "profile": resolved_bucket_size()
    LOOKAHEAD_FROM_DATA: ClassVar[bool] = True  # lookahead = "auto": the trainer chooses (data/steps/lookahead_choice.py)

    def __post_init__(self) -> None:
        # Plain values only: no file is read here (a job file's flags make a new section per
        # change). The profile is read once, when first needed (``measured_profile``).
        if self.cost_model in cost_models.HARDWARE_PRESETS:
            pass
        elif self.cost_model in cost_models.MODEL_PRESETS:
            raise ValueError(
                f"skrull.cost_model: {self.cost_model!r} is a model preset; the shape now comes from the job's "
                f"[model], so name the hardware instead: a preset {sorted(cost_models.HARDWARE_PRESETS)} "
                f"or a profile file"
            )
        elif not Path(self.cost_model).is_file():
            path = Path(self.cost_model)  # a path: say where it was looked for (from the current directory)
            where = f" (no file {str(path.resolve())!r})" if path.suffix == ".toml" or len(path.parts) > 1 else ""
            raise ValueError(
                f"skrull.cost_model: {self.cost_model!r} is neither a hardware preset "
                f"{sorted(cost_models.HARDWARE_PRESETS)} nor a profile file{where}"
            )
        try:
            check_kernel(self.attention_kernel)  # the attention's own checks, named as [skrull] keys
            check_exchange(self.kv_exchange)
            self.check()
        except ValueError as e:
            raise ValueError(f"skrull.{e}") from None
        if self.bucket_size == FROM_PROFILE and self.cost_model in cost_models.HARDWARE_PRESETS:
            raise ValueError(
                f"skrull.bucket_size = {FROM_PROFILE!r} takes BucketSize from a profile file, but skrull.cost_model "
                f"is the hardware preset {self.cost_model!r}; name a profile (python -m skrull_ext.profile writes one)")
        self.check_free_running()
        if self.activation_checkpoint not in ("job", "auto"):
            raise ValueError(f"skrull.activation_checkpoint must be 'job' or 'auto', got {self.activation_checkpoint!r} "
                             "(the mode itself is [activation_checkpoint] kind)")

    def use_checkpointing(self, mode: str) -> None:
        """Read the profile as a job running activation-checkpointing ``mode`` sees it from now on
        (``Profile.under_mode``: its BucketSize, cost model and memory account; the profile as
        measured when it has no per-mode measurement of ``mode``). Set once, at start-up, before
        anything is resolved from the profile (train/checkpointing.py)."""
        self._ac_mode = mode

    @property
    def checkpointing_mode(self) -> str | None:
        """The activation-checkpointing mode the profile is read under (``use_checkpointing``);
        None before one is set (or for a mode no profile measures)."""
        return self._ac_mode

    def check_free_running(self) -> None:
        """``free_running`` with a policy that cannot run it: a ValueError naming both keys.
        skrull-pool shards a sequence over ranks of several DP groups, whose K/V exchange would
        then meet ranks at different passes: one still in its first pass (FSDP's per-layer
        all-gathers over the whole shard mesh) waits for a peer whose first pass is that
        exchange, which waits for the same all-gather: a deadlock."""
        if self.free_running not in (True, False, "auto"):
            raise ValueError(f"skrull.free_running must be true, false or 'auto', got {self.free_running!r}")
        if self.free_running is True and self.policy_spec.pool:
            raise ValueError(
                "skrull.free_running = true does not run with skrull.policy = 'skrull-pool' (its micro-batches "
                "exchange K/V across DP groups, which free-running ranks reach at different passes); use policy "
                "skrull or turn free_running off"
            )

    def measured_profile(self) -> Profile | None:
        """The profile file ``cost_model`` names (None for a hardware preset): the one read of it,
        on first use (``job_checks`` asks first, before any model is built), kept for the path
        it was read from (tyro, torchtitan's launcher, may set ``cost_model`` on a made
        section). A file that is not a profile, or one whose own check failed
        (``refuse_failed``), raises ValueError naming ``skrull.cost_model``: every use of the
        profile (BucketSize, free-running's memory, the plan's prices) goes through here."""
        if self.cost_model in cost_models.HARDWARE_PRESETS:
            return None
        if self._profile is None or self._profile.path != str(Path(self.cost_model)):
            try:
                profile = Profile.load(self.cost_model)
            except ValueError as e:
                raise ValueError(f"skrull.cost_model: {e}") from None
            refuse_failed(profile)
            self._profile = profile
        return self._profile if self._ac_mode is None else self._profile.under_mode(self._ac_mode)

    def measured_memory(self) -> tuple[ProfileMemory | None, str]:
        """(the measured profile's memory model, "") or (None, why there is none: a hardware
        preset, or a profile with no [memory]): what free-running's fit and the chunk of a
        chunked document are checked against."""
        profile = self.measured_profile()
        if profile is None:
            return None, f"skrull.cost_model {self.cost_model!r} is a hardware preset with no measured [memory]"
        try:
            return profile.memory(), ""
        except ValueError as e:
            return None, str(e)

    def resolved_bucket_size(self) -> int:
        """BucketSize in tokens: ``bucket_size`` as written, or under ``"profile"`` the measured
        profile's ``[memory] bucket_size``. The field keeps what the user wrote; the built
        SchedulerConfig holds this integer."""
        if self.bucket_size != FROM_PROFILE:
            return self.bucket_size
        profile = self.measured_profile()
        assert profile is not None, "__post_init__ refuses bucket_size = 'profile' with a hardware preset"
        value = profile.bucket_size
        if value is None:
            raise ValueError(f"skrull.bucket_size = {FROM_PROFILE!r}: the profile {self.cost_model!r} has no "
                             f"[memory] bucket_size")
        return value

    def profile_cp_warning(self, cp: int) -> str | None:
        """A warning when this job takes BucketSize from its profile (``bucket_size =
        "profile"``) at another CP degree than the one it was derived for (a shard
        costs more memory than a whole token: profile_memory.derive_bucket_size), else
        None. A bucket_size the job names is its own: the profile then only prices time."""
        profile = self.measured_profile()
        if profile is None or profile.cp == cp or self.bucket_size != FROM_PROFILE:
            return None
        return (f"skrull: the profile {self.cost_model!r} derived its BucketSize for cp {profile.cp}; this job "
                f"runs cp {cp} (bucket_size {self.resolved_bucket_size()}). Re-profile with the job's parallelism, "
                f"or a rank holding shards may use more memory than the profile predicts")

    def profile_step_note(self, world_size: int | None = None) -> str | None:
        """One line when the cost model has no per-step term (``[step] fixed_us``), naming
        what the job assumes and the command that adds it (``Profile.step_term_note``), on this
        process's job file and flags (usage.job_args) at ``world_size`` ranks."""
        profile = self.measured_profile()
        if profile is None:
            profile = cost_models.hardware(self.cost_model)
        return profile.step_term_note(repr(self.cost_model), job_args(), world_size)

    def profile_compile_warning(self, compiled: bool) -> str | None:
        """A warning when the profile timed the model eager and the job compiles it, or
        the reverse ([meta] compile, written by the profiler), else None. Compile changes
        a layer's time and memory: on one H100 an eager profile priced a compiled
        Qwen2.5-0.5B step at x1/0.69 of what it measured (docs/results/gpu.md)."""
        profile = self.measured_profile()
        if profile is None or "compile" not in profile.meta or bool(profile.meta["compile"]) == compiled:
            return None
        how = {True: "compiled", False: "eager"}
        return (f"skrull: the profile {self.cost_model!r} timed the model {how[bool(profile.meta['compile'])]}; "
                f"this job runs it {how[compiled]} (compile.enable = {str(compiled).lower()}): predicted step "
                f"times and memory will be off. Re-profile with the job's compile setting")

    def profile_kernel_warning(self, whole_buffer: bool) -> str | None:
        """A warning when the profile prices a buffer's attention otherwise than the job's
        kernel computes it (``[compute] whole_buffer``: one masked SDPA over the whole buffer,
        CPU's ``dense``; else per document), else None. The scheduler would then split or pack
        micro-batches for a cost the job does not pay: on the README's job at long buffers, a
        per-document price read x6.6-x8.2 short of whole-buffer steps (docs/profile.md)."""
        profile = self.measured_profile()
        if profile is None or profile.cost_model().whole_buffer == whole_buffer:
            return None
        how = {True: "each buffer whole (one masked SDPA)", False: "per document"}
        return (f"skrull: the profile {self.cost_model!r} prices attention {how[not whole_buffer]}; this job's "
                f"attention_kernel {self.attention_kernel!r} computes it {how[whole_buffer]}: predicted "
                f"micro-batches will be off. Re-profile with the job's kernel")

    def scheduler_config(self, dp: int, cp: int, timeline: str = "lockstep",
                         bucket_size: int | None = None, lookahead: int | None = None) -> SchedulerConfig:
        """These knobs as plain values for a DP x CP job on ``timeline`` (by name), at
        ``bucket_size`` (default: ``resolved_bucket_size``) with windows of ``lookahead``
        (default: the section's width; required when it says "auto", which is not a plain
        value): for tests and tools that pick their own cost model (``Scheduler(config,
        cost_model)``). A job resolves ``resolve``."""
        if lookahead is None and self.lookahead == LOOKAHEAD_AUTO:
            raise ValueError('lookahead = "auto" is not settled: pass the width the data was priced at '
                             "(train/settle.py chooses it for a training job)")
        knobs = {**self.options(), "bucket_size": bucket_size or self.resolved_bucket_size(),
                 "lookahead": lookahead or self.lookahead}
        return SchedulerConfig(dp=dp, cp=cp, timeline=timeline, **knobs)

    def resolve(self, dp: int, cp: int, shape: ModelShape, model_name: str = "the job's model",
                timeline: Timeline = Timeline.LOCKSTEP, free_running: bool = False,
                bucket_size: int | None = None, lookahead: int | None = None,
                chunk_regather: bool = False) -> SchedulerJob:
        """This section resolved for a DP x CP job (the one door from the job file to the
        scheduler): BucketSize as an integer (``bucket_size``, train/execution.py's choice, or
        ``resolved_bucket_size``), the Policy, the job's ``timeline`` (config.job_timeline), its
        execution (``free_running``; ``chunk_regather``: its chunks traced, chunk_path.py), ``shape``
        priced on this hardware for that execution, and the look-ahead width (``lookahead``;
        required when the section says "auto": train/settle.py prices the data to choose it)."""
        return SchedulerJob.of(self, dp=dp, cp=cp, timeline=timeline, free_running=free_running,
                               cost_model=self.build_cost_model(shape, model_name, free_running, chunk_regather),
                               bucket_size=bucket_size or self.resolved_bucket_size(), lookahead=lookahead)

    def build_cost_model(self, shape: ModelShape, model_name: str = "the job's model", free_running: bool = False,
                         chunk_regather: bool = False):
        """``skrull_ext._core.CostModel`` of ``shape`` (the job's model, called
        ``model_name`` in errors) on the hardware ``cost_model`` names, priced for the
        execution the job runs (``free_running``, ``chunk_regather``: Profile.cost_model). A measured
        profile whose [model] is another shape raises ValueError naming both."""
        measured = self.measured_profile()  # its own errors name skrull.cost_model already
        try:
            profile = measured or cost_models.hardware(self.cost_model)
            return profile.cost_model(shape, model_name, free_running=free_running, chunk_regather=chunk_regather)
        except ValueError as e:
            raise ValueError(f"skrull.cost_model: {e}") from None

    def check_shape(self, shape: ModelShape, model_name: str = "the job's model") -> None:
        """Fail (ValueError naming both shapes and what to name instead) when ``cost_model``
        cannot price ``shape``: a shipped job's CPU profile is of the debug model, so the
        same job pointed at a HF folder (``--model.hf_path``) needs another."""
        self.measured_profile()  # not a profile, or a failed one: its own line, no shape advice
        try:
            self.build_cost_model(shape, model_name)
        except ValueError as e:
            raise ValueError(f"{e}; set --skrull.cost_model to a hardware preset {sorted(cost_models.HARDWARE_PRESETS)} "
                             f"or a profile of this model (python -m skrull_ext.profile --config-file JOB.toml "
                             f"[--model.hf_path DIR] --out P.toml)") from None

    def build(self, dp: int, cp: int, shape: ModelShape, model_name: str = "the job's model",
              timeline: Timeline = Timeline.LOCKSTEP, free_running: bool = False, bucket_size: int | None = None,
              lookahead: int | None = None):
        """The Scheduler of ``resolve``'s job (same arguments)."""
        from skrull_ext.scheduler import Scheduler  # CP-SAT (ortools) only when a scheduler is built

        return Scheduler(self.resolve(dp, cp, shape, model_name, timeline, free_running, bucket_size, lookahead))

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.init}


def refuse_failed(profile: Profile) -> None:
    """Raise ValueError (one line: the file, the failed check, how to re-measure) when the
    profiler's own BucketSize check failed (``[meta.check] ok = false``). Such a file is
    written to be looked at: its memory fit did not hold, so neither its BucketSize nor the
    free-running memory account derived from the same fit can be trusted, and a job that
    names its own bucket_size would still plan and choose its execution from it."""
    failed = profile.failed_check()
    if failed is None:
        return
    command = profile.meta.get("command") or "python -m skrull_ext.profile --config-file JOB.toml --out P.toml"
    raise ValueError(f"skrull.cost_model: the profile {profile.path!r} failed its own memory check ({failed}), "
                     f"so a job uses none of it; re-measure it with a lower --memory-limit (or a larger --margin) than "
                     f"it was measured with: {command}")
