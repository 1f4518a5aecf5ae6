"""The profile's static account against what a rank holds, at FSDP 2 over gloo (profile/memory.py).

The memory ladder's model is FSDP-wrapped as the trainer's is (profile/model.py), so every
step it measures gathers each unit's parameters (and makes their gradients before the
reduce-scatter) above its starting point: FSDP's unsharded buffers are in the fitted peak,
as they are in the training check's peak above the step's start (profile/train_check.py).
The static account must then be the sharded tensors a rank keeps between steps and nothing
more; it once added the buffers again (13.0 MiB on the debug job at FSDP 2), so a profile's
prediction exceeded what a run measures by that much.
"""

import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from tests.unit_tests.gloo_worker import gloo_group

ROOT = Path(__file__).resolve().parents[2]
DEBUG = str(ROOT / "skrull_ext" / "jobs" / "debug_cpu.toml")
TOKENS = 256


def _worker(rank: int, world: int, store: str, out: str) -> None:
    from torch.distributed.fsdp import FSDPModule

    from skrull_ext.profile.check import _optimizer_state_bytes
    from skrull_ext.profile.memory import CpuTensorPeak, local_bytes, measure_step, static_memory
    from skrull_ext.profile.model import build_job_model
    from skrull_ext.train.job.job_file import load_config
    from torchtitan_patches import logs

    os.chdir(ROOT)
    logs.install()
    with gloo_group(store, rank, world):
        config = load_config(["--config-file", DEBUG], module="skrull_ext.profile", world_size=world)
        jm = build_job_model(config, torch.device("cpu"), 1024)
        optimizer_bytes, opt = _optimizer_state_bytes(jm)  # the state a stepped optimizer keeps
        meter = CpuTensorPeak()
        measure_step(jm, [128], meter)  # parameter gradients allocated, as the ladder starts
        params = list(jm.model.parameters())
        held = local_bytes(params) + local_bytes(p.grad for p in params) + optimizer_bytes
        account = static_memory(jm, world)
        peak = measure_step(jm, [TOKENS], meter).peak
        # The same step with every unit's parameters gathered before the meter starts and kept:
        # what the peak loses is the unsharded parameters the ladder's step allocated.
        for unit in (m for m in jm.model.modules() if isinstance(m, FSDPModule)):
            unit.set_reshard_after_forward(False)
            unit.set_reshard_after_backward(False)
        measure_step(jm, [128], meter)
        gathered_before = measure_step(jm, [TOKENS], meter).peak
        head = jm.model.lm_head.weight
        torch.save({"held": held, "account": account.total, "fsdp_degree": account.fsdp_degree, "peak": peak,
                    "gathered_before": gathered_before, "head_bytes": head.numel() * head.element_size()},
                   Path(out) / f"rank{rank}.pt")
        del opt


@pytest.mark.slow
def test_static_account_is_what_a_rank_holds_and_the_peak_holds_fsdp_buffers(tmp_path):
    """Two gloo ranks, the debug job (6.16M float32 parameters, AdamW): the account is exactly the
    rank's half of parameters, gradients and optimizer state (47.0 MiB; with FSDP's buffers added
    it read 60.0), and the ladder's peak at 256 tokens holds at least the head's unsharded weight
    (the [norm, lm_head] unit stays gathered from the forward to the backward)."""
    mp.start_processes(_worker, args=(2, str(tmp_path / "store"), str(tmp_path)), nprocs=2, start_method="spawn")
    for rank in range(2):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        print(f"rank {rank}: {got}")
        assert got["fsdp_degree"] == 2
        assert got["account"] == got["held"]
        assert got["peak"] - got["gathered_before"] >= got["head_bytes"]
