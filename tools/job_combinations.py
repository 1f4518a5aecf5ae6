"""Random combinations of the shipped CPU jobs' keys, each launched as a user launches it.

    python tools/job_combinations.py --seed 1 --count 40 --out /tmp/combos
    python tools/job_combinations.py --seed 3 --count 20 --resume 0.5   # half of them stopped and resumed
    python tools/job_combinations.py --seed 5 --count 20 --hf           # tiny HF folders of each family too
    python tools/job_combinations.py --seed 9 --count 20 --resume 1 --reshape 0.5  # half resumed on another world

Each combination draws a shipped CPU job (debug, LoRA, real text; ``--hf``: the debug job on a
tiny HF folder of each family too), a world of 1-4 processes
(DP x CP x TP), and values of the keys a user sets: the policy, look-ahead, over-length mode,
checkpointing (the job's kind, or Skrull's choice), prefetch, the head in chunks, compile
(aot_eager), validation, the global batch, max_len and seq_len. It runs ``python -m skrull_ext.train``
(``torch.distributed.run`` for more than one process) and sorts the outcome:

- ``ok``: exit 0;
- ``refused``: a one-line error (exit 2, or torchrun's summary naming it), the job's mistake;
- ``BUG``: a Python traceback from a rank, or a run past the time limit;
- ``DIFF``: a resumed run whose steps differ from the same job's run without a stop.

Under ``--resume P`` a combination is, with probability P, run with a checkpoint every step, then
resumed from its checkpoint of a drawn step in a folder of its own (as a run stopped there is
launched again); both must exit 0, the resumed launch must log the losses and gradient norms of
the run without a stop for every later step and the same run summary's totals, and, without
look-ahead, those must count every sample the run's steps read. Under ``--reshape R`` a share R
of them is resumed on another world (DP x CP x TP drawn again, as a user continues on fewer or
more devices): one that runs must count as many samples read over the run as the run without a
stop (another CP group may cut otherwise, and sums run in another order, so losses are not
compared). Each run's command and output are kept under
``--out/NNN/``; ``--out/results.json`` lists them all. A combination found broken becomes a
test beside the code it breaks; this is how the 2026-12-01 fixes were found (the chunked
record cut at max_len, compiled TP with checkpointing on torch 2.13).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOBS = ["debug_cpu.toml"] * 4 + ["debug_cpu_lora.toml", "debug_cpu_text.toml"]
WORLDS = [(1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 1, 2), (2, 2, 1), (1, 4, 1), (1, 2, 2), (4, 1, 1), (2, 1, 2)]
"""(DP shard, CP, TP): 1-4 processes."""
DEGREES = ("data_parallel_shard", "context_parallel", "tensor_parallel")


def hf_jobs(out: Path) -> list[str]:
    """The debug job pointed at a tiny random HF folder of each family (tests/integration_tests/
    hf_folders.py: Qwen2.5, Llama 3, Qwen3, saved with transformers here, no download), loaded
    through the checkpointer as a user's released model is; their job files' paths."""
    sys.path.insert(0, str(ROOT))
    from tests.integration_tests.hf_folders import FAMILIES, hf_job, save_tiny_model

    made = []
    for family in FAMILIES:
        folder = save_tiny_model(str(out / "hf" / family), family)
        made.append(hf_job(out / "hf" / f"{family}.toml", folder, "enable = true"))
    return made


def draw(rng: random.Random, hf: list[str]) -> tuple[str, int, list[str]]:
    """(job file, processes, flags) of one combination; ``hf``: job files of HF folders to draw too."""
    job = rng.choice(JOBS + hf)
    dp, cp, tp = rng.choice(WORLDS)
    steps = rng.choice([2, 3, 4])
    a = ["--training.steps", str(steps), "--parallelism.data_parallel_shard_degree", str(dp),
         "--parallelism.context_parallel_degree", str(cp), "--parallelism.tensor_parallel_degree", str(tp)]
    if rng.random() < 0.15:
        a += ["--skrull.no-enable", "--dataloader.packing", rng.choice(["rows", "stream"])]
    else:
        a += ["--skrull.policy", rng.choice(["skrull", "skrull", "skrull-fast", "skrull-paper", "skrull-per-rank",
                                             "skrull-pool", "worstfit"]),
              "--skrull.lookahead", rng.choice(["1", "2", "4", "auto"]),
              "--skrull.overlength", rng.choice(["truncate", "drop", "chunk", "chunk"]),
              "--skrull.activation_checkpoint", rng.choice(["auto", "job"])]
        for p, flags in ((0.3, ["--skrull.defer_grad_sync"]),
                         (0.3, ["--skrull.free_running", rng.choice(["auto", "true", "false"])]),
                         (0.3, ["--skrull.kv_exchange", rng.choice(["auto", "p2p", "all_gather"])]),
                         (0.3, ["--skrull.attention_kernel", rng.choice(["auto", "dense", "tiles"])]),
                         (0.2, ["--skrull.cpsat"]), (0.2, ["--skrull.plan_log"])):
            if rng.random() < p:
                a += flags
        if rng.random() < 0.25:  # the held-out set, evaluated every 2 steps under the same scheduler
            held_out = (["--validation.dataset_path", "tests/fixtures/held_out.jsonl"] if job == "debug_cpu_text.toml"
                        else ["--validation.samples", "8"])
            a += ["--validation.enable", "--validation.freq", "2", *held_out]
    a += ["--dataloader.prefetch_steps", rng.choice(["0", "1", "2"]),
          "--activation_checkpoint.kind", rng.choice(["none", "selective", "full"])]
    if rng.random() < 0.3:
        a += ["--loss.chunk_tokens", rng.choice(["64", "100", "256"]),
              "--loss.head_backward", rng.choice(["auto", "recompute", "in_forward"])]
    if os.path.isabs(job) and rng.random() < 0.4:  # an HF folder: a LoRA on it
        a += ["--lora.enable", "--lora.rank", "4"] + (["--lora.save_merged"] if rng.random() < 0.5 else [])
    if rng.random() < 0.25:
        a += ["--compile.enable", "--compile.backend", "aot_eager"]
    if rng.random() < 0.2:
        a += ["--dataloader.global_batch_size", rng.choice(["4", "12", "16"])]
    if rng.random() < 0.2:
        a += ["--dataloader.max_len", rng.choice(["300", "1024", "2048"]),
              "--training.seq_len", rng.choice(["512", "1024", "2048"])]
    return job, dp * cp * tp, a


def launch(python: str, job: str, n: int, flags: list[str], timeout: float) -> tuple[object, str]:
    """(exit status or 'timeout', stdout + stderr) of one launch."""
    launcher = [python, "-m", "skrull_ext.train"] if n == 1 else [
        python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(n), "-m", "skrull_ext.train"]
    cmd = [*launcher, "--config-file", job if os.path.isabs(job) else f"skrull_ext/jobs/{job}", *flags]
    try:
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        return p.returncode, " ".join(cmd) + "\n\n" + p.stdout + p.stderr
    except subprocess.TimeoutExpired:
        return "timeout", " ".join(cmd) + "\n\n(past the time limit)"


def outcome(rc: object, text: str, n: int) -> str:
    if rc == "timeout" or re.search(r"\[rank\d+\]: Traceback", text) or (n == 1 and "Traceback" in text):
        return "BUG"
    return "ok" if rc == 0 else "refused"


SAMPLES_READ = re.compile(r"Run summary: samples read (\d+) ")
"""A run summary's count of samples read over every launch."""
RUN_TOTALS = re.compile(r"Run summary: (samples read .*?) over the run")
"""A run summary's totals over every launch: what was read, and how each sample went."""
STEP_LINE = re.compile(r"step:\s+(\d+)\s+loss:\s+(\S+)\s+grad_norm:\s+(\S+)")


