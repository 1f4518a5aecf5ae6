"""torchtitan_patches: which fixes apply here, idempotence, and the CPU
attention fallback being the same attention as FlexAttention's forward."""

import logging
import os
import time

import pytest
import torch
from torch.nn.attention.flex_attention import and_masks, create_block_mask, flex_attention
from torchtitan.models.common.attention import (
    get_causal_mask_mod,
    get_efficient_causal_mask_mod_for_packed_document,
)

import torchtitan_patches
from torchtitan_patches.dense_attention import DenseMaskAttention

cpu_only = pytest.mark.skipif(not torchtitan_patches.on_cpu(), reason="CPU-only fixes")


def _config():
    """The debug job without the fixes (the registry functions apply them)."""
    from skrull_ext.train.config_registry import JOBS_DIR
    from skrull_ext.train.job.job_file import load_job

    return load_job(f"{JOBS_DIR}/debug_cpu.toml")


@cpu_only
def test_apply_on_cpu_patches_config_once():
    config = _config()
    applied = torchtitan_patches.apply(config)
    assert {"spmd_backend_partial_dtensor", "fsdp_on_gloo",
            "dense_mask_attention", "no_cuda_graphs"} <= set(applied)
    assert config.parallelism.spmd_backend == "partial_dtensor"
    assert "torchtitan_patches.overrides.cpu_dense_mask_attention" in config.override.imports
    assert config.model_spec.parallelize_fn._skrull_fsdp_on_gloo
    assert torchtitan_patches.apply(config) == []  # idempotent


@cpu_only
def test_device_probe_points_at_cpu():
    torchtitan_patches.apply()
    from torchtitan.distributed import utils as dist_utils
    from torchtitan.tools import utils

    assert utils.device_type == "cpu" and dist_utils.device_type == "cpu"
    assert utils.device_module.current_device() == 0
    assert hasattr(torch.distributed, "set_timeout")


def test_unknown_skip_is_an_error():
    with pytest.raises(ValueError, match="unknown torchtitan_patches fixes"):
        torchtitan_patches.apply(skip=["nope"])


def test_every_fix_says_why():
    for fix in torchtitan_patches.FIXES:
        assert len(fix.why) > 40, fix.name


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_dense_mask_attention_matches_flex_forward():
    torch.manual_seed(0)
    positions = torch.cat([torch.arange(100), torch.arange(28), torch.arange(128)])[None]
    mask_mod = and_masks(
        get_causal_mask_mod(), get_efficient_causal_mask_mod_for_packed_document(positions)
    )
    block_mask = create_block_mask(mask_mod, 1, None, 256, 256, device="cpu")
    q, k, v = (torch.randn(1, 256, 4, 16) for _ in range(3))
    out = DenseMaskAttention(DenseMaskAttention.Config())(q, k, v, attention_masks=block_mask)
    with torch.no_grad():
        ref = flex_attention(*(t.transpose(1, 2) for t in (q, k, v)), block_mask=block_mask)
    torch.testing.assert_close(out, ref.transpose(1, 2), rtol=1e-5, atol=1e-5)


@cpu_only
def test_a_new_config_gets_the_fixes_when_an_old_one_is_gone():
    # apply() remembers the configs it fixed by id; a freed config's id, reused by
    # the next one, once made apply skip that one's fixes (on torch 2.11 then
    # compat.check_config refused its spmd_types backend)
    for _ in range(12):
        config = _config()
        torchtitan_patches.apply(config)
        assert config.parallelism.spmd_backend == "partial_dtensor"
        del config


def test_log_colour_only_on_a_terminal(monkeypatch):
    """Issue 50: a log redirected to a file was full of ANSI colour codes."""
    import io

    from torchtitan_patches.metrics import colour_terminal

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    assert colour_terminal(Terminal()) is True
    assert colour_terminal(io.StringIO()) is False  # a file or a pipe
    monkeypatch.setenv("NO_COLOR", "1")
    assert colour_terminal(Terminal()) is False


@cpu_only
def test_trainer_ends_without_the_fixed_sleep():
    torchtitan_patches.apply()
    import torchtitan.trainer as trainer_module

    assert trainer_module.time.sleep(2) is None  # returns at once: the barrier waits instead
    assert trainer_module.time.perf_counter is time.perf_counter  # the loop's own timing is time's
    assert trainer_module.Trainer.train.__wrapped__.__qualname__ == "Trainer.train"
    from torchtitan.tools.logging import logger

    said = logging.LogRecord("t", logging.INFO, "", 0, "Sleeping 2 seconds for other ranks to complete", (), None)
    assert not logger.filter(said)  # the line that no longer holds is not said


