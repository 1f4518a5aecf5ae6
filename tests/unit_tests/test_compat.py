"""torchtitan_patches.compat: each shim on this torch with its feature made
absent (missing() true, install() puts a working stand-in in place) and made
present (missing() false, nothing installed); check_config's refusal; and the
``.pth`` hook putting the import-time shims in place before torchtitan.

Every test runs on a fresh copy of compat's record (``fresh``) and restores
every binding a shim may replace, so the rest of the suite sees the process
as it was.
"""

import datetime
import inspect
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed.fsdp as fsdp
import torch.nn.attention.varlen as varlen

from torchtitan_patches import compat

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "torchtitan_patches" / "site"
SHIM = {s.name: s for s in compat.SHIMS}
TESTED = {"fsdp_data_parallel_mesh_dims", "create_block_mask_separate_full_blocks",
          "varlen_attn_keywords", "flash_attention_impl_installed", "dist_set_timeout"}


def _restore_later(monkeypatch, obj, name: str) -> None:
    """Have monkeypatch put ``obj.name`` back as it is now (absent included)."""
    if hasattr(obj, name):
        monkeypatch.setattr(obj, name, getattr(obj, name))
    else:
        monkeypatch.setattr(obj, name, None, raising=False)  # undo: deleted
        monkeypatch.delattr(obj, name)


@pytest.fixture
def attention():
    return compat._attention_module()


@pytest.fixture
def fresh(monkeypatch, attention):
    """compat as in a process that has installed nothing yet."""
    monkeypatch.setattr(compat, "_installed", set())
    monkeypatch.setattr(compat, "_active", [])
    import torchtitan.tools.utils as utils

    for obj, name in ((fsdp, "DataParallelMeshDims"), (dist, "set_timeout"),
                      (attention, "_compiled_create_block_mask"), (attention, "varlen_attn"),
                      (utils, "get_cuda_flash_attention_impl")):
        _restore_later(monkeypatch, obj, name)
    return compat


def test_every_shim_is_tested_here():
    assert set(SHIM) == TESTED
    for shim in compat.SHIMS:
        assert shim.feature and shim.serves, shim.name


def _installs(name: str) -> list[str]:
    """compat.install() in a fresh process: the shim's name among those installed, once."""
    done = compat.install()
    assert name in done and name in compat.active()
    assert compat.install() == []  # once per process
    return done


# --------------------------------------------------------------------------
# fsdp_data_parallel_mesh_dims


def test_mesh_dims_absent_gets_the_stand_in(fresh, monkeypatch):
    monkeypatch.delattr(fsdp, "DataParallelMeshDims", raising=False)
    shim = SHIM["fsdp_data_parallel_mesh_dims"]
    assert shim.missing()
    assert shim.name in compat.install_import_shims()
    assert not shim.missing()
    from torch.distributed.fsdp import DataParallelMeshDims

    assert DataParallelMeshDims is compat.DataParallelMeshDims
    with pytest.raises(RuntimeError, match=re.escape(torch.__version__) + ".*'partial_dtensor'"):
        DataParallelMeshDims(shard="dp_shard")  # only the refused backends build one


def test_mesh_dims_present_is_left_alone(fresh, monkeypatch):
    class DataParallelMeshDims:  # torch's own, as far as compat can tell
        pass

    monkeypatch.setattr(fsdp, "DataParallelMeshDims", DataParallelMeshDims, raising=False)
    assert not SHIM["fsdp_data_parallel_mesh_dims"].missing()
    assert "fsdp_data_parallel_mesh_dims" not in compat.install()
    assert fsdp.DataParallelMeshDims is DataParallelMeshDims


# --------------------------------------------------------------------------
# create_block_mask_separate_full_blocks


