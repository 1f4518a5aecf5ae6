"""The data path at scale: prepare throughput, store size, and a rank's memory
while training on 100K and on 1M samples.

    python -m skrull_ext.bench data                       # 100K and 1M samples, 2 workers
    python -m skrull_ext.bench data --sizes 10000 100000  # quicker

For each size it writes a generated chat corpus (JSONL, OpenAI ``messages``:
a user turn and an assistant turn), its lengths drawn from a shipped length
distribution with the long tail of real SFT data (``--lengths``, divided by
``--length-scale`` so 1M samples fit this machine's disk and time: the shape
of the mix is kept, the token count scales), then

1. prepares its token store (``skrull_ext.prepare`` with ``--workers``
   processes): samples/s, tokens/s, the store's size beside the corpus';
2. trains ``--steps`` steps of the shipped CPU text job on it under torchrun
   (``--nproc`` ranks, CP = nproc) and samples every rank's resident memory
   (``/proc/PID/status``, Linux) every 50 ms: the peak per rank; for sizes
   up to ``--in-memory-max`` also with ``token_cache = false`` (every rank
   tokenizes the corpus into memory, as before the store), for comparison.

The store is memory-mapped, so the peak should not grow with the corpus:
only the index arrays (24 bytes a sample) and the pages of the samples a
rank trains are resident. docs/data.md keeps the measured table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

from skrull_ext import lengths as shipped_lengths

JOB = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "jobs", "debug_cpu_text.toml")
WORDS = ("the a of to and in is it that for on with as was at by this be from or an are not have had but what "
         "all were when we there can more one about which their time if will would so no out up into has these "
         "data model train long short sequence token batch rank memory plan group local shard step loss").split()
TOKENS_PER_WORD = 2.2
"""About what the shipped tiny BPE tokenizer gives per word of WORDS (lengths come out near the target)."""


def generate(path: str, n: int, dist: str, scale: float, seed: int = 0) -> None:
    """``n`` chats whose token lengths follow ``dist`` / ``scale`` (a third prompt, the rest reply)."""
    rng = np.random.default_rng(seed)
    pool = np.asarray(shipped_lengths.load(dist), dtype=np.float64)
    target = np.maximum(pool[rng.integers(0, len(pool), n)] / scale, 8)
    words = np.maximum((target / TOKENS_PER_WORD).astype(np.int64), 4)
    vocab = np.asarray(WORDS)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        for start in range(0, n, 10000):
            lines = []
            for w in words[start:start + 10000]:
                text = vocab[rng.integers(0, len(vocab), w)]
                cut = max(1, int(w) // 3)
                lines.append(json.dumps({"messages": [
                    {"role": "user", "content": " ".join(text[:cut])},
                    {"role": "assistant", "content": " ".join(text[cut:])}]}))
            f.write("\n".join(lines) + "\n")
    os.rename(tmp, path)


def folder_bytes(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))


def prepare(corpus: str, cache: str, workers: int) -> dict:
    """Run ``skrull_ext.prepare`` in a fresh process; its wall time and the store it wrote."""
    cmd = [sys.executable, "-m", "skrull_ext.prepare", JOB, "--workers", str(workers),
           "--dataloader.dataset_path", corpus, "--dataloader.token_cache_dir", cache]
    start = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if out.returncode != 0:
        raise SystemExit(f"prepare failed ({out.returncode}):\n{out.stderr[-3000:]}")
    folder = out.stdout.strip().rsplit("-> ", 1)[-1]
    with open(os.path.join(folder, "meta.json")) as f:
        meta = json.load(f)
    return {"seconds": seconds, "records": meta["records"], "tokens": meta["tokens"], "store": folder,
            "store_bytes": folder_bytes(folder), "corpus_bytes": os.path.getsize(corpus)}


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _rss_and_rank(pid: int) -> tuple[int, int | None]:
    """(VmRSS bytes, RANK of a torchrun worker or None)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            rss = next((int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:")), 0)
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
    except OSError:
        return 0, None
    rank = env.get(b"RANK")
    return rss, int(rank) if rank is not None and b"TORCHELASTIC_RUN_ID" in env else None


def train(corpus: str, cache: str, nproc: int, steps: int, out: str, store: bool = True) -> list[int]:
    """Train on the corpus under torchrun; the peak resident memory of each rank."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "skrull_ext.train", "--config-file", JOB, "--parallelism.context_parallel_degree", str(nproc),
           "--training.steps", str(steps), "--dataloader.dataset_path", corpus,
           "--dataloader.token_cache_dir", cache, "--dump_folder", out,
           *([] if store else ["--dataloader.no-token_cache"])]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    os.makedirs(out, exist_ok=True)
    peaks: dict[int, int] = {}
    with open(os.path.join(out, "log.txt"), "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        while proc.poll() is None:
            for pid in _descendants(proc.pid):
                rss, rank = _rss_and_rank(pid)
                if rank is not None:
                    peaks[rank] = max(peaks.get(rank, 0), rss)
            time.sleep(0.05)
    if proc.returncode != 0:
        with open(os.path.join(out, "log.txt")) as f:
            tail = "".join(f.readlines()[-20:])
        raise SystemExit(f"training failed ({proc.returncode}), {out}/log.txt:\n{tail}")
    return [peaks.get(r, 0) for r in range(nproc)]


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m skrull_ext.bench data", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000], help="corpus sizes (samples)")
    p.add_argument("--lengths", default="mix_sharegpt_conv95+longbench_en5", help="shipped length distribution")
    p.add_argument("--length-scale", type=float, default=32.0, help="divide drawn lengths by this")
    p.add_argument("--workers", type=int, default=2, help="prepare processes")
    p.add_argument("--nproc", type=int, default=2, help="training ranks (CP degree)")
    p.add_argument("--steps", type=int, default=4, help="training steps per corpus")
    p.add_argument("--in-memory-max", type=int, default=100_000,
                   help="also train with token_cache = false on corpora up to this size")
    p.add_argument("--out", default="outputs/bench_data", help="corpora, stores, runs and the table")
    a = p.parse_args(argv)
    for key in ("workers", "nproc", "steps"):
        if getattr(a, key) < 1:
            p.error(f"--{key} {getattr(a, key)}: must be >= 1")
    if min(a.sizes) < 1:
        p.error(f"--sizes must be >= 1, got {min(a.sizes)}")
    if not a.length_scale > 0:
        p.error(f"--length-scale must be > 0, got {a.length_scale}")
    shipped_lengths.load(a.lengths, "--lengths")  # a bad name or file: one line before any corpus is written
    return a


def table(rows: list[dict]) -> str:
    head = ("| samples | tokens | prepare s | samples/s | tokens/s | corpus MiB | store MiB | "
            "peak RSS per rank, store (MiB) | in memory (MiB) |\n|---:|---:|---:|---:|---:|---:|---:|---|---|")
    lines = [head]

    def mib(peaks):
        return " / ".join(f"{b / 2**20:.0f}" for b in peaks) if peaks else "-"

    for r in rows:
        lines.append(f"| {r['records']:,} | {r['tokens']:,} | {r['seconds']:.0f} | {r['records'] / r['seconds']:,.0f} "
                     f"| {r['tokens'] / r['seconds']:,.0f} | {r['corpus_bytes'] / 2**20:.0f} | "
                     f"{r['store_bytes'] / 2**20:.0f} | {mib(r['peak_rss'])} | {mib(r['peak_rss_in_memory'])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    out = os.path.abspath(a.out)
    os.makedirs(out, exist_ok=True)
    rows = []
    for n in a.sizes:
        corpus = os.path.join(out, f"chats_{n}_{a.lengths}_s{a.length_scale:g}.jsonl")
        if not os.path.exists(corpus):
            print(f"[{n:,}] generating {corpus} ...", flush=True)
            generate(corpus, n, a.lengths, a.length_scale)
        cache = os.path.join(out, f"cache_{n}")
        shutil.rmtree(cache, ignore_errors=True)  # time a build, not an open
        print(f"[{n:,}] prepare ({a.workers} workers) ...", flush=True)
        row = prepare(corpus, cache, a.workers)
        print(f"[{n:,}] {row['records'] / row['seconds']:,.0f} samples/s; training {a.steps} steps on "
              f"{a.nproc} ranks ...", flush=True)
        row["peak_rss"] = train(corpus, cache, a.nproc, a.steps, os.path.join(out, f"run_{n}"))
        row["peak_rss_in_memory"] = None
        if n <= a.in_memory_max:
            print(f"[{n:,}] training again with token_cache = false ...", flush=True)
            row["peak_rss_in_memory"] = train(corpus, cache, a.nproc, a.steps, os.path.join(out, f"run_{n}_mem"),
                                              store=False)
        rows.append(row)
    md = table(rows)
    header = (f"{a.lengths} / {a.length_scale:g}, prepare with {a.workers} processes, training: "
              f"{os.path.relpath(JOB)} at CP {a.nproc}, {a.steps} steps\n\n")
    with open(os.path.join(out, "bench_data.md"), "w") as f:
        f.write(header + md + "\n")
    with open(os.path.join(out, "bench_data.json"), "w") as f:
        json.dump({"args": vars(a), "rows": rows}, f, indent=1)
    print("\n" + header + md + f"\n\nwrote {out}/bench_data.md, .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