def resume_differences(resumed: str, reference: str, after: int) -> list[str]:
    """How a launch resumed after step ``after`` differs from the run without a stop: each later step
    whose loss or gradient norm (as logged: 5 and 4 decimals) it logged otherwise, or did not log, and
    the run summary's totals over every launch (look-ahead or not); [] where all agree."""
    ref = {int(m.group(1)): m.groups()[1:] for m in STEP_LINE.finditer(reference)}
    got = {int(m.group(1)): m.groups()[1:] for m in STEP_LINE.finditer(resumed)}
    diff = [f"step {s}: loss, grad_norm {got.get(s)} resumed, {ref[s]} without a stop"
            for s in sorted(ref) if s > after and got.get(s) != ref[s]]
    totals = [m.group(1) if (m := RUN_TOTALS.search(text)) else None for text in (resumed, reference)]
    if totals[0] != totals[1]:
        diff.append(f"run summary: {totals[0]} resumed, {totals[1]} without a stop")
    return diff


def read_differences(resumed: str, reference: str, after: int) -> list[str]:
    """Where a launch resumed on another world (after step ``after``) counts another number of
    samples read over the run than the run without a stop; [] where both count the same."""
    counts = [m.group(1) if (m := SAMPLES_READ.search(text)) else None
              for text in (resumed, reference)]
    return [] if counts[0] == counts[1] else [f"samples read over the run: {counts[0]} resumed after step {after} "
                                              f"on another world, {counts[1]} without a stop"]


def with_value(flags: list[str], key: str, value: str) -> list[str]:
    """``flags`` with ``key`` set to ``value`` (replaced where it is, added where it is not)."""
    if key not in flags:
        return [*flags, key, value]
    at = flags.index(key)
    return [*flags[:at + 1], value, *flags[at + 2:]]


