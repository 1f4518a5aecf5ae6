"""skrull vs skrull-pool core latency, interleaved per batch (the two alternate first), so machine load
hits both alike: PYTHONPATH=. python tools/pool_latency.py (docs/latency.md, "skrull-pool")."""
import random
import statistics
import sys
import time

from skrull_ext import SchedulerConfig, _core, lengths
from skrull_ext.scheduler import cost_model as cm

cost = cm.preset()
pool = lengths.load("mix_sharegpt_conv95+longbench_en5")
for name, dp, reps in (("paper", 4, 200), ("large", 128, 40)):
    rng = random.Random(0)
    bs = [[rng.choice(pool) for _ in range(dp * 64)] for _ in range(reps)]
    o = SchedulerConfig(dp=dp, cp=8, policy="skrull", overlength="truncate").core_options()
    sk, po, ratio, wid = [], [], [], 0
    for i, b in enumerate(bs):
        for first in (0, 1):
            pair = {}
            for which in ((0, 1) if first == 0 else (1, 0)):
                t0 = time.perf_counter_ns()
                r = (_core.schedule if which == 0 else _core.schedule_pool)(b, cost, o)
                pair[which] = (time.perf_counter_ns() - t0) / 1e3
                if which == 1 and first == 0: wid += r.widened > 0
            sk.append(pair[0]); po.append(pair[1]); ratio.append(pair[1] / pair[0])
    print(f"{name}: skrull p50 {statistics.median(sk):.0f} us, skrull-pool p50 {statistics.median(po):.0f} us, "
          f"ratio of p50 {statistics.median(po)/statistics.median(sk):.2f}, median per-batch ratio {statistics.median(ratio):.2f}, "
          f"batches widened {wid}/{reps}", flush=True)
