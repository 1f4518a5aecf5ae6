"""The core's planning latency at DP 128 x CP 8 with and without a host floor (docs/profile.md,
"The host floor"): the same global batches (8,192 sequences of mix_sharegpt_conv95+longbench_en5,
BucketSize 26,624, the preset's Qwen2.5-0.5B on the assumed H100, policy skrull or POLICY), each planned once per
timeline by ``_core.schedule``; prints the p50, the plans' mean makespan and slots, and a digest of every
plan (each sequence's DP rank, micro-batch and CP rank) as one JSON line.

    PYTHONPATH=TREE python tools/floor_latency.py [FLOOR_US] [BATCHES] [POLICY]

Run it under two checkouts alternately (before/after a core change: the same batches, so equal plans
read equal makespans and equal digests); FLOOR_US > 0 needs a core with ``CostModel.host_floor_us``."""
import hashlib
import json
import random
import statistics
import sys
import time

import skrull_ext
from skrull_ext import SchedulerConfig, _core, lengths
from skrull_ext.scheduler import cost_model as cm

floor = float(sys.argv[1]) if len(sys.argv) > 1 else 0.0
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
policy = sys.argv[3] if len(sys.argv) > 3 else "skrull"
c = cm.preset()
if floor:
    c = _core.CostModel(c.shape, c.a_us_per_flop, c.b_us, c.comm, c.micro_batch_fixed_us, c.step_fixed_us,
                        c.token_us, c.attention_weight, c.whole_buffer, floor)
pool = lengths.load("mix_sharegpt_conv95+longbench_en5")
limit = _core.max_sequence_length(26624, 8)
rng = random.Random(0)
batches = [[min(limit, int(rng.choice(pool))) for _ in range(8192)] for _ in range(reps)]
out = {"tree": skrull_ext.__file__, "floor_us": floor, "policy": policy}
for timeline in ("lockstep", "free"):
    opt = SchedulerConfig(dp=128, cp=8, bucket_size=26624, policy=policy, timeline=timeline).core_options()
    _core.schedule(batches[0], c, opt)  # warm
    us, makespan, slots, digest = [], [], [], hashlib.sha256()
    for b in batches:
        t = time.perf_counter()
        s = _core.schedule(b, c, opt)
        us.append((time.perf_counter() - t) * 1e6)
        makespan.append(s.makespan_us)
        slots.append(max(s.micro_batch) + 1)
        digest.update(repr((list(s.dp_rank), list(s.micro_batch), list(s.cp_rank))).encode())
    out[timeline] = {"p50_us": round(statistics.median(us), 1), "mean_makespan_us": statistics.mean(makespan),
                     "mean_slots": statistics.mean(slots), "plans_sha256": digest.hexdigest()[:16]}
print(json.dumps(out))
