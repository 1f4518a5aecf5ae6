"""Checks of a whole job config against itself and this machine, at config time.

``job_file`` checks each key against its type and the dataclasses'
``__post_init__`` checks each section alone. What neither can see is here:
ranges torchtitan only asserts deep inside the trainer (``training.steps``,
the parallel degrees), keys that depend on one another, and the hardware
(the world size of this launch, the device a kernel needs). ``check_job``
runs in ``job_file.load_config``, before any process group or model is
built, and raises ``JobFileError`` naming the first bad key and its value:

    parallelism.context_parallel_degree = 3: 3 (cp x tp x pp x dp_replicate) does not divide
    the world size 2 (processes in this launch)
"""

from __future__ import annotations

import math
import os
import shutil

from skrull_ext.attention.kernels import KERNELS
from skrull_ext.data.sources.checks import check_data
from skrull_ext.errors import JobFileError
from skrull_ext.scheduler.capacity import Capacity
from skrull_ext.scheduler.config import LOOKAHEAD_AUTO
from skrull_ext.scheduler.model_shape import job_shape, model_compiled
from skrull_ext.train.job.section_kinds import mode_of
from skrull_ext.train.job.tensor_parallel import check_skrull_parallelism
from torchtitan_patches import compat

__all__ = ["check_job"]


def _bad(key: str, value, why: str) -> JobFileError:
    return JobFileError(f"{key} = {value!r}: {why}")


def _at_least(config, key: str, lo) -> None:
    section, name = key.split(".")
    value = getattr(getattr(config, section), name)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= lo:
        return
    raise _bad(key, value, f"must be >= {lo}")


def _check_training(config) -> None:
    for key in ("training.steps", "training.seq_len", "training.local_batch_size", "metrics.log_freq"):
        _at_least(config, key, 1)
    if not (config.training.max_norm > 0 and math.isfinite(config.training.max_norm)):
        raise _bad("training.max_norm", config.training.max_norm, "must be a finite number > 0 (gradient clipping)")
    lr = config.lr_scheduler
    if lr.warmup_steps < 0:
        raise _bad("lr_scheduler.warmup_steps", lr.warmup_steps, "must be >= 0")
    if lr.decay_ratio is not None and not 0 <= lr.decay_ratio <= 1:
        raise _bad("lr_scheduler.decay_ratio", lr.decay_ratio, "must be in [0, 1]")
    for i, group in enumerate(getattr(config.optimizer, "param_groups", None) or ()):
        lr_value = (getattr(group, "optimizer_kwargs", None) or {}).get("lr")
        if lr_value is not None and not (isinstance(lr_value, (int, float)) and math.isfinite(lr_value)
                                         and lr_value >= 0):
            raise _bad(f"optimizer.param_groups[{i}].optimizer_kwargs.lr", lr_value, "must be a finite number >= 0")
    ckpt = config.checkpoint
    if ckpt.enable and ckpt.interval < 1:
        raise _bad("checkpoint.interval", ckpt.interval, "must be >= 1 when checkpoint.enable is true")
    if not ckpt.enable and ckpt.initial_load_path:
        # torchtitan ignores initial_load_path without a checkpointer: the model
        # would train from random weights (e.g. [model] hf_path beside enable = false).
        raise _bad("checkpoint.enable", False, f"the model's weights load from checkpoint.initial_load_path "
                   f"{ckpt.initial_load_path!r} (set by model.hf_path), which needs the checkpointer; without "
                   "it the model would train from random weights; add --checkpoint.enable (or [checkpoint] "
                   "enable = true)")
    _check_checkpoint_off(ckpt)


_SAVE_KEYS = ("interval", "last_save_in_hf", "folder", "keep_latest_k", "export_dtype", "async_mode",
              "enable_first_step_checkpoint", "create_seed_checkpoint", "load_step")
"""[checkpoint] keys that act only through the checkpointer (``enable``)."""


def _check_checkpoint_off(ckpt) -> None:
    """A job that sets how to save but not ``enable`` trained and saved nothing,
    without a word (torchtitan builds no checkpointer): refuse it, naming the keys."""
    if ckpt.enable:
        return
    default = type(ckpt)()
    set_keys = [f"{k} = {getattr(ckpt, k)!r}" for k in _SAVE_KEYS if getattr(ckpt, k) != getattr(default, k)]
    if set_keys:
        raise _bad("checkpoint.enable", False, f"[checkpoint] sets {', '.join(set_keys)}, which only act when the "
                   "checkpointer runs: nothing would be saved; add --checkpoint.enable (or [checkpoint] "
                   "enable = true), or remove them")


_DEGREES = (
    ("data_parallel_replicate_degree", "dp_replicate"),
    ("context_parallel_degree", "cp"),
    ("tensor_parallel_degree", "tp"),
    ("pipeline_parallel_degree", "pp"),
    ("expert_parallel_degree", "ep"),
)


