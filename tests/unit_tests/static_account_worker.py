"""One rank of test_profile_static_account.py: the debug job's model at FSDP 2 over gloo, its static
account, what it holds, and the ladder's peak with and without FSDP's buffers gathered beforehand,
saved to OUT/rank{RANK}.pt.

    forked.launch(2, "tests.unit_tests.static_account_worker", [OUT], ...)  (torchrun's RANK, WORLD_SIZE)
"""

import os
import sys
from pathlib import Path

import torch

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


if __name__ == "__main__":
    out = sys.argv[1]
    _worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), str(Path(out) / "store"), out)
