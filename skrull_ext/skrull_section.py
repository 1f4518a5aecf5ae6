"""The ``[skrull]`` section of a job: how Skrull schedules each global batch.

It carries the scheduler core's knobs (``skrull_ext.config.SchedulerConfig``,
whose registries it reuses, so a new policy needs no change here) minus the
DP/CP sizes, which come from ``[parallelism]``, plus what only training
needs: the on/off switch, the cost model and the plan-hash check. Values are
checked here, so a bad TOML or CLI value fails before any process group or
model is built, naming the key and what it allows.
"""

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Literal

from skrull_ext import cost_model as cost_models
from skrull_ext.attention.kernels import KERNEL_CHOICES
from skrull_ext.attention.transport import TRANSPORTS
from skrull_ext.config import OVERLENGTH, POLICIES, SchedulerConfig

Policy = Literal[tuple(POLICIES)]  # pyrefly: ignore[invalid-literal]
Overlength = Literal[tuple(OVERLENGTH)]  # pyrefly: ignore[invalid-literal]
KVExchange = Literal[("auto", *TRANSPORTS)]  # pyrefly: ignore[invalid-literal]
AttentionKernel = Literal[tuple(KERNEL_CHOICES)]  # pyrefly: ignore[invalid-literal]


@dataclass(kw_only=True, slots=True)
class SkrullSection:
    enable: bool = True
    """Schedule global batches with Skrull; False runs torchtitan's own batching."""

    policy: Policy = "skrull"
    """Scheduling policy (skrull_ext.config.POLICIES)."""

    bucket_size: int = 26624
    """Tokens one CP rank may hold per micro-batch (the paper's BucketSize C). 0: the
    ``[memory] bucket_size`` of the profile file named by ``cost_model`` (what the offline
    profiler measured for this model and machine)."""

    cost_model: str = "qwen2.5-0.5b"
    """A model preset of skrull_ext.cost_model (on the h100-assumed profile), or a profile TOML path."""

    cpsat: bool = True
    """Allow the CP-SAT fallback (only policies that use it)."""

    cpsat_margin: float = 0.10
    """Re-solve a micro-batch with CP-SAT when predicted this fraction above its lower bound."""

    cpsat_deterministic_time: float = 0.005
    """CP-SAT limit in deterministic seconds (the same answer on every rank, unlike wall time)."""

    overlength: Overlength = "error"
    """Sequences longer than bucket_size * cp: fail, truncate to fit, or drop them."""

    check_plan_hash: bool = False
    """Debug: compare every rank's plan digest each step and fail loudly on a mismatch."""

    plan_log: bool = False
    """Append each step's plan and buffer digests to <dump_folder>/skrull_plans/rank<R>.jsonl."""

    defer_grad_sync: bool = False
    """Reduce-scatter FSDP gradients once per step, after the last micro-batch, instead of after
    every micro-batch (torchtitan's behaviour). Saves (micro-batches - 1) gradient collectives per
    step; costs one unsharded gradient per rank held between micro-batches (4 bytes x parameters
    in float32). Same gradient up to float summation order."""

    kv_exchange: KVExchange = "auto"
    """How DACP moves the distributed sequences' K/V over the CP group: one all-gather
    (reduce-scatter backward), point-to-point sends ("p2p"), or "auto": p2p on gloo, where
    it measured faster (docs/benchmarks.md, section 7), all_gather elsewhere."""

    attention_kernel: AttentionKernel = "auto"
    """Inner attention of DACP's local and distributed parts (skrull_ext.attention.kernels):
    "auto" (varlen for bf16/fp16 on CUDA, else dense), "dense" (SDPA with dense masks),
    "varlen" (flash attention over the segment plan; CUDA bf16/fp16) or "segments" (the
    plan's slow CPU reference executor)."""

    def __post_init__(self):
        if not (self.cost_model in cost_models.MODEL_PRESETS or Path(self.cost_model).is_file()):
            raise ValueError(
                f"skrull.cost_model: {self.cost_model!r} is neither a preset "
                f"{sorted(cost_models.MODEL_PRESETS)} nor a profile file"
            )
        if self.bucket_size == 0:
            self.bucket_size = self._profile_bucket_size()
        if self.attention_kernel not in KERNEL_CHOICES:
            raise ValueError(
                f"skrull.attention_kernel: {self.attention_kernel!r} is not one of {list(KERNEL_CHOICES)}"
            )
        try:
            self.scheduler_config(dp=1, cp=1)
        except ValueError as e:
            raise ValueError(f"skrull: {e}") from e

    def _profile_bucket_size(self) -> int:
        from skrull_ext.sim.hardware import bucket_size, load_profile

        if self.cost_model in cost_models.MODEL_PRESETS:
            raise ValueError(
                f"skrull.bucket_size = 0 takes BucketSize from a profile file, but skrull.cost_model is "
                f"the preset {self.cost_model!r}; name a profile (python -m skrull_ext.profile writes one)"
            )
        value = bucket_size(load_profile(self.cost_model))
        if value is None:
            raise ValueError(f"skrull.bucket_size = 0: the profile {self.cost_model!r} has no [memory] bucket_size")
        return value

    def profile_cp_warning(self, cp: int) -> str | None:
        """A warning when this job's CP degree is not the one its profile's
        BucketSize was derived for (a shard costs more memory than a whole
        token: cost_model.bucket_size), else None."""
        if self.cost_model in cost_models.MODEL_PRESETS:
            return None
        from skrull_ext.sim.hardware import load_profile

        profiled = int(load_profile(self.cost_model).get("memory", {}).get("cp", 1))
        if profiled == cp:
            return None
        return (f"skrull: the profile {self.cost_model!r} derived its BucketSize for cp {profiled}; this job runs "
                f"cp {cp} (bucket_size {self.bucket_size}). Re-profile with the job's parallelism, or a rank "
                f"holding shards may use more memory than the profile predicts")

    def scheduler_config(self, dp: int, cp: int) -> SchedulerConfig:
        """The core's config for a DP x CP job."""
        return SchedulerConfig(
            dp=dp,
            cp=cp,
            bucket_size=self.bucket_size,
            policy=self.policy,
            overlength=self.overlength,
            cpsat=self.cpsat,
            cpsat_margin=self.cpsat_margin,
            cpsat_deterministic_time=self.cpsat_deterministic_time,
        )

    def build_cost_model(self):
        """``skrull_ext._core.CostModel`` named by ``cost_model``."""
        if self.cost_model in cost_models.MODEL_PRESETS:
            return cost_models.preset(self.cost_model)
        return cost_models.load(self.cost_model)

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}