def _check_parallelism(config, world: int) -> None:
    """What torchtitan's ParallelDims asserts (with an empty message for the world size)."""
    p = config.parallelism
    for field, _ in _DEGREES:
        if getattr(p, field) < 1:
            raise _bad(f"parallelism.{field}", getattr(p, field), "must be >= 1")
    shard = p.data_parallel_shard_degree
    if shard != -1 and shard < 1:
        raise _bad("parallelism.data_parallel_shard_degree", shard, "must be >= 1, or -1 (the rest of the world)")
    fixed = p.data_parallel_replicate_degree * p.context_parallel_degree * p.tensor_parallel_degree \
        * p.pipeline_parallel_degree
    what = "cp x tp x pp x dp_replicate"
    # The key to blame: the first degree above 1 a user set, CP first (the common mistake).
    key = next((f"parallelism.{f}" for f in ("context_parallel_degree", "tensor_parallel_degree",
                                             "pipeline_parallel_degree", "data_parallel_replicate_degree")
                if getattr(p, f) > 1), "parallelism.context_parallel_degree")
    value = getattr(p, key.split(".")[1])
    if shard == -1:
        if world % fixed:
            raise _bad(key, value, f"{fixed} ({what}) does not divide the world size {world} "
                                   "(processes in this launch: torchrun --nproc_per_node)")
    elif fixed * shard != world:
        raise _bad("parallelism.data_parallel_shard_degree", shard,
                   f"{shard} x {fixed} ({what}) != the world size {world} "
                   "(processes in this launch); -1 takes the rest")


def _check_validation(config) -> None:
    """torchtitan's ``[validator]`` feeds rows and masks the DACP attention cannot
    take: a Skrull job reads ``[validation]`` (validation.py), which only Skrull runs."""
    skrull, validation = getattr(config, "skrull", None), getattr(config, "validation", None)
    validator = getattr(config, "validator", None)
    on = skrull is not None and skrull.enable
    if on and validator is not None and validator.enable:
        raise _bad("validator.enable", True, "torchtitan's validator feeds batches the DACP attention cannot take; "
                   "a Skrull job sets [validation] enable = true and dataset_path (docs/data.md, \"Validation\")")
    if validation is None or not validation.enable:
        return
    if not on:
        raise _bad("validation.enable", True, "needs skrull.enable = true (its batches are planned by Skrull; "
                   "torchtitan's batching has torchtitan's [validator])")
    kind = validation.kind(config.dataloader)
    if kind == "synthetic":
        if not validation.samples:
            raise _bad("validation.samples", 0, "a synthetic held-out set needs a sample count")
        return
    if not validation.dataset_path:
        raise _bad("validation.dataset_path", "", f"the held-out data ({kind}: a file, or for hf a folder and "
                   "validation.split) is required")
    check_data(validation.source_config(config.dataloader), key="validation")


def _check_skrull(config, on_cpu: bool) -> None:
    skrull = getattr(config, "skrull", None)
    if skrull is not None and not skrull.enable and skrull.lookahead not in (1, LOOKAHEAD_AUTO):
        # "auto" (the default) chooses among widths Skrull plans; with Skrull off it chooses 1.
        raise _bad("skrull.lookahead", skrull.lookahead, "needs skrull.enable = true (torchtitan's batching trains "
                   "each global batch at its own step); set it to 1 or enable Skrull")
    if skrull is None or not skrull.enable:
        return
    needs_cuda = getattr(KERNELS.get(skrull.attention_kernel), "needs_cuda", None)
    if needs_cuda and on_cpu:  # varlen, cudnn: refused here, never replaced by a CPU kernel
        raise _bad("skrull.attention_kernel", skrull.attention_kernel,
                   f"{needs_cuda} needs a CUDA device (this machine has none); use 'auto', 'tiles', 'dense' or 'segments'")
    try:
        skrull.check_free_running()  # again here: a CLI flag may have been set after the section's own check ran
        skrull.resolved_bucket_size()  # the profile's first read: not a profile, or "profile" it cannot give
    except ValueError as e:
        raise JobFileError(str(e)) from None
    check_skrull_parallelism(config, on_cpu)  # PP refused, TP's limits (tensor_parallel.py)


