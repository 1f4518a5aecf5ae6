"""Re-price a recorded Skrull training run under other profiles, with no device: each step's
global batch is drawn again by the job's own loader, planned by the scheduler under the
profile's cost model (its fits for ``--mode``, at that mode's BucketSize, one DP rank: the
free-running timeline), and its makespan set against the step the run measured
(``skrull/measured_us`` in the run's TensorBoard events). The run's own profile re-prices
to what it logged (``skrull/predicted_us``): the last column says how far it is from that.

    python tools/reprice_run.py RUN_DIR --mode none --steps 44 --warmup 4 \\
        --profile OLD.toml --profile NEW.toml -- --config-file JOB.toml [the run's job flags]

One line per profile: measured / predicted, median over the steps after ``--warmup``, with
its 10th and 90th percentiles, and the mean predicted step. A script, not a test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

from skrull_ext.bench.train_report import scalars
from skrull_ext.scheduler import Scheduler
from skrull_ext.scheduler.config import job_timeline
from skrull_ext.scheduler.job import SchedulerJob
from skrull_ext.scheduler.profile_file import Profile
from skrull_ext.train.job.job_file import JobConfigManager


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="the Skrull run's dump folder (its tb/ events)")
    p.add_argument("--profile", action="append", required=True)
    p.add_argument("--mode", default=None, help="activation-checkpointing mode the run ran (default: the profile's)")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--warmup", type=int, default=4)
    a = p.parse_args(argv[:split])
    if split == len(argv):
        p.error("the run's job flags go after '--': -- --config-file JOB.toml [its flags]")
    missing = [x for x in (a.run, *a.profile) if not os.path.exists(x)]
    if missing:
        p.error(f"no such file or folder: {', '.join(missing)}")
    config = JobConfigManager().parse_args(argv[split + 1:])
    tokenizer = config.tokenizer.build(tokenizer_path=config.hf_assets_path)
    source = config.dataloader.build(dp_world_size=1, dp_rank=0, tokenizer=tokenizer).source
    gbs = config.dataloader.global_batch_size
    tags = scalars(a.run)
    measured, recorded = tags["skrull/measured_us"], tags["skrull/predicted_us"]
    keep = [k for k in range(a.warmup + 1, a.steps + 1) if k in measured and k in recorded]
    print(f"{a.run}: steps {keep[0]}..{keep[-1]} ({len(keep)}), as logged: measured / predicted "
          f"x{statistics.median(measured[k] / recorded[k] for k in keep):.4f}")
    for path in a.profile:
        profile = Profile.load(path)
        profile = profile.under_mode(a.mode) if a.mode else profile
        job = SchedulerJob.of(config.skrull, dp=1, cp=1, timeline=job_timeline(1, 1, False, config.skrull.defer_grad_sync),
                              cost_model=profile.cost_model(), bucket_size=profile.bucket_size, lookahead=1)
        scheduler = Scheduler(job)
        pred = {k: scheduler.schedule([source.length(i) for i in source.global_batch(k, gbs)]).makespan_us for k in keep}
        r = sorted(measured[k] / pred[k] for k in keep)
        print(f"{path}: measured / predicted x{statistics.median(r):.4f} (p10 x{r[len(r) // 10]:.3f}, "
              f"p90 x{r[9 * len(r) // 10]:.3f}), mean predicted {statistics.mean(pred.values()) / 1e3:.1f} ms; "
              f"largest |predicted / logged - 1| {max(abs(pred[k] / recorded[k] - 1) for k in keep):.2%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
