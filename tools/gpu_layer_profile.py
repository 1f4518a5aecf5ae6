"""Where one transformer block's forward+backward spends its time, as the
offline profiler runs it (skrull_ext.profile.compute.BufferRun): wall ms per
buffer, then cProfile's and torch.profiler's top entries. A diagnostic for a
lent GPU: the 2026-11-27 H100 profile fitted 12.7 ms of fixed cost per layer.

    python tools/gpu_layer_profile.py --config-file JOB [job overrides]
"""

import cProfile
import pstats
import sys
import time

import torch

from skrull_ext.profile.compute import BufferRun
from skrull_ext.profile.model import build_job_model
from skrull_ext.train.job.job_file import load_config


def main() -> None:
    quick = "--quick" in sys.argv  # per-block times only
    config = load_config([a for a in sys.argv[1:] if a != "--quick"], module="skrull_ext.profile")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(0)
    jm = build_job_model(config, device, config.model_spec.model.max_seq_len)
    print("dtype", jm.dtype, "dacp", jm.dacp, "device", device)
    for docs, layers in (((128,), 1), ((16384,), 1)) if quick else (((128,), 1), ((128,), 0), ((8192,), 1),
                                                                        ((2048,) * 4, 1)):
        run = BufferRun(jm, docs, layers)
        for _ in range(3):
            run.time_us()
        t = time.perf_counter()
        ms = [run.time_us()[0] / 1e3 for _ in range(5)]
        print(f"docs {docs} layers {layers or len(jm.layers)}: per block {sorted(ms)[2]:.2f} ms "
              f"(loop {1e3 * (time.perf_counter() - t) / 5:.1f} ms a call)", flush=True)
    if quick:
        return
    run = BufferRun(jm, (128,), 1)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(5):
        run.time_us()
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    with torch.profiler.profile() as p:
        for _ in range(3):
            run.time_us()
    print(p.key_averages().table(sort_by="cpu_time_total", row_limit=30, max_name_column_width=60))


if __name__ == "__main__":
    main()
