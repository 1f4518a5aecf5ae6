# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""Memory: activation bytes per token, the static account, and BucketSize.

Two meters run on every forward+backward of the whole model (embedding,
layers, norm, head, the job's loss):

- saved bytes: every tensor autograd saves for backward, through
  ``torch.autograd.graph.saved_tensors_hooks``, counted once per storage and
  without parameters. Exact and device independent; reported, not fitted.
- peak tensor bytes above the step's starting point: the CUDA caching
  allocator's peak statistics, or on CPU the allocation and free events of
  the CPU allocator that torch's profiler records (``profile_memory``),
  summed in order. Exact on both: every tensor the step allocates, the
  saved activations and what backward allocates on top (activation
  gradients, the loss's logit gradients), nothing else.

The fit is to the peak on every device, and BucketSize is derived from it
with the plain ``--margin``. An earlier model fitted the saved bytes on CPU
and covered the backward transient with a margin of peak/saved - 1: a ratio,
where the transient is an amount. Activation gradients cost the same bytes
whether or not the base weights are frozen (full fine-tuning adds at most
one weight-sized gradient before it is added into ``.grad``), while a
frozen (LoRA) base saves fewer tensors, so the ratio, and with it the
margin, grew under LoRA (and
the resident-set peak it was read from added 10-25 MB of non-tensor memory
that varied from run to run). The process's resident set (``CpuPeak``) is
still what the checks in training measure (train_check.py): it is what a
job has to fit in.

The CPU dense-mask attention saves an L x L mask per layer, so the fit takes
a quadratic term when the points call for one; on GPU kernels it is ~0.

Static memory (the sharded parameters, gradients and optimizer state a rank
holds between steps) is an account from parameter counts (gradients and
optimizer state of trainable parameters only: a LoRA base is frozen) and the
job's parallel and dtype settings, not a measurement; ``check.py`` measures it
for one rank. FSDP's unsharded buffers (each unit's gathered parameters and
its gradients before the reduce-scatter) are not in it: the ladder's model is
FSDP-wrapped as the trainer's is (model.py, at one rank too), so each step
allocates them above its starting point and the fitted peak holds them, as
the training check's peak above the step's start does (train_check.py).
Added here as well they were counted twice (13.0 MiB on the debug job at
FSDP 2, docs/profile.md "Static memory").
"""

from __future__ import annotations

import ctypes
import gc
import math
import os
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from skrull_ext.profile.fit import PolyFit, fit_poly
from skrull_ext.profile.head_memory import chunk_head
from skrull_ext.profile.model import DTYPES, JobModel, fsdp_degree
from skrull_ext.profile.options import ProfileOptions
from skrull_ext.profile.ranks import reduce_floats, sync
from skrull_ext.scheduler.profile_memory import derive_bucket_size, free_running_bytes, head_bytes

__all__ = ["MemoryPoint", "MemoryResult", "StaticMemory", "freeze_heap", "local_bytes", "measure_step",
           "optimizer_state_tensors", "profile_memory", "static_memory"]

OPTIMIZER_STATES: dict[str, int] = {"AdamW": 2, "Adam": 2, "Lion": 1, "SGD": 1}
"""Tensors of parameter size an optimizer keeps per parameter (SGD: momentum)."""


def freeze_heap() -> None:
    """Collect garbage once, then move every object alive now out of the collector's reach
    (``gc.freeze``). Each meter's ``start()`` collects garbage so that no tensor of an earlier
    step is freed inside its window; a full collection walks every tracked object, and after
    torch, torchtitan and dynamo are imported that is ~0.2-0.5 s of CPU each (a third of a
    CPU profile's memory ladder). Call it where what is alive stays alive for the run (the
    imports and the job's model, built): later collections then walk only what the run made,
    and free the same garbage."""
    gc.collect()
    gc.freeze()


class SavedBytes:
    """Bytes autograd saves for backward inside the ``with`` block: each
    storage once, parameters and buffers left out (they are static). Under
    FSDP the parameters a unit runs with are its unsharded copies, registered
    on the modules only while the unit runs: they are read at each save."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._model = model
        self._static = {_storage_ptr(t) for t in (*model.parameters(), *model.buffers())}
        self._seen: dict[int, int] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # no plain storage (e.g. a functional wrapper)
            return t
        ptr = st.data_ptr()
        if ptr in self._static or ptr in self._seen:
            return t
        if ptr in {_storage_ptr(q) for q in self._model.parameters()}:  # FSDP's unsharded copy, now
            return t
        self._seen[ptr] = st.nbytes()
        return t

    @property
    def bytes(self) -> int:
        return sum(self._seen.values())

    def __enter__(self) -> SavedBytes:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)


def _storage_ptr(t: torch.Tensor) -> int:
    """Address of a tensor's storage; a DTensor's (an FSDP-sharded parameter) is its local shard's."""
    t = t.to_local() if hasattr(t, "to_local") else t
    return t.untyped_storage().data_ptr()


class CpuPeak:
    """Resident-set high-water mark above the level at ``start()``."""

    _configured = False

    def __init__(self) -> None:
        self._libc = ctypes.CDLL("libc.so.6") if os.path.exists("/proc/self/clear_refs") else None
        if self._libc is not None and not CpuPeak._configured:
            # Fixed 64 KiB mmap/trim thresholds: freed tensors go back to the OS,
            # so RSS tracks live memory instead of glibc's cached arenas.
            self._libc.mallopt(-3, 1 << 16)  # M_MMAP_THRESHOLD
            self._libc.mallopt(-1, 1 << 16)  # M_TRIM_THRESHOLD
            CpuPeak._configured = True
        self._base = 0

    @property
    def base(self) -> float:
        """Resident bytes at the last ``start()`` (the level peaks are measured from)."""
        return float(self._base)

    @staticmethod
    def _status(key: str) -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError(f"{key} missing from /proc/self/status")

    def start(self) -> None:
        if self._libc is None:
            return
        gc.collect()
        self._libc.malloc_trim(0)
        self._base = self._status("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current RSS

    def peak(self) -> float:
        return math.nan if self._libc is None else float(self._status("VmHWM") - self._base)


class CudaPeak:
    """Caching-allocator peak above the allocation level at ``start()``."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._base = 0

    @property
    def base(self) -> float:
        """Allocated bytes at the last ``start()`` (the level peaks are measured from)."""
        return float(self._base)

    def start(self) -> None:
        gc.collect()
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        self._base = torch.cuda.memory_allocated(self.device)

    def peak(self) -> float:
        torch.cuda.synchronize(self.device)
        return float(torch.cuda.max_memory_allocated(self.device) - self._base)


class CpuTensorPeak:
    """Peak of live CPU tensor bytes above the level at ``start()``: the CPU
    allocator's allocation (+) and free (-) events between ``start()`` and
    ``peak()``, as torch's profiler records them, summed in time order.
    Exact, like CUDA's allocator peak; no non-tensor memory in it."""

    def __init__(self) -> None:
        self._prof: Any = None

    @property
    def base(self) -> float:
        return 0.0  # events are deltas from the start level

    def start(self) -> None:
        gc.collect()
        self._prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True)
        # torch 2.11's profiler warns on its first start in a process ("Profiler clears events at
        # the end of each cycle ..."; torch >= 2.13 only on a second cycle): this meter reads one
        # cycle's events, so the warning says nothing here.
        with _quiet_stderr(), warnings.catch_warnings():  # kineto prints a line at every start and stop
            warnings.filterwarnings("ignore", message=".*Profiler clears events at the end of each cycle",
                                    category=UserWarning)
            self._prof.__enter__()

    def peak(self) -> float:
        prof, self._prof = self._prof, None
        if prof is None:
            raise RuntimeError("CpuTensorPeak.peak() without start()")
        with _quiet_stderr():
            prof.__exit__(None, None, None)
        cpu = torch.autograd.DeviceType.CPU
        events = sorted((e.start_ns(), i, e.nbytes()) for i, e in enumerate(prof.profiler.kineto_results.events())
                        if e.name() == "[memory]" and e.device_type() == cpu)
        level = top = 0
        for _, _, n in events:
            level += n
            top = max(top, level)
        return float(top)


class _quiet_stderr:
    """Redirect file descriptor 2 to /dev/null inside the block."""

    def __enter__(self) -> None:
        import sys

        sys.stderr.flush()
        self._saved = os.dup(2)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
        os.close(null)

    def __exit__(self, *exc) -> None:
        os.dup2(self._saved, 2)
        os.close(self._saved)


PEAK_METERS: dict[str, Callable[[torch.device], Any]] = {"cpu": lambda d: CpuTensorPeak(), "cuda": CudaPeak}
"""Tensor peak of a step, per device type: what the memory model is fitted to."""
PROCESS_METERS: dict[str, Callable[[torch.device], Any]] = {"cpu": lambda d: CpuPeak(), "cuda": CudaPeak}
"""What a running job holds, per device type (CPU: the resident set): the training check's meter."""


def local_bytes(tensors: Iterable[Any]) -> int:
    """Bytes this rank holds for ``tensors`` (non-tensors and scalars, such as
    AdamW's step count, skipped): a DTensor (FSDP) counts its local shard only."""
    n = 0
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.dim() > 0:
            t = t.to_local() if hasattr(t, "to_local") else t
            n += t.numel() * t.element_size()
    return n


def optimizer_state_tensors(optimizers: Iterable[torch.optim.Optimizer]) -> Iterator[Any]:
    """Every value of every parameter's state in torchtitan's optimizer container."""
    for o in optimizers:
        for state in o.state.values():
            yield from state.values()


@dataclass(frozen=True)
class MemoryPoint:
    tokens: int
    saved: float
    """Bytes saved for backward (hooks)."""
    peak: float
    """Peak tensor bytes above the step's start (the fit target)."""


def measure_step(jm: JobModel, docs: Sequence[int], meter: Any, seed: int = 0) -> MemoryPoint:
    """One forward+backward of the whole model and loss over a packed buffer.
    Parameter gradients must already exist (call once beforehand), so the
    peak shows activations and their gradients only."""
    buf = jm.buffer(list(docs), seed=seed)
    jm.model.zero_grad(set_to_none=False)
    meter.start()
    saved = SavedBytes(jm.model)
    with saved:
        out = jm.model(buf["tokens"], buf["positions"], buf["attention_masks"])
        loss, _ = jm.loss_fn(out, buf["labels"])
    loss.backward()
    sync(jm.device)
    peak = meter.peak()
    del out, loss, buf
    return MemoryPoint(sum(docs), float(saved.bytes), peak)


@dataclass(frozen=True)
class StaticMemory:
    params: float
    grads: float
    optimizer: float
    fsdp_degree: int
    tp_degree: int
    optimizer_states: int
    free_running: float = 0.0
    """``[skrull] free_running``: every parameter and trainable gradient held unsharded
    for the whole step (profile_memory.free_running_bytes); 0 when the job does not run it."""

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.free_running


def static_memory(jm: JobModel, world_size: int) -> StaticMemory:
    """Per-rank bytes of parameters, gradients and optimizer state under the
    job's FSDP (dp_shard x cp) and TP sharding (FSDP's transient unsharded units are in
    the measured activation peak: module docstring), plus, when the job has
    ``[skrull] free_running = true``, the unsharded parameters and
    gradients it holds all step (under "auto" the profile keeps lockstep's account, and
    the trainer adds them when it weighs free-running: train/execution.py)."""
    cfg = jm.config
    names = {g.optimizer_name for g in cfg.optimizer.param_groups}
    unknown = names - OPTIMIZER_STATES.keys()
    if unknown:
        raise ValueError(f"optimizer {sorted(unknown)}: state size unknown; known: {sorted(OPTIMIZER_STATES)}")
    states = max(OPTIMIZER_STATES[n] for n in names)
    n_params = sum(p.numel() for p in jm.model.parameters())
    # Frozen parameters (a LoRA base) get no gradient and no optimizer state.
    n_trainable = sum(p.numel() for p in jm.model.parameters() if p.requires_grad)
    fsdp = fsdp_degree(cfg, world_size)
    tp = cfg.parallelism.tensor_parallel_degree
    pp = cfg.parallelism.pipeline_parallel_degree
    shard = fsdp * tp * pp
    elem = DTYPES[cfg.training.dtype].itemsize
    mp = DTYPES[cfg.training.mixed_precision_param].itemsize
    skrull = getattr(cfg, "skrull", None)
    free = bool(skrull is not None and skrull.enable and getattr(skrull, "free_running", False) is True)
    # Free-running: every unit's parameters and accumulated gradients unsharded all step
    # (in FSDP's reduce dtype where wider). Counted whatever the FSDP degree: FSDP's
    # unsharded copies exist under HSDP with dp_shard 1 too (an overcount at one rank).
    grad_elem = max(mp, DTYPES[getattr(cfg.training, "mixed_precision_reduce", "float32")].itemsize)
    unsharded = free_running_bytes(n_params, n_trainable, mp, grad_elem, tp * pp) if free else 0.0
    return StaticMemory(
        params=n_params * elem / shard,
        grads=n_trainable * elem / shard,
        optimizer=states * n_trainable * elem / shard,
        fsdp_degree=fsdp,
        tp_degree=tp,
        optimizer_states=states,
        free_running=unsharded,
    )


def usable_memory(device: torch.device, limit: int) -> float:
    """Bytes one rank may use: the user's limit, else the device total (CPU:
    physical RAM shared by this node's ranks)."""
    if limit:
        return float(limit)
    if device.type == "cuda":
        return float(torch.cuda.mem_get_info(device)[1])
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return float(ram) / int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


@dataclass(frozen=True)
class MemoryResult:
    points: list[MemoryPoint]
    fit: PolyFit
    """Peak activation bytes of one buffer of N tokens: b + a N (+ c N^2)."""
    static: StaticMemory
    usable: float
    margin: float
    bucket_size: int
    cp: int
    """The job's CP degree: BucketSize holds for a rank of shards of sequences sharded over cp ranks."""
    kv_bytes_per_token: float
    """K and V of every layer for one token: what a shard keeps per token gathered from another rank."""
    logits_bytes_per_token: float = 0.0
    """Peak bytes of the head and loss per token of a chunk (``head_memory.measure_head``); 0: the loss is not
    chunked (train/head_loss.py) and the fit's slope holds the logits."""
    head_chunk: int = 0
    """Tokens a chunk of the head and loss: what the logits take at most is one chunk's."""
    head_grad_bytes: float = 0.0
    """The in-forward head's float32 weight gradient held from forward to backward (in the fit's
    intercept, as the ladder ran the job's loss); 0: its chunks recompute (train/head_loss.py)."""

    def predicted(self, tokens: int) -> float:
        return self.fit(tokens) + head_bytes(tokens, self.logits_bytes_per_token, self.head_chunk)


def fit_memory(tokens: Sequence[int], values: Sequence[float]) -> PolyFit:
    """b + a N + c N^2 with c >= 0 and b >= 0; linear when the quadratic term does not
    pay (c <= 0, or it halves no error). A negative b (no bytes at no tokens is the floor; a
    short ladder under checkpointing fitted b = -0.6 MB, which the profile file refuses) is
    refitted through the origin."""
    line = fit_poly(tokens, values, 1)
    fit = line
    if len(tokens) >= 4:
        quad = fit_poly(tokens, values, 2)
        if quad.quadratic > 0 and quad.coef[1] > 0 and quad.max_rel_error < 0.5 * line.max_rel_error:
            fit = quad
    if fit.intercept < 0:
        fit = fit_poly(tokens, values, 2 if fit is not line else 1, intercept=False)
    return fit


def profile_memory(jm: JobModel, opts: ProfileOptions, world_size: int,
                   tick: Callable[[str], None]) -> MemoryResult:
    """Measure the memory ladder, fit it, and derive BucketSize."""
    from skrull_ext.train.head_loss import HeadChunking

    meter = PEAK_METERS[jm.device.type](jm.device)
    logits, chunk, head_grad = chunk_head(jm, opts, meter, tick)
    measure_step(jm, [min(opts.memory_lengths)], meter, opts.seed)  # allocate parameter gradients
    local = []
    for n in opts.memory_lengths:
        tick(f"memory {n}")
        local.append(measure_step(jm, [n], meter, opts.seed))
    if chunk:  # the job's chunk from here on (the check, the head's time, the micro-batches)
        jm.loss_fn.set_chunking(HeadChunking(chunk, logits, "the job's"))
    saved = reduce_floats([p.saved for p in local], "max", jm.device)
    peak = reduce_floats([p.peak for p in local], "max", jm.device)
    points = [MemoryPoint(p.tokens, s, k) for p, s, k in zip(local, saved, peak)]
    fit = fit_memory([p.tokens for p in points], [p.peak for p in points])
    margin = opts.margin
    static = static_memory(jm, world_size)
    usable = usable_memory(jm.device, opts.memory_limit)
    cp = jm.config.parallelism.context_parallel_degree
    s = jm.shape
    kv = 2.0 * s.kv_width * s.bytes_per_elem * s.layers
    bucket = derive_bucket_size(usable, static.total, fit.slope, fit.intercept, margin, fit.quadratic, cp, kv,
                                logits, chunk)
    return MemoryResult(points, fit, static, usable, margin, bucket, cp, kv, logits, chunk, head_grad)