def _rank_finishes(rank: int, store: str, marker: str) -> None:
    from tests.unit_tests.gloo_worker import gloo_group

    def train() -> None:
        if rank == 1:  # the slow rank: its last step ends after rank 0's
            time.sleep(0.5)
            open(marker, "w").close()

    with gloo_group(store, rank, 2):
        torchtitan_patches.barrier_after(train)()
        if rank == 0 and not os.path.exists(marker):
            raise AssertionError("rank 0 went on before rank 1 had finished")


@pytest.mark.slow
def test_no_rank_goes_on_before_the_slowest_has_finished(tmp_path):
    import torch.multiprocessing as mp

    mp.spawn(_rank_finishes, args=(str(tmp_path / "store"), str(tmp_path / "done")), nprocs=2)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # dynamo's, were it to compile: fail on the count
def test_block_masks_are_built_without_compiling_on_cpu():
    """torchtitan's create_attention_mask and, under CP, torch's _create_cp_block_mask (each a
    torch.compile'd create_block_mask) cost every CPU training process a dynamo trace and an inductor
    compile (2-5 s a rank); after apply() they build the same BlockMasks eagerly."""
    import inspect
    import types

    from torch._dynamo.utils import counters
    from torch.distributed.tensor.experimental._context_parallel._attention import _create_cp_block_mask
    from torchtitan.models.common.attention import create_attention_mask

    torchtitan_patches.apply()
    positions = torch.cat([torch.arange(70), torch.arange(58), torch.arange(128)])[None]
    mask_mod = and_masks(get_causal_mask_mod(), get_efficient_causal_mask_mod_for_packed_document(positions))
    traced = counters["stats"]["calls_captured"], counters["frames"]["total"]
    got = create_attention_mask(mask_mod, 1, None, 256, 256, device="cpu")
    cp_rank1 = types.SimpleNamespace(size=lambda: 2, get_local_rank=lambda: 1, device_type="cpu")  # a CP mesh's view
    # by keyword, as torch's _context_parallel_shard calls it; torch 2.15 added BLOCK_SIZE (the global mask's)
    takes_block = "BLOCK_SIZE" in inspect.signature(_create_cp_block_mask).parameters
    cp_block = {"BLOCK_SIZE": got.BLOCK_SIZE} if takes_block else {}
    got_cp = _create_cp_block_mask(mask_mod=mask_mod, B=1, H=None, Q_LEN=256, KV_LEN=256, device_mesh=cp_rank1,
                                   **cp_block)
    assert (counters["stats"]["calls_captured"], counters["frames"]["total"]) == traced  # nothing traced
    want = create_block_mask(mask_mod, 1, None, 256, 256, device="cpu")
    assert got.seq_lengths == want.seq_lengths == (256, 256) and got_cp.seq_lengths == (128, 256)
    assert torch.equal(got.to_dense(), want.to_dense())
    for a, b in zip(got.as_tuple(flatten=True)[2:], want.as_tuple(flatten=True)[2:]):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b)


def test_masks_past_the_eager_limit_stay_compiled():
    """Eager construction costs about 14x the compiled call (tools/block_mask_cost.py): past
    EAGER_MASK_ENTRIES (batch x queries x keys) the compiled function builds the mask."""
    from torchtitan_patches.dense_attention import EAGER_MASK_ENTRIES, eager_below

    create = eager_below(EAGER_MASK_ENTRIES, lambda *a, **k: ("eager", a[1:], k),
                         lambda *a, **k: ("compiled", a[1:], k))
    assert create(None, 4, None, 512, 512, device="cpu") == ("eager", (4, None, 512, 512), {"device": "cpu"})
    assert create.compiled(None, 4, None, 512, 512)[0] == "compiled"
    assert create(None, None, None, 1024, 1024)[0] == "eager"  # B None: one row
    assert create(None, 4, None, 512, 513)[0] == "compiled"
    assert create(None, 1, None, 2048, 2048, "cpu", (128, 128))[:2] == (
        "compiled", (1, None, 2048, 2048, "cpu", (128, 128)))
