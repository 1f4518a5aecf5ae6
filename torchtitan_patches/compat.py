"""torchtitan 0.3.0 on every torch from 2.11 (the GPU image's) to 2.15.

torchtitan 0.3.0 was written against torch 2.13-2.14; an older torch lacks a
few names and keywords it uses. Each gap is one ``Shim``: a predicate that is
true when torch lacks the feature (tested on the feature, never on a version
string, so a torch that has it is left alone) and the smallest stand-in that
lets torchtitan's code run as it would on a torch that has it. Where no
stand-in can give the feature, ``REFUSALS`` names it and the working setting.

Two moments:

- ``install_import_shims()``: the names torchtitan imports at module level
  (``from torch.distributed.fsdp import DataParallelMeshDims``). They must be
  in place before any torchtitan module that imports them, so this is called
  first by every skrull-ext entry point, and, for ``python -m torchtitan.train
  --module skrull_ext.train`` (where torchtitan imports itself before any
  skrull-ext code runs), by the ``skrull_ext_compat.pth`` hook the package
  installs (``_skrull_ext_compat.py``: on the first ``import torchtitan``).
  Imports torch only, never torchtitan.
- ``install()``: all of them, the call-site shims too (torchtitan's own
  bindings of a torch function whose keywords differ); called from
  ``torchtitan_patches.apply``.

Each is a no-op where torch has the feature; each has a test on the CI torch
with the feature made absent (tests/unit_tests/test_compat.py).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable

import torch
from torch.nn.attention.flex_attention import create_block_mask


@dataclasses.dataclass(frozen=True)
class Shim:
    name: str
    feature: str
    """What torch lacks, and which torchtitan 0.3.0 line needs it."""
    serves: str
    """The torch versions without the feature."""
    missing: Callable[[], bool]
    install: Callable[[], None]
    at_import: bool = False
    """True: torchtitan imports the name at module level (install_import_shims)."""


def _params(fn) -> frozenset[str]:
    return frozenset(inspect.signature(fn).parameters)


# --------------------------------------------------------------------------
# torch.distributed.fsdp.DataParallelMeshDims


def _fsdp_module():
    import torch.distributed.fsdp as fsdp

    return fsdp


def _mesh_dims_missing() -> bool:
    return not hasattr(_fsdp_module(), "DataParallelMeshDims")


@dataclasses.dataclass(frozen=True)
class DataParallelMeshDims:
    """Stand-in for torch >= 2.13's FSDP mesh-dims description. torchtitan
    0.3.0 imports it in distributed/full_dtensor.py and models/*/parallelize.py
    but builds one only under the ``full_dtensor``/``spmd_types`` backends,
    which ``REFUSALS`` refuses where fully_shard cannot take it."""

    shard: str | tuple[str, ...] | None = None
    replicate: str | tuple[str, ...] | None = None

    def __post_init__(self):
        raise RuntimeError(
            f"torch {torch.__version__}'s FSDP has no DataParallelMeshDims: "
            "set parallelism.spmd_backend = 'partial_dtensor'")


def _install_mesh_dims() -> None:
    _fsdp_module().DataParallelMeshDims = DataParallelMeshDims


# --------------------------------------------------------------------------
# torchtitan's calls with keywords an older torch does not take


def _attention_module():
    import torchtitan.models.common.attention as attention

    return attention


def _create_block_mask_missing() -> bool:
    return "separate_full_blocks" not in _params(create_block_mask)


def create_block_mask_without_separate_full_blocks(*args, separate_full_blocks: bool = True, **kwargs):
    """torch 2.11's create_block_mask always separates full blocks (as
    ``separate_full_blocks=True``); torchtitan asks for False only in its
    batch-invariant mode, which this torch cannot give."""
    if not separate_full_blocks:
        raise ValueError(
            f"debug.batch_invariant needs create_block_mask(separate_full_blocks=False), which torch "
            f"{torch.__version__} lacks: use torch >= 2.13 or leave debug.batch_invariant false")
    return create_block_mask(*args, **kwargs)


def _install_create_block_mask() -> None:
    attention = _attention_module()
    attention._compiled_create_block_mask = torch.compile(create_block_mask_without_separate_full_blocks)


VARLEN_KEYWORDS = ("num_splits", "enable_gqa")
"""Keywords torchtitan 0.3.0's VarlenAttention passes that torch 2.11's
varlen_attn lacks. Dropping them is exact: flash attention's varlen kernel
takes K/V with fewer heads as GQA without being told (the GPU run's bf16 GQA
case, docs/results/gpu.md), and ``num_splits=1`` works around FA2 NaNs with a
paged KV cache (block_table), which training never passes."""


def _varlen_missing() -> bool:
    from torch.nn.attention.varlen import varlen_attn

    return not set(VARLEN_KEYWORDS) <= _params(varlen_attn)


def varlen_attn_taking_keywords(varlen_attn):
    """``varlen_attn`` that drops the VARLEN_KEYWORDS it does not take."""
    unknown = frozenset(VARLEN_KEYWORDS) - _params(varlen_attn)

    @functools.wraps(varlen_attn)
    def call(*args, **kwargs):
        for key in unknown:
            kwargs.pop(key, None)
        return varlen_attn(*args, **kwargs)

    call._skrull_compat = True
    return call


def _install_varlen() -> None:
    attention = _attention_module()
    if not getattr(attention.varlen_attn, "_skrull_compat", False):
        attention.varlen_attn = varlen_attn_taking_keywords(attention.varlen_attn)


# --------------------------------------------------------------------------
# The flash attention torchtitan activates on Hopper/Blackwell

FLASH_MODULES = {"FA3": "flash_attn_interface", "FA4": "flash_attn.cute.interface"}
"""What torch's registry imports to activate each implementation: separate
packages, absent from the GPU image (torch 2.11, no FA3 package)."""


def _module_absent(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is None
    except ImportError:  # a parent package is missing
        return True


def _flash_module_missing() -> bool:
    return any(_module_absent(m) for m in FLASH_MODULES.values())


def _install_flash_impl() -> None:
    import torchtitan.tools.utils as utils

    chosen = utils.get_cuda_flash_attention_impl
    if getattr(chosen, "_skrull_compat", False):
        return

    @functools.wraps(chosen)
    def get_cuda_flash_attention_impl():
        impl = chosen()
        return None if impl in FLASH_MODULES and _module_absent(FLASH_MODULES[impl]) else impl

    get_cuda_flash_attention_impl._skrull_compat = True
    utils.get_cuda_flash_attention_impl = get_cuda_flash_attention_impl


# --------------------------------------------------------------------------
# torch.distributed.set_timeout


def _set_timeout_missing() -> bool:
    import torch.distributed as dist

    return not hasattr(dist, "set_timeout")


def _install_set_timeout() -> None:
    import torch.distributed as dist

    def set_timeout(timeout, group=None) -> None:
        dist.distributed_c10d._set_pg_timeout(timeout, group)

    dist.set_timeout = set_timeout


SHIMS: tuple[Shim, ...] = (
    Shim(
        name="fsdp_data_parallel_mesh_dims",
        feature="torch.distributed.fsdp.DataParallelMeshDims, imported by torchtitan "
                "distributed/full_dtensor.py:23 and models/*/parallelize.py",
        serves="torch 2.11-2.12",
        missing=_mesh_dims_missing,
        install=_install_mesh_dims,
        at_import=True,
    ),
    Shim(
        name="create_block_mask_separate_full_blocks",
        feature="create_block_mask(separate_full_blocks=...), passed by torchtitan "
                "models/common/decoder.py:274 (FlexAttention masks)",
        serves="torch 2.11-2.12",
        missing=_create_block_mask_missing,
        install=_install_create_block_mask,
    ),
    Shim(
        name="varlen_attn_keywords",
        feature="varlen_attn(num_splits=..., enable_gqa=...), passed by torchtitan "
                "models/common/attention.py:189-193 (VarlenAttention)",
        serves="torch 2.11-2.12",
        missing=_varlen_missing,
        install=_install_varlen,
    ),
    Shim(
        name="flash_attention_impl_installed",
        feature="the FA3/FA4 package torch's flash attention registry imports (flash_attn_interface, "
                "flash_attn.cute.interface), activated on Hopper/Blackwell by torchtitan "
                "models/common/attention.py:128-130 (VarlenAttention) and DACP's varlen kernel; without it "
                "torch's default flash attention (FA2) runs, as on older GPUs",
        serves="any torch without the separate package (the GPU image of docs/gpu.md: torch 2.11, no FA3)",
        missing=_flash_module_missing,
        install=_install_flash_impl,
    ),
    Shim(
        name="dist_set_timeout",
        feature="torch.distributed.set_timeout, called by torchtitan distributed/utils.py "
                "set_pg_timeouts; the private _set_pg_timeout(timeout, group) has its signature",
        serves="torch 2.11-2.13 (2.14 and 2.15 export it, with this signature)",
        missing=_set_timeout_missing,
        install=_install_set_timeout,
        at_import=True,
    ),
)

