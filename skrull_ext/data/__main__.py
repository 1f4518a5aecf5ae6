"""python -m skrull_ext.data prepare JOB.toml [--workers N]: build the job's token store."""

import argparse

from skrull_ext.datasets.prepare import cached_sequences
from skrull_ext.job_file import load_job


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m skrull_ext.data")
    sub = p.add_subparsers(dest="cmd", required=True)
    prep = sub.add_parser("prepare", help="tokenize the job's jsonl/hf source into its memory-mapped store")
    prep.add_argument("job")
    prep.add_argument("--workers", type=int, default=None)
    args = p.parse_args(argv)
    config = load_job(args.job)
    if config.dataloader.dataset not in ("jsonl", "hf"):
        p.error(f"{args.job}: dataloader.dataset = {config.dataloader.dataset!r} has no text to prepare")
    tokenizer = config.tokenizer.build(tokenizer_path=config.hf_assets_path)
    seqs = cached_sequences(config.dataloader, tokenizer, workers=args.workers)
    m = seqs.store.meta
    print(f"prepared {m['records']} records, {m['tokens']} tokens -> {seqs.store.folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
