"""Where a GPU job's predicted Skrull step goes, term by term of the cost model.

    python tools/step_terms.py --profile profiles/h200-qwen2.5-0.5b.toml --mode none \
        --mixes mix_sharegpt_conv95+longbench_en5 mix_sharegpt_conv+longbench_en [--global-batch 32]

The steps the GPU script trains (tools/gpu_checks.sh: global batch 8 unless
``--global-batch``, rows and
``max_len`` 16,384, DP 1 x CP 1) are drawn again from the seeded lengths and
planned by the job's scheduler at the mode's BucketSize. Each micro-batch of
each plan is priced by the core (``CostModel.micro_batch_us``), then again
with one term of the cost model set to 0 at a time: the difference is that
term's share (the linear layers, the attention at its fitted weight, the
per-layer calls ``b``, the embedding/head/loss per token, the fixed cost of a
micro-batch, what the host floor adds to calls under it, and the step's own
term outside its micro-batches). The terms
add up to the plan's makespan, which is checked. A decomposition of the
prediction, not a measurement: the GPU run's measured/predicted ratio says
how far to trust it. Prints the mean of each term over the steps after
``--warmup`` and the document-aware MFU the step would reach without the
fixed terms (calls, micro-batch and step fixed costs) at the same FLOP rates.
"""

from __future__ import annotations

import argparse
import statistics

JOB = "skrull_ext/jobs/qwen2_5_0_5b_gpu.toml"
FLAGS = ["--parallelism.data_parallel_shard_degree", "1", "--parallelism.context_parallel_degree", "1",
         "--dataloader.max_len", "16384", "--training.seq_len", "16384", "--dataloader.vocab_size", "1000"]
TERMS = ("linear layers", "attention", "per-layer calls (b)", "embedding/head/loss a token",
         "micro-batch fixed", "host floor", "step fixed")


def _priced(cm, seqs: list[int]) -> float:
    flops = [cm.flops(n) for n in seqs]
    return cm.micro_batch_us([sum(flops)], 0.0, 0.0, sum(seqs))


_FIELDS = ("a_us_per_flop", "b_us", "micro_batch_fixed_us", "step_fixed_us", "token_us", "attention_weight",
           "whole_buffer", "host_floor_us")


def _with(cm, **changes):
    """The core's cost model with some fields changed (it has no copy)."""
    from skrull_ext._core import CostModel

    f = {k: getattr(cm, k) for k in _FIELDS} | changes
    return CostModel(cm.shape, f.pop("a_us_per_flop"), f.pop("b_us"), cm.comm, **f)


_ZEROED = {"per-layer calls (b)": "b_us", "embedding/head/loss a token": "token_us",
           "micro-batch fixed": "micro_batch_fixed_us"}


def terms_of_step(cm, step_fixed_us: float, micro_batches: list[list[int]]) -> dict[str, float]:
    """Each term's microseconds in one step of one DP x CP rank (CP 1: every sequence local). The
    host floor's term is what the floor adds to the line's price (calls held up to it); the
    other terms are the line's, set to 0 one at a time without the floor."""
    floored = sum(_priced(cm, s) for s in micro_batches)
    cm = _with(cm, host_floor_us=0.0)
    total = sum(_priced(cm, s) for s in micro_batches)
    # The attention term is linear in its weight (the core refuses 0): the compute at weight w and at 2w.
    no_compute, doubled = _with(cm, a_us_per_flop=0.0), _with(cm, attention_weight=2 * cm.attention_weight)
    rest = sum(_priced(no_compute, s) for s in micro_batches)
    compute = total - rest
    attention = sum(_priced(doubled, s) for s in micro_batches) - total
    linear = compute - attention
    out = {"linear layers": linear, "attention": attention}
    for term in TERMS[2:5]:
        out[term] = total - sum(_priced(_with(cm, **{_ZEROED[term]: 0.0}), s) for s in micro_batches)
    out["host floor"] = floored - total
    out["step fixed"] = step_fixed_us
    return out


def main(argv: list[str] | None = None) -> int:
    from skrull_ext.data.steps.loader import SkrullDataLoader
    from skrull_ext.scheduler.config import job_timeline
    from skrull_ext.scheduler.model_shape import job_shape
    from skrull_ext.scheduler.profile_file import Profile
    from skrull_ext.train.job.job_file import load_config

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", required=True)
    p.add_argument("--mode", default=None, help="activation-checkpointing mode the run chose (the profile's per-mode fit)")
    p.add_argument("--mixes", nargs="+", required=True)
    p.add_argument("--steps", type=int, default=44)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--global-batch", type=int, default=8, help="sequences a step (the GPU script's: 8)")
    a = p.parse_args(argv)
    prof = Profile.load(a.profile)
    if a.mode:
        prof = prof.under_mode(a.mode)
    step_fixed = float(prof.data.get("step", {}).get("fixed_us", 0.0))
    for mix in a.mixes:
        cfg = load_config(["--config-file", JOB, *FLAGS, "--dataloader.global_batch_size", str(a.global_batch),
                           "--dataloader.lengths", mix, "--skrull.cost_model", a.profile,
                           "--training.steps", str(a.steps)], check=False)
        if a.mode:
            cfg.skrull.use_checkpointing(a.mode)  # as the trainer does at start-up (train/checkpointing.py)
        loader = SkrullDataLoader(cfg.dataloader, dp_world_size=1, dp_rank=0, tokenizer=None)
        scheduler = cfg.skrull.build(1, 1, job_shape(cfg), "qwen2_5/0.5B", timeline=job_timeline(1, 1, False, False),
                                     free_running=False, bucket_size=prof.bucket_size, lookahead=1)
        per_term = {t: [] for t in TERMS}
        mbs = []
        for k in range(a.warmup + 1, a.steps + 1):
            lengths = [n for _, n in loader.step_lengths(k)]
            plan = scheduler.schedule(lengths)
            groups = [[lengths[i] for i in mb.seqs] for mb in plan.ranks[0]]
            got = terms_of_step(scheduler.cost_model, step_fixed, groups)
            assert abs(sum(got.values()) - plan.makespan_us) <= 1e-6 * plan.makespan_us + 1e-3, (
                sum(got.values()), plan.makespan_us)
            for t in TERMS:
                per_term[t].append(got[t] / 1e3)
            mbs.append(len(groups))
        total = sum(statistics.mean(v) for v in per_term.values())
        fixed = sum(statistics.mean(per_term[t])
                    for t in ("per-layer calls (b)", "micro-batch fixed", "host floor", "step fixed"))
        print(f"{mix}: predicted step {total:.1f} ms (mean of steps {a.warmup + 1}..{a.steps}, global batch "
              f"{a.global_batch}, "
              f"{statistics.mean(mbs):.2f} micro-batches a step, BucketSize {prof.bucket_size:,}, {a.profile}"
              f"{', mode ' + a.mode if a.mode else ''})")
        print("| term | ms | share |\n|---|---|---|")
        for t in TERMS:
            v = statistics.mean(per_term[t])
            print(f"| {t} | {v:.1f} | {100 * v / total:.1f}% |")
        print(f"without the fixed terms (calls, micro-batch and step fixed costs, the host floor: "
              f"{100 * fixed / total:.1f}%), the "
              f"same FLOPs in x{(total - fixed) / total:.2f} the time\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