_installed: set[str] = set()
_active: list[str] = []


def _install(shims) -> list[str]:
    done = []
    for shim in shims:
        if shim.name in _installed:
            continue
        if shim.missing():
            shim.install()
            done.append(shim.name)
            _active.append(shim.name)
        _installed.add(shim.name)
    return done


def install_import_shims() -> list[str]:
    """The shims torchtitan needs to import at all; imports torch only."""
    return _install(s for s in SHIMS if s.at_import)


def install() -> list[str]:
    """Every shim whose feature this torch lacks (once per process); their names."""
    return install_import_shims() + _install(SHIMS)


def active() -> list[str]:
    """The shims installed in this process (their features were missing)."""
    return list(_active)


# --------------------------------------------------------------------------
# Features no shim can give


def _fully_shard_takes_mesh_dims() -> bool:
    return "dp_mesh_dims" in _params(_fsdp_module().fully_shard)


def _checkpointed_local_map_saves_its_mesh() -> bool:
    """torch 2.13's AOT autograd keeps a TP block's ``DeviceMesh`` among the tensors a checkpointed
    compiled block saves for backward, and stops (``runtime_wrappers.save_from_forward``: "expected
    all tensors_saved_with_vc_check to be Tensors, got types: [..., DeviceMesh]"). Measured on the
    debug job at TP 2 under the partial_dtensor backend, aot_eager and inductor, full and selective
    checkpointing, Skrull's batching and torchtitan's (2026-12-01): torch 2.11, 2.14 and 2.15 train
    it. Only a compile shows the defect, so the predicate is the version."""
    return torch.__version__.startswith("2.13.")


