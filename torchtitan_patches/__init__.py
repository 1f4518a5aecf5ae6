"""torchtitan 0.3.0 as skrull-ext runs it: on CPU (gloo) and on CUDA, under torch 2.11 to 2.15.

Every change skrull-ext makes to torchtitan's behaviour lives in this
package: this module (the fixes, applied through ``apply``), ``overrides``
(torchtitan ``@override`` factories), ``dense_attention`` (exact CPU
attention for torchtitan's FlexAttention config), ``metrics`` (a TensorBoard
folder per run, no MFU on CPU), ``logs`` (what torchtitan logs, once),
``dacp_attention`` (DACP attention put in place of a built model's inner
attention and torchtitan's CP wrapper), ``fsdp_gloo`` (FSDP2's reductions
and collectives on gloo), ``param_init`` (a trainer's construction that
leaves the parameters a DCP start-up load overwrites undrawn) and ``cp_probe`` (the counting wrappers of
``python -m skrull_ext.bench cp``, installed only there); ``compat``, below.
torchtitan's files are never edited, and nothing outside this package
assigns into torchtitan (``tests/unit_tests/test_package.py``).

torchtitan 0.3.0 assumes an accelerator. Every workaround skrull-ext needs to
train on CPU lives here, each as one entry of ``FIXES`` with a predicate
saying when it applies, so on a CUDA machine ``apply()`` changes nothing.
Nothing is patched at import time: ``apply(config)`` applies the
process-wide fixes and adjusts a ``Trainer.Config``, before the Trainer is
built. It is called from one place per kind of entry:

- ``skrull_ext.train.job.job_file.load_config``: skrull-ext's command lines
  (``python -m skrull_ext.train``, the profiler, the checks), before the job
  is checked or anything is built;
- ``skrull_ext.train.job_trainer.JobTrainer.__init__``: every skrull-ext
  trainer, whatever made its config (torchtitan's ``--module skrull_ext.train
  --config NAME`` launcher, a test building a ``SkrullTrainer`` in Python);
- ``skrull_ext.train.config_registry.llama3_debugmodel_cpu``: torchtitan's
  own Trainer, which has no hook of its own.

A config given twice (the trainer's copy of one load_config fixed) gets the same values.

``compat`` is the other half: torchtitan 0.3.0 on torch 2.11-2.15, one shim
per feature an older torch lacks; ``apply`` installs them, and every entry
point installs the import-time ones before torchtitan is imported. This
module imports no torchtitan at import time, so the ``.pth`` hook can import
``compat`` before torchtitan.

Checked against torch 2.13.0+cpu and 2.11.0+cu130 (on CPU and an H200),
torchtitan 0.3.0, triton 3.7.1 and 3.6.0. Not a fix
but a pin: torchtitan 0.3.0 imports triton unconditionally (via
``models.common.token_dispatcher`` -> ``distributed.minimal_async_ep.kernels``),
so ``triton==3.7.1`` must be installed even on CPU; it imports fine there.
"""

import dataclasses
import functools
import os
import platform
import types
from collections.abc import Callable, Collection
from typing import Any

import torch

from torchtitan_patches import compat


def on_cpu() -> bool:
    """True when torch sees no accelerator (torchtitan would wrongly pick cuda)."""
    return torch._utils._get_available_device_type() is None


@dataclasses.dataclass(frozen=True)
class Fix:
    name: str
    why: str
    applies: Callable[[], bool]
    apply: Callable[..., None]
    needs_config: bool = False


# --------------------------------------------------------------------------
# Process-wide fixes


