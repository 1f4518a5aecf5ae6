"""Build a job's token store ahead of torchrun.

    python -m skrull_ext.prepare JOB.toml [--workers N] [--SECTION.KEY VALUE ...]

Tokenizes the job's jsonl/hf source (each source of a mixture) into its
memory-mapped store with a pool of processes; a training job then opens the
store as is (a build on first use inside a training job runs in one
process). Flags after the job file override its keys as they do for
skrull_ext.train (e.g. ``--dataloader.dataset_path FILE``).

A command of the package root, like ``export``: it reads a whole job
(skrull_ext/train/job_file.py: which loader, which tokenizer, a HF folder's
tokenizer files), so it stands above the rooms it uses and the data room
never imports the trainer's job code. The store itself is
skrull_ext/data/prepare.py.
"""

import argparse
import os

from skrull_ext.cli_errors import run_cli
from skrull_ext.data.checks import check_data
from skrull_ext.data.prepare import cached_sequences
from skrull_ext.data.source import mixture_configs
from skrull_ext.train.job_file import load_config

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m skrull_ext.prepare",
                                description="tokenize the job's jsonl/hf source into its memory-mapped store")
    p.add_argument("job", help="the job's TOML file")
    p.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1),
                   help="tokenizer processes (default: the cores, at most 8)")
    args, overrides = p.parse_known_args(argv)
    if args.workers < 1:
        p.error(f"--workers {args.workers}: must be >= 1")
    config = load_config(["--config-file", args.job, *overrides], module="skrull_ext.prepare", check=False)
    check_data(config.dataloader)  # the launch checks (world size, device) wait for torchrun; the data's are ours
    data = config.dataloader
    if data.dataset not in ("jsonl", "hf", "mixture"):
        p.error(f"{args.job}: dataloader.dataset = {data.dataset!r} has no text to prepare")
    tokenizer = config.tokenizer.build(tokenizer_path=config.hf_assets_path)
    # A mixture: each source into its own store, once (a store shared by two jobs is built once too).
    named = ([(e.display_name() + ": ", c) for e, c in mixture_configs(data)] if data.dataset == "mixture"
             else [("", data)])
    for name, source in named:
        seqs = cached_sequences(source, tokenizer, workers=args.workers)
        m = seqs.store.meta
        bad = f", {len(seqs.bad)} skipped as bad (the first: {seqs.bad[0]})" if seqs.bad else ""
        print(f"{name}prepared {m['records']} records, {m['tokens']} tokens{bad} -> {seqs.store.folder}")
    return 0


if __name__ == "__main__":
    run_cli(main)