def test_create_block_mask_without_the_keyword_gets_the_stand_in(fresh, monkeypatch, attention):
    calls = []

    def old_create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, device=None, BLOCK_SIZE=128, _compile=False):
        calls.append(((mask_mod, B, H, Q_LEN, KV_LEN), {"device": device}))
        return "mask"

    monkeypatch.setattr(compat, "create_block_mask", old_create_block_mask)
    assert SHIM["create_block_mask_separate_full_blocks"].missing()
    _installs("create_block_mask_separate_full_blocks")
    # torchtitan's binding is a torch.compile of the stand-in (compiled lazily: call it eagerly here)
    stand_in = attention._compiled_create_block_mask._torchdynamo_orig_callable
    assert stand_in is compat.create_block_mask_without_separate_full_blocks
    assert stand_in(len, 1, None, 64, 64, device="cpu", separate_full_blocks=True) == "mask"
    assert stand_in(len, 1, None, 64, 64, device="cpu") == "mask"
    assert calls == [((len, 1, None, 64, 64), {"device": "cpu"})] * 2
    with pytest.raises(ValueError, match=r"separate_full_blocks=False.*torch " + re.escape(torch.__version__)):
        stand_in(len, 1, None, 64, 64, separate_full_blocks=False)  # batch-invariant mode: refused
    assert len(calls) == 2


def test_create_block_mask_with_the_keyword_is_left_alone(fresh, monkeypatch, attention):
    def new_create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, device=None, separate_full_blocks=True):
        raise AssertionError("not called")

    monkeypatch.setattr(compat, "create_block_mask", new_create_block_mask)
    before = attention._compiled_create_block_mask
    assert not SHIM["create_block_mask_separate_full_blocks"].missing()
    assert "create_block_mask_separate_full_blocks" not in compat.install()
    assert attention._compiled_create_block_mask is before


# --------------------------------------------------------------------------
# varlen_attn_keywords


def _old_varlen_attn(calls):
    def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                    window_size=(-1, -1)):
        calls.append({"return_aux": return_aux, "scale": scale})
        return query

    return varlen_attn


def test_varlen_attn_without_the_keywords_gets_the_stand_in(fresh, monkeypatch, attention):
    calls = []
    old = _old_varlen_attn(calls)
    monkeypatch.setattr(varlen, "varlen_attn", old)
    monkeypatch.setattr(attention, "varlen_attn", old)  # torchtitan's binding, from that module
    assert SHIM["varlen_attn_keywords"].missing()
    _installs("varlen_attn_keywords")
    q = torch.zeros(4, 2, 8)
    out = attention.varlen_attn(q, q, q, None, None, 4, 4, return_aux="aux", num_splits=1, enable_gqa=True)
    assert out is q and calls == [{"return_aux": "aux", "scale": None}]  # dropped, the rest passed through
    assert attention.varlen_attn.__wrapped__ is old
    compat._install_varlen()  # never wrapped twice
    assert attention.varlen_attn.__wrapped__ is old


def test_varlen_stand_in_drops_only_what_torch_lacks():
    seen = []

    def half_new(query, *, enable_gqa=False, **kwargs):
        seen.append((enable_gqa, kwargs))

    compat.varlen_attn_taking_keywords(half_new)(None, enable_gqa=True, num_splits=1, scale=0.5)
    assert seen == [(True, {"scale": 0.5})]


def test_varlen_attn_with_the_keywords_is_left_alone(fresh, monkeypatch, attention):
    def new(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, enable_gqa=False, num_splits=None):
        raise AssertionError("not called")

    monkeypatch.setattr(varlen, "varlen_attn", new)
    monkeypatch.setattr(attention, "varlen_attn", new)
    assert not SHIM["varlen_attn_keywords"].missing()
    assert "varlen_attn_keywords" not in compat.install()
    assert attention.varlen_attn is new


# --------------------------------------------------------------------------
# flash_attention_impl_installed