def flag(flags: list[str], key: str, default: str) -> str:
    return flags[flags.index(key) + 1] if key in flags else default


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--count", type=int, default=30)
    parser.add_argument("--resume", type=float, default=0.0, help="share of combinations stopped and resumed")
    parser.add_argument("--out", default="/tmp/job_combinations")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a launch may take")
    parser.add_argument("--hf", action="store_true", help="draw tiny HF folders of each family too")
    parser.add_argument("--reshape", type=float, default=0.0,
                        help="share of the resumed combinations resumed on another world (DP x CP x TP)")
    args = parser.parse_args()
    rng, out, results = random.Random(args.seed), Path(args.out).resolve(), []
    hf = hf_jobs(out) if args.hf else []
    for k in range(args.count):
        job, n, flags = draw(rng, hf)
        folder = out / f"{k:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        flags += ["--job.dump_folder", str(folder / "run")]
        resume = rng.random() < args.resume
        start, texts = time.time(), []
        if resume:
            flags += ["--checkpoint.enable", "--checkpoint.interval", "1"]
        rc, text = launch(args.python, job, n, flags, args.timeout)
        texts.append(text)
        kind = outcome(rc, text, n)
        steps = int(flag(flags, "--training.steps", "2"))
        if resume and kind == "ok":
            # Stopped after step `at` and launched again: a copy of the run's checkpoint of that step in a
            # folder of its own, the same job resumed from it (the job unchanged: a shorter first launch
            # would change what depends on training.steps, the learning rate's schedule, a window's width)
            at = random.Random(f"{args.seed}-{k}").randint(1, steps - 1)
            again, saved = folder / "resumed", folder / "run" / "checkpoint" / f"step-{at}"
            if not saved.is_dir():
                kind = "BUG"
                texts.append(f"the run saved no checkpoint of step {at} ({saved})")
        if resume and kind == "ok":
            shutil.copytree(saved, again / "checkpoint" / f"step-{at}")
            first, full, m = text, flags, n
            flags = with_value(flags, "--job.dump_folder", str(again))
            worlds = random.Random(f"{args.seed}-{k}-world")
            reshaped = worlds.random() < args.reshape
            if reshaped:  # resumed on another world: DP, CP and TP degrees drawn again
                world = worlds.choice(
                    [w for w in WORLDS if w != tuple(int(flag(flags, f"--parallelism.{key}_degree", "1"))
                                                    for key in DEGREES)])
                for key, degree in zip(DEGREES, world):
                    flags = with_value(flags, f"--parallelism.{key}_degree", str(degree))
                m = world[0] * world[1] * world[2]
            rc, text = launch(args.python, job, m, flags, args.timeout)
            texts.append(text)
            kind = outcome(rc, text, m)
            # another world may cut otherwise (a CP group's capacity) and sums in another order: there,
            # only every sample read counted as the run without a stop counts it; none under 'stream' and
            # 'documents' packing, whose step is DP x local_batch_size rows of tokens (fewer ranks, fewer
            # samples a step)
            streamed = flag(flags, "--dataloader.packing", "") in ("stream", "documents")
            if not reshaped:
                diff = resume_differences(text, first, after=at)
            else:
                diff = [] if streamed else read_differences(text, first, after=at)
            if kind == "ok" and diff:
                kind = "DIFF"
                texts.append(f"resumed after step {at} vs the run without a stop:\n" + "\n".join(diff))
            flags = full
        if resume and kind == "ok" and flag(flags, "--skrull.lookahead", "") == "1":
            # every sample the steps read counted, across the two launches (a look-ahead window may end
            # inside the run and count what it trained: checked where there is none)
            gbs = int(flag(flags, "--dataloader.global_batch_size", "8"))
            summary = SAMPLES_READ.search(text)
            if summary is None or int(summary.group(1)) != gbs * steps:
                kind = "BUG"
        (folder / "output.txt").write_text("\n\n----- next launch -----\n\n".join(texts))
        tail = [line for line in texts[-1].splitlines() if line.strip()][-3:]
        results.append({"k": k, "outcome": kind, "rc": rc, "resumed": resume, "seconds": round(time.time() - start, 1),
                        "job": job, "processes": n, "flags": flags, "tail": tail})
        print(f"{k:03d} {kind:8s} rc={rc} {time.time() - start:5.1f}s n={n} {'resumed ' if resume else ''}{job} "
              f"{' '.join(flags)}", flush=True)
        if kind != "ok":
            for line in tail:
                print("      " + line[:400], flush=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    bad = sum(r["outcome"] in ("BUG", "DIFF") for r in results)
    print(f"{len(results)} combinations: {sum(r['outcome'] == 'ok' for r in results)} ok, "
          f"{sum(r['outcome'] == 'refused' for r in results)} refused, {bad} BUG or DIFF ({out}/results.json)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