def check_checkpointed_compile(config, compiled: bool, said: str) -> None:
    """Refuse, in one line (a ValueError), a compiled TP job that checkpoints activations on a
    torch that cannot compile it (``_checkpointed_local_map_saves_its_mesh``); ``compiled``:
    whether the job compiles its blocks (skrull_ext's ``model_compiled``); ``said``: the key (or
    the choice) that set the job's checkpointing, named in the message."""
    p = config.parallelism
    if (config.activation_checkpoint is None or p.tensor_parallel_degree <= 1 or p.spmd_backend != "partial_dtensor"
            or not compiled or not _checkpointed_local_map_saves_its_mesh()):
        return
    raise ValueError(
        f"{said} with compile.enable and parallelism.tensor_parallel_degree = {p.tensor_parallel_degree} stops in "
        f"torch {torch.__version__}'s compiler (a checkpointed TP block saves its DeviceMesh for backward: "
        "AOT autograd's 'expected all tensors_saved_with_vc_check to be Tensors'); torch 2.11, 2.14 and 2.15 run "
        "it. Set --activation_checkpoint.kind none (with --skrull.activation_checkpoint job), or "
        "--compile.no-enable")


def check_config(config) -> None:
    """Refuse, in one line, a setting this torch cannot run (a ValueError)."""
    backend = config.parallelism.spmd_backend
    if backend in ("spmd_types", "full_dtensor") and not _fully_shard_takes_mesh_dims():
        raise ValueError(
            f"parallelism.spmd_backend = {backend!r} needs fully_shard(dp_mesh_dims=...), which torch "
            f"{torch.__version__} lacks (torch >= 2.13 has it): set parallelism.spmd_backend = 'partial_dtensor'")