def test_flash_impl_without_its_package_falls_back_to_the_default(fresh, monkeypatch):
    # As on the H200 under torch 2.11: Hopper asks for FA3, flash_attn_interface is absent.
    import torchtitan.tools.utils as utils

    monkeypatch.setattr(utils, "get_cuda_flash_attention_impl", lambda: "FA3")
    absent = {"flash_attn_interface"}
    monkeypatch.setattr(compat, "_module_absent", lambda name: name in absent)
    shim = SHIM["flash_attention_impl_installed"]
    assert shim.missing()
    _installs(shim.name)
    assert utils.get_cuda_flash_attention_impl() is None  # torch's default: nothing to activate
    absent.clear()  # the package installed later in the process: FA3 again
    assert utils.get_cuda_flash_attention_impl() == "FA3"


def test_flash_impl_with_its_packages_is_left_alone(fresh, monkeypatch):
    import torchtitan.tools.utils as utils

    chosen = utils.get_cuda_flash_attention_impl
    monkeypatch.setattr(compat, "_module_absent", lambda name: False)
    assert not SHIM["flash_attention_impl_installed"].missing()
    assert "flash_attention_impl_installed" not in compat.install()
    assert utils.get_cuda_flash_attention_impl is chosen


def test_module_absent_reads_the_import_system():
    assert compat._module_absent("flash_attn_interface_not_a_module")
    assert compat._module_absent("not_a_package_xyz.cute.interface")  # parent missing: absent, no raise
    assert not compat._module_absent("torch.nn.attention")


# --------------------------------------------------------------------------
# dist_set_timeout


def test_set_timeout_absent_gets_the_private_call(fresh, monkeypatch):
    monkeypatch.delattr(dist, "set_timeout", raising=False)
    calls = []
    monkeypatch.setattr(dist.distributed_c10d, "_set_pg_timeout", lambda timeout, group=None: calls.append((timeout, group)))
    shim = SHIM["dist_set_timeout"]
    assert shim.missing()
    assert shim.name in compat.install_import_shims()
    assert not shim.missing()
    group = object()
    dist.set_timeout(datetime.timedelta(seconds=5), group)
    dist.set_timeout(datetime.timedelta(seconds=7))
    assert calls == [(datetime.timedelta(seconds=5), group), (datetime.timedelta(seconds=7), None)]


def test_set_timeout_private_call_has_torchtitans_signature():
    # torchtitan calls set_timeout(timeout, group); the stand-in passes both on positionally
    assert list(inspect.signature(dist.distributed_c10d._set_pg_timeout).parameters)[:2] == ["timeout", "group"]


def test_set_timeout_present_is_left_alone(fresh, monkeypatch):
    def set_timeout(timeout, group=None):
        raise AssertionError("not called")

    monkeypatch.setattr(dist, "set_timeout", set_timeout, raising=False)
    assert not SHIM["dist_set_timeout"].missing()
    assert "dist_set_timeout" not in compat.install()
    assert dist.set_timeout is set_timeout


# --------------------------------------------------------------------------
# This torch as it is


@pytest.mark.skipif("dp_mesh_dims" not in inspect.signature(fsdp.fully_shard).parameters,
                    reason="a torch before 2.13 lacks these features (the tests above cover it)")
def test_a_torch_with_the_features_gets_no_stand_ins(fresh, attention):
    """On the CI torch (2.13+) torch's own functions stay torchtitan's bindings."""
    from torch.nn.attention.flex_attention import create_block_mask

    names = ("fsdp_data_parallel_mesh_dims", "create_block_mask_separate_full_blocks", "varlen_attn_keywords")
    assert not any(SHIM[n].missing() for n in names)
    assert not set(names) & set(compat.install())
    assert fsdp.DataParallelMeshDims.__module__.startswith("torch.")
    assert attention.varlen_attn is varlen.varlen_attn
    binding = attention._compiled_create_block_mask
    binding = getattr(binding, "compiled", binding)  # after the CPU fix eager_block_masks_on_cpu: what it wraps
    assert binding._torchdynamo_orig_callable is create_block_mask