def _peak_rss_bytes() -> int | None:
    """This process's peak resident memory (Linux ``VmHWM``), None where unknown."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


class _CpuDeviceModule(types.ModuleType):
    """``torch.cpu`` plus the memory/introspection calls torchtitan makes on
    its ``device_module`` (``components/metrics.py`` DeviceMemoryMonitor,
    ``distributed/utils.py`` set_pg_timeouts). CPU has no caching allocator:
    the memory figures are the process's peak resident memory (``VmHWM``, reset
    between logged steps through ``/proc/self/clear_refs`` where the kernel
    allows), so a step line shows what the process held, not torchtitan's
    ``-1`` for unknown (``memory: -0.00GiB``).
    """

    def __init__(self):
        super().__init__("torchtitan_patches.cpu_device_module")
        self.memory = types.SimpleNamespace(
            _record_memory_history=self._no_memory_history,
            _snapshot=self._no_memory_history,
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    @staticmethod
    def _no_memory_history(*args, **kwargs):
        raise RuntimeError("profiler memory snapshots need CUDA; disable them on CPU")

    @staticmethod
    def current_device() -> int:
        # torch.cpu.current_device() returns "cpu"; barrier(device_ids=...)
        # in set_pg_timeouts needs an int.
        return 0

    @staticmethod
    def get_device_name(device=None) -> str:
        return platform.processor() or platform.machine() or "cpu"

    @staticmethod
    def get_device_properties(device=None):
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return types.SimpleNamespace(total_memory=total)

    @staticmethod
    def memory_stats(device=None) -> dict:
        peak = _peak_rss_bytes()
        if peak is None:
            return {}
        return {"active_bytes.all.peak": peak, "reserved_bytes.all.peak": peak,
                "num_alloc_retries": 0, "num_ooms": 0}

    @staticmethod
    def reset_peak_memory_stats(device=None) -> None:
        try:  # "5" resets VmHWM to the current resident size (Linux >= 4.0); nothing else
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass  # the peak then runs from the process start

    @staticmethod
    def empty_cache() -> None:
        pass


# Modules that bound ``device_type``/``device_module`` at import time
# (``from torchtitan.tools.utils import device_type``), torchtitan 0.3.0.
_DEVICE_BINDERS = (
    "torchtitan.tools.utils",
    "torchtitan.components.metrics",
    "torchtitan.models.common.token_dispatcher",
    "torchtitan.distributed.parallel_dims",
    "torchtitan.distributed.utils",
    "torchtitan.tools.profiler",
)


def _device_probe_to_cpu() -> None:
    import importlib

    cpu_module = _CpuDeviceModule()
    for name in _DEVICE_BINDERS:
        mod = importlib.import_module(name)
        if hasattr(mod, "device_type"):
            mod.device_type = "cpu"
        if hasattr(mod, "device_module"):
            mod.device_module = cpu_module


def _no_peak_flops() -> None:
    import torchtitan.tools.utils as utils

    utils.get_peak_flops = lambda device_name: float("nan")


def _launcher_env_for_one_process() -> None:
    import socket

    with socket.socket() as sock:  # a free port for the one-rank TCPStore
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    defaults = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    for key, value in defaults.items():
        os.environ.setdefault(key, value)


class _TimeWithoutSleep(types.ModuleType):
    """``time`` for ``torchtitan.trainer``, whose one ``time.sleep`` is the fixed 2 s
    rank 0 waits after the loop "for other ranks to complete"; ``barrier_after``
    waits for them instead. Every other name is ``time``'s own."""

    def __init__(self):
        super().__init__("torchtitan_patches.time_without_sleep")

    def __getattr__(self, name: str) -> Any:
        import time

        return getattr(time, name)

    @staticmethod
    def sleep(seconds: float) -> None:
        pass


def barrier_after(train: Callable) -> Callable:
    """``train``, then every rank of a world of more than one waits for the others: what
    torchtitan's sleep stood for. No rank goes on to ``close()`` and destroys the process
    group while another is still in its last step (gloo aborts a rank whose peer shut
    down mid-exchange). A rank that raised never gets here; torchrun ends the others."""
    import torch.distributed as dist

    @functools.wraps(train)
    def train_then_wait_for_every_rank(*args, **kwargs):
        out = train(*args, **kwargs)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.barrier()
        return out

    return train_then_wait_for_every_rank