def _check_positions(config, world: int) -> None:
    """A Skrull step trains each sample whole, its positions running to its length, while the
    model's RoPE cache holds ``training.seq_len`` of them (a longer sample was a traceback on
    every rank: position_ids past the cache). The longest a plan trains is ``dataloader.max_len``
    or what the job's ranks hold (``Capacity``: BucketSize x the ranks a sequence spans), the
    smaller; ``overlength = "chunk"`` has its own line (``_check_chunk``)."""
    skrull = getattr(config, "skrull", None)
    if skrull is None or not skrull.enable or skrull.overlength == "chunk":
        return
    p = config.parallelism
    cp = max(1, p.context_parallel_degree)
    dp = max(1, world // (cp * max(1, p.tensor_parallel_degree) * max(1, p.pipeline_parallel_degree)))
    held = Capacity(skrull.resolved_bucket_size(), cp, dp, skrull.policy_spec.pool)
    max_len, seq_len = config.dataloader.max_len, config.training.seq_len
    if max_len is not None and max_len <= held.limit:
        longest, by = max_len, f"dataloader.max_len {max_len}"
    else:
        longest, by = held.limit, f"{held.label}, what {held.holder} holds whole"
    if longest > seq_len:
        raise _bad("training.seq_len", seq_len, f"shorter than the longest sample a Skrull step trains whole "
                   f"({longest}: {by}), whose positions would pass the model's RoPE cache; set training.seq_len "
                   f"to at least {longest}, or dataloader.max_len to at most {seq_len}")


def _check_chunk(config) -> None:
    """``skrull.overlength = "chunk"`` (train/chunked.py) where it runs today: Skrull's batching
    (at any DP: free-running ranks share no collective in their chunk passes, lockstep ones run
    as many as each other, padded: scheduler/chunk_lockstep.py); and a RoPE
    cache (``training.seq_len``) as long as the longest sample (``dataloader.max_len``)."""
    skrull = getattr(config, "skrull", None)
    if skrull is None or skrull.overlength != "chunk":
        return
    if not skrull.enable:
        raise _bad("skrull.overlength", "chunk", "needs skrull.enable = true (torchtitan's batching has rows, "
                   "not chunked documents)")
    max_len = config.dataloader.max_len
    if max_len is None:  # the limit itself is missing: name it, not the RoPE cache
        raise _bad("dataloader.max_len", None, "skrull.overlength = 'chunk' trains a sample longer than this limit "
                   "in chunks, so it needs one: set dataloader.max_len, and training.seq_len (the RoPE cache) at "
                   "least as large")
    if config.training.seq_len < max_len:
        raise _bad("training.seq_len", config.training.seq_len,
                   f"a chunked sample's positions run to its length: under skrull.overlength = 'chunk' set "
                   f"dataloader.max_len (now {max_len}) and training.seq_len (the RoPE cache) at least as large")


def _check_cost_model(config) -> None:
    """The cost model prices the job's model: a measured profile of another shape (a
    shipped CPU job pointed at a HF folder) is refused here, before any process group,
    in one line naming both shapes and ``--skrull.cost_model`` (it was a ValueError
    traceback per rank when the trainer started)."""
    skrull = getattr(config, "skrull", None)
    if skrull is None or not skrull.enable or config.model_spec is None:
        return
    spec = config.model_spec
    try:
        skrull.check_shape(job_shape(config), f"{spec.name}/{spec.flavor}")
    except ValueError as e:
        raise JobFileError(str(e)) from None


def _cxx_found() -> bool:
    """Whether inductor's CPU code generation finds its C++ compiler (``CXX``,
    else g++: torch._inductor.config.cpp.cxx), or may install one itself."""
    if os.environ.get("TORCH_INDUCTOR_INSTALL_GXX"):
        return True
    return shutil.which(os.environ.get("CXX", "g++")) is not None


def _check_compile(config, on_cpu: bool, cxx_found=_cxx_found) -> None:
    """What stops a compiled job at its first step, with a traceback per rank:
    a backend torch does not know, a CUDA-graph backend under Skrull (it
    cannot replay DACP micro-batches, as training.disable_cuda_graphs says),
    inductor on CPU without a C++ compiler. DACP attention itself compiles
    (attention/compiled.py)."""
    c = getattr(config, "compile", None)
    if c is None or not c.enable or not set(c.components) & {"model", "loss"}:
        return
    import torch._dynamo

    if c.backend not in torch._dynamo.list_backends(exclude_tags=()):
        shown = ", ".join([*torch._dynamo.list_backends(), "aot_eager", "eager"])
        raise _bad("compile.backend", c.backend, f"is not a torch.compile backend (torch._dynamo.list_backends(): "
                                                 f"{shown}; debug backends too)")
    skrull = getattr(config, "skrull", None)
    if c.backend == "cudagraphs" and skrull is not None and skrull.enable:
        raise _bad("compile.backend", c.backend, "a CUDA graph cannot replay DACP micro-batches (a new buffer "
                   "length and host-side plan each call); use 'inductor'")
    if c.backend == "inductor" and on_cpu and not cxx_found():
        raise _bad("compile.enable", True, f"inductor compiles C++ on CPU and found no compiler "
                   f"({os.environ.get('CXX', 'g++')}: set CXX, install g++, or set compile.enable = false)")
    # under skrull.activation_checkpoint = "auto" the mode it chooses is checked (checkpointing.settle_checkpointing)
    if skrull is None or not skrull.enable or skrull.activation_checkpoint == "job":
        try:
            kind = mode_of(config.activation_checkpoint)
            compat.check_checkpointed_compile(config, model_compiled(config),
                                              f"activation_checkpoint.kind = {kind!r}")
        except ValueError as e:
            raise JobFileError(str(e)) from None


def _quantized_linear(model_config) -> tuple[str, str] | None:
    """(key, class) of the first layer a torchtitan quantization converter
    (float8, MX, NVFP4) swapped into ``model_config``; None when there is none."""
    from torchtitan.components.quantization import float8, mx, nvfp4
    from torchtitan.components.quantization.utils import has_quantization
    from torchtitan.models.common.linear import Linear

    if model_config is None:
        return None
    quantized = tuple(cls.Config for cls in (float8.Float8Linear, mx.MXFP8Linear, nvfp4.NVFP4Linear)
                      if cls is not None)  # None: torchao is not installed
    for fqn, linear, _, _ in model_config.traverse(Linear.Config):
        if quantized and isinstance(linear, quantized):
            return f"model_spec.model.{fqn}", type(linear).__qualname__.removesuffix(".Config")
    if has_quantization(model_config):  # MoE experts
        return "model_spec.model", "quantized grouped experts"
    return None


def _check_quantization(config) -> None:
    """torchtitan's float8 converter (and its MX/NVFP4 siblings) swaps Linear
    layers when a config-registry function builds the model spec
    (``model_registry(..., converters=[Float8LinearConverter.Config()])``), out
    of reach of a job file. A Skrull job that carries one is refused: it was
    never run, not silently trained as if it had been."""
    skrull, spec = getattr(config, "skrull", None), getattr(config, "model_spec", None)
    if skrull is None or not skrull.enable or spec is None:
        return
    found = _quantized_linear(getattr(spec, "model", None))
    if found is not None:
        raise _bad(*found, "quantized linears (torchtitan's Float8LinearConverter, MX, NVFP4 converters) are not "
                   "supported with skrull.enable yet: never run with Skrull (float8 matmuls need an SM89+ GPU, "
                   "their CPU emulation torchao, which this project does not install) and Skrull's cost model "
                   "times bf16/fp32 matmuls; build the model spec without the converter, or set "
                   "skrull.enable = false (torchtitan's own batching)")


def _check_profiler(config, on_cpu: bool) -> None:
    """What torchtitan's profiler asserts only once the model is built: a cycle of
    ``profile_freq`` steps holds the warmup and active steps (torch.profiler's
    wait = profile_freq - warmup - active), and memory snapshots need CUDA."""
    p = getattr(config, "profiler", None)
    if p is None:
        return
    if p.enable_profiling:
        if p.profiler_active < 1:
            raise _bad("profiler.profiler_active", p.profiler_active, "must be >= 1")
        if p.profiler_warmup < 0:
            raise _bad("profiler.profiler_warmup", p.profiler_warmup, "must be >= 0")
        cycle = p.profiler_warmup + p.profiler_active
        if p.profile_freq < cycle:
            raise _bad("profiler.profile_freq", p.profile_freq,
                       f"must be >= profiler.profiler_warmup + profiler.profiler_active = {p.profiler_warmup} + "
                       f"{p.profiler_active} = {cycle} (each profiling cycle waits, warms up, then records)")
    if p.enable_memory_snapshot:
        if on_cpu:
            raise _bad("profiler.enable_memory_snapshot", True, "memory snapshots need a CUDA device (this "
                                                                 "machine has none)")
        freq = p.profile_freq if p.memory_snapshot_freq is None else p.memory_snapshot_freq
        if freq < 1:
            key = "profiler.profile_freq" if p.memory_snapshot_freq is None else "profiler.memory_snapshot_freq"
            raise _bad(key, freq, "must be >= 1 (steps between memory snapshots)")


def check_job(config, world_size: int | None = None, on_cpu: bool | None = None) -> None:
    """Raise JobFileError naming the first key of ``config`` that cannot run here.

    ``world_size``: processes of the launch (default: ``WORLD_SIZE``, 1 without
    a launcher); ``on_cpu``: whether there is no accelerator (default: probed).
    """
    if world_size is None:
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if on_cpu is None:
        from torchtitan_patches import on_cpu as probe

        on_cpu = probe()
    _check_training(config)
    _check_parallelism(config, world_size)
    check_data(config.dataloader)
    _check_validation(config)
    _check_skrull(config, on_cpu)
    _check_positions(config, world_size)
    _check_chunk(config)
    _check_cost_model(config)
    _check_compile(config, on_cpu)
    _check_quantization(config)
    _check_profiler(config, on_cpu)