def _torch_set_timeout() -> bool:
    """Whether torch itself exports dist.set_timeout (2.14 on); on 2.11-2.13 what stands there is
    the shim, installed by the .pth hook or an earlier test of this worker."""
    return getattr(getattr(dist, "set_timeout", None), "__module__", "torchtitan_patches").startswith("torch.")


@pytest.mark.skipif(not _torch_set_timeout(), reason="torch 2.11-2.13 lack it (the tests above cover it)")
def test_a_torch_exporting_set_timeout_keeps_its_own(fresh):
    """torch 2.14 and 2.15 export dist.set_timeout: the compat lanes on them run this."""
    own = dist.set_timeout
    assert not SHIM["dist_set_timeout"].missing()
    assert "dist_set_timeout" not in compat.install()
    assert dist.set_timeout is own and own.__module__.startswith("torch.")


# --------------------------------------------------------------------------
# check_config


def _config(backend: str):
    return types.SimpleNamespace(parallelism=types.SimpleNamespace(spmd_backend=backend))


@pytest.mark.parametrize("backend", ["spmd_types", "full_dtensor"])
def test_check_config_refuses_backends_fully_shard_cannot_run(monkeypatch, backend):
    def old_fully_shard(module, *, mesh=None, reshard_after_forward=None):
        raise AssertionError("not called")

    monkeypatch.setattr(fsdp, "fully_shard", old_fully_shard)
    with pytest.raises(ValueError, match=rf"{backend!r} needs fully_shard\(dp_mesh_dims=...\), which torch "
                                         rf"{re.escape(torch.__version__)} lacks.*'partial_dtensor'"):
        compat.check_config(_config(backend))
    compat.check_config(_config("partial_dtensor"))  # the working setting


@pytest.mark.parametrize("backend", ["spmd_types", "full_dtensor", "partial_dtensor"])
def test_check_config_accepts_where_fully_shard_takes_mesh_dims(monkeypatch, backend):
    def new_fully_shard(module, *, mesh=None, dp_mesh_dims=None):
        raise AssertionError("not called")

    monkeypatch.setattr(fsdp, "fully_shard", new_fully_shard)
    compat.check_config(_config(backend))


# --------------------------------------------------------------------------
# The .pth hook (torchtitan_patches/site/_skrull_ext_compat.py)

_HOOK = """
import importlib.util, sys
sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "_BeforeTorchtitan"]  # an installed copy's
sys.modules.pop("_skrull_ext_compat", None)
assert "torchtitan" not in sys.modules
import torch.distributed.fsdp as fsdp
if hasattr(fsdp, "DataParallelMeshDims"):
    del fsdp.DataParallelMeshDims  # as on torch 2.11-2.12
if {hook}:
    spec = importlib.util.spec_from_file_location("_skrull_ext_compat", {path!r})
    hook = importlib.util.module_from_spec(spec)
    sys.modules["_skrull_ext_compat"] = hook
    spec.loader.exec_module(hook)
    assert "torchtitan" not in sys.modules  # the hook waits for torchtitan's import
try:
    import torchtitan.distributed.full_dtensor
except ImportError as e:
    print("ImportError:", e)
else:
    print("imported; DataParallelMeshDims from", fsdp.DataParallelMeshDims.__module__)
"""


def _run_hook(hook: bool) -> str:
    code = _HOOK.format(hook=hook, path=str(SITE / "_skrull_ext_compat.py"))
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}  # torch's import-time deprecations are not the question
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1]


@pytest.mark.slow
def test_pth_hook_installs_the_import_shims_before_torchtitan():
    assert (SITE / "skrull_ext_compat.pth").read_text().strip() == "import _skrull_ext_compat"
    assert _run_hook(True) == "imported; DataParallelMeshDims from torchtitan_patches.compat"


@pytest.mark.slow
def test_without_the_pth_hook_torchtitan_cannot_import():
    # the control: the test above would pass for nothing if torchtitan did not need the name
    assert _run_hook(False).startswith("ImportError: cannot import name 'DataParallelMeshDims'")