_SLEEP_LINE = "Sleeping 2 seconds for other ranks to complete"


def _end_of_training_barrier() -> None:
    import torchtitan.trainer as trainer_module
    from torchtitan.tools.logging import logger

    trainer_module.time = _TimeWithoutSleep()
    logger.addFilter(lambda record: record.msg != _SLEEP_LINE)  # it no longer sleeps
    trainer_module.Trainer.train = barrier_after(trainer_module.Trainer.train)


# --------------------------------------------------------------------------
# Config fixes


def _spmd_backend_partial_dtensor(config) -> None:
    config.parallelism.spmd_backend = "partial_dtensor"


def _fsdp_on_gloo(config) -> None:
    spec = config.model_spec
    if spec is None or getattr(spec.parallelize_fn, "_skrull_fsdp_on_gloo", False):
        return
    parallelize = spec.parallelize_fn

    @functools.wraps(parallelize)
    def parallelize_for_gloo(model, **kwargs):
        from torchtitan_patches.fsdp_gloo import fit_fsdp_to_gloo

        model = parallelize(model, **kwargs)
        fit_fsdp_to_gloo(model)
        return model

    parallelize_for_gloo._skrull_fsdp_on_gloo = True
    spec.parallelize_fn = parallelize_for_gloo


def _dense_mask_attention(config) -> None:
    target = "torchtitan_patches.overrides.cpu_dense_mask_attention"
    if target not in config.override.imports:
        config.override.imports.append(target)


def _eager_block_masks() -> None:
    from torchtitan_patches.dense_attention import eager_block_masks

    eager_block_masks()


def _no_cuda_graphs(config) -> None:
    config.training.disable_cuda_graphs = True


FIXES: tuple[Fix, ...] = (
    Fix(
        name="device_probe_cpu",
        why=(
            "torchtitan 0.3.0 tools/utils.get_device_info() falls back to 'cuda' "
            "when no accelerator exists, so Trainer calls torch.cuda.set_device "
            "on a CPU build; point every import-time binding at cpu instead"
        ),
        applies=on_cpu,
        apply=_device_probe_to_cpu,
    ),
    Fix(
        name="no_peak_flops_on_cpu",
        why=(
            "torchtitan 0.3.0 tools/utils.get_peak_flops runs lspci, warns twice and "
            "falls back to an A100's peak for an unknown device, so a CPU run logged "
            "an A100 MFU; a CPU has no such figure: NaN, and torchtitan_patches.metrics logs no MFU"
        ),
        applies=on_cpu,
        apply=_no_peak_flops,
    ),
    Fix(
        name="one_process_launcher_env",
        why=(
            "torchtitan 0.3.0 reads LOCAL_RANK/RANK/WORLD_SIZE/MASTER_* that only "
            "torchrun sets, so a plain `python -m torchtitan.train` on a CPU box "
            "fails; without a launcher, run as the single rank of a world of one"
        ),
        applies=lambda: on_cpu() and "LOCAL_RANK" not in os.environ,
        apply=_launcher_env_for_one_process,
    ),
    Fix(
        name="end_of_training_barrier",
        why=(
            "torchtitan 0.3.0 Trainer.train ends with a fixed 2 s sleep on rank 0 'for other "
            "ranks to complete', also in a world of one; on CPU (gloo) every rank waits in a "
            "barrier instead, as long as the slowest rank needs (the suite launches hundreds "
            "of short runs, each paying the 2 s)"
        ),
        applies=on_cpu,
        apply=_end_of_training_barrier,
    ),
    Fix(
        name="spmd_backend_partial_dtensor",
        why=(
            "torchtitan 0.3.0 defaults parallelism.spmd_backend to spmd_types, "
            "which does not run with CPU/gloo on torch 2.13; partial_dtensor is "
            "the stock backend that does (same numerics)"
        ),
        applies=on_cpu,
        apply=_spmd_backend_partial_dtensor,
        needs_config=True,
    ),
    Fix(
        name="fsdp_on_gloo",
        why=(
            "torchtitan 0.3.0 sets FSDP gradient_divide_factor=1.0, which torch "
            "2.13 turns into ReduceOp.PREMUL_SUM(1.0) for reduce-scatter; gloo "
            "refuses PREMUL_SUM: SUM reductions divide by 1.0 after instead, "
            "numerically identical. gloo's reduce-scatter all-reduces the whole "
            "buffer: FSDP's reduce-scatter and all-gather go point to point "
            "instead (torchtitan_patches/fsdp_gloo.py; docs/benchmarks.md section 7)"
        ),
        applies=on_cpu,
        apply=_fsdp_on_gloo,
        needs_config=True,
    ),
    Fix(
        name="dense_mask_attention",
        why=(
            "torch 2.13 FlexAttention has no CPU backward and varlen attention "
            "no CPU kernel; swap in SDPA with a dense boolean mask computed from "
            "the same mask_mod (exact, memory O(L^2), fine for debug sizes)"
        ),
        applies=on_cpu,
        apply=_dense_mask_attention,
        needs_config=True,
    ),
    Fix(
        name="eager_block_masks_on_cpu",
        why=(
            "torchtitan 0.3.0 builds BlockMasks through torch.compile(create_block_mask), and torch's "
            "CP sharding through its own: on CPU a dynamo trace and inductor C++ compile per process "
            "and per new length (2-5 s a rank) for a mask DenseMaskAttention evaluates densely "
            "anyway; masks up to the debug job's size are built eagerly (the same mask), longer ones "
            "compiled as before"
        ),
        applies=on_cpu,
        apply=_eager_block_masks,
    ),
    Fix(
        name="no_cuda_graphs",
        why="torchtitan 0.3.0 enables CUDA graph capture by default; no CUDA here",
        applies=on_cpu,
        apply=_no_cuda_graphs,
        needs_config=True,
    ),
)

