"""One-off measurement (docs/latency.md, "Look-ahead"): how long ``lookahead = "auto"`` takes to
decide at a large shape. Draws the run's first 64 global batches from a shipped length file
(limited to what a CP group holds), then calls ``lookahead_choice.choose`` as the trainer does
with the H200 profile's scheduler, and prints the choice, its wall and CPU time.

    PYTHONPATH=. python tools/lookahead_auto_time.py [DP]      # default DP 128, CP 8, 64 samples a rank
"""

import random
import sys
import time

from skrull_ext import Scheduler, SchedulerConfig, _core, lengths
from skrull_ext.data.steps.lookahead_choice import HORIZON, choose
from skrull_ext.scheduler import cost_model as cm
from skrull_ext.scheduler.profile_file import Profile

PROFILE = "profiles/h200-qwen2.5-0.5b-2026-11-28.toml"
DATASET = "mix_sharegpt_conv95+longbench_en5"


def main(dp: int) -> None:
    profile = Profile.load(PROFILE)
    bucket = profile.bucket_size
    sched = Scheduler(SchedulerConfig(dp=dp, cp=8, bucket_size=bucket, overlength="truncate"),
                      profile.cost_model(cm.shape("qwen2.5-0.5b")))
    pool, limit, rng = lengths.load(DATASET), _core.max_sequence_length(bucket, 8), random.Random(0)
    batches = {s: [min(limit, rng.choice(pool)) for _ in range(64 * dp)] for s in range(1, HORIZON + 1)}
    wall, cpu = time.perf_counter(), time.thread_time()
    choice = choose(batches.__getitem__, sched, HORIZON)
    print(f"DP {dp} x CP 8, {DATASET}, {PROFILE}: wall {time.perf_counter() - wall:.1f} s, "
          f"CPU {time.thread_time() - cpu:.1f} s")
    print(choice.line())


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 128)
