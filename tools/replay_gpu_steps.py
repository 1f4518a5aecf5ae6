"""Price a GPU run's Skrull steps again with another profile: measured / predicted
per step, without a GPU.

    python tools/replay_gpu_steps.py docs/results/data/gpu_2026-11-28_skrull_steps.json \
        --profile profiles/h200-qwen2.5-0.5b-2026-11-28.toml

The JSON holds each length mix's logged ``skrull/measured_us`` per step (and what
the run predicted), and the job flags the run trained with
(tools/gpu_checks.sh). The steps' global batches are drawn again from the same
seeded lengths and planned by the scheduler with ``--profile``'s cost model;
the measured time of each step over the new prediction is summarised per mix
after ``--warmup`` steps. As a check, the run's own profile gives back the
ratios it logged. A script, not a test: nothing asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

JOB = "skrull_ext/jobs/qwen2_5_0_5b_gpu.toml"


def replay(data: dict, profile: str, warmup: int) -> list[str]:
    from skrull_ext.data.steps.loader import SkrullDataLoader
    from skrull_ext.scheduler.config import job_timeline
    from skrull_ext.scheduler.model_shape import job_shape
    from skrull_ext.train.job.job_file import load_config

    lines = []
    for mix, run in data["runs"].items():
        flags = ["--config-file", JOB, *data["job_flags"], "--dataloader.lengths", mix, "--dataloader.vocab_size",
                 "1000", "--skrull.cost_model", profile]
        cfg = load_config(flags, check=False)
        loader = SkrullDataLoader(cfg.dataloader, dp_world_size=1, dp_rank=0, tokenizer=None)
        scheduler = cfg.skrull.build(1, 1, job_shape(cfg), "qwen2_5/0.5B", timeline=job_timeline(1, 1, False, False),
                                     free_running=False, bucket_size=data["bucket_size"], lookahead=1)
        ratios = sorted(us / scheduler.schedule([n for _, n in loader.step_lengths(int(k))]).makespan_us
                        for k, us in run["measured_us"].items() if int(k) > warmup)
        logged = statistics.median(run["measured_us"][k] / run["predicted_us_as_run"][k]
                                   for k in run["measured_us"] if int(k) > warmup)
        lines.append(f"{mix}: measured/predicted median x{statistics.median(ratios):.3f} "
                     f"(p10 x{ratios[len(ratios) // 10]:.3f}, p90 x{ratios[9 * len(ratios) // 10]:.3f}) over "
                     f"{len(ratios)} steps; as run x{logged:.3f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("steps", help="a run's steps (docs/results/data/*_skrull_steps.json)")
    p.add_argument("--profile", required=True, help="the profile to price them with")
    p.add_argument("--warmup", type=int, default=4, help="first steps left out (default 4, as the run's report)")
    a = p.parse_args(argv)
    with open(a.steps) as f:
        data = json.load(f)
    print("\n".join(replay(data, a.profile, a.warmup)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