_applied_process_fixes: set[str] = set()
_patched_configs: dict[int, Any] = {}
"""id -> the config itself: held so that its id is not reused by a later
config (one whose fixes would then be skipped); configs are small, a process makes few."""


_said: set[str] = set()
"""Fixes already named in the log (once per process)."""


def apply(config=None, *, skip: Collection[str] = ()) -> list[str]:
    """Apply every fix whose predicate holds; return their names.

    Process-wide fixes run once per process; config fixes run once on
    ``config`` (a ``torchtitan.trainer.Trainer.Config``) when it is given.
    Idempotent: a second call returns only what it newly applied.
    ``skip`` names fixes to leave out (to show each one is needed).
    """
    unknown = set(skip) - {f.name for f in FIXES}
    if unknown:
        raise ValueError(f"unknown torchtitan_patches fixes {sorted(unknown)}; known: {[f.name for f in FIXES]}")
    from torchtitan.tools.logging import logger  # not at import: compat must come first

    applied = [f"compat:{name}" for name in compat.install()]
    for fix in FIXES:
        if fix.name in skip or not fix.applies():
            continue
        if fix.needs_config:
            if config is None or id(config) in _patched_configs:
                continue
            fix.apply(config)
        elif fix.name not in _applied_process_fixes:
            fix.apply()
            _applied_process_fixes.add(fix.name)
        else:
            continue
        applied.append(fix.name)
    if config is not None:
        compat.check_config(config)  # after the fixes: on CPU they choose the backend
        _patched_configs[id(config)] = config
    shims = [f"compat:{name}" for name in compat.active()]  # the import-time ones came before this call
    said = [name for name in dict.fromkeys(shims + applied) if name not in _said]  # config fixes apply to each config copy
    _said.update(said)
    if said:
        logger.info(f"[torchtitan_patches] applied: {', '.join(said)}")
    return applied
