"""``python -m skrull_ext.bench simulate``: every policy on the same global batches.

    python -m skrull_ext.bench simulate                         # paper + real suites, both models
    python -m skrull_ext.bench simulate --suite paper --iterations 100
    python -m skrull_ext.bench simulate --datasets chatqa2 --models qwen2.5-7b --dp 2 --cp 16 --batch-size 40
    python -m skrull_ext.bench simulate --lengths my_data.lengths.txt     # your own lengths, one per line
    python -m skrull_ext.bench simulate --lookahead 2,4,8,16 --policies skrull,sorted   # [skrull] lookahead
    python -m skrull_ext.bench simulate --overlength chunk --cp 2 --bucket-size 16384 --timeline free

Writes results.md, results.json, speedup.png and iteration_time.png to
--out and prints one line naming the fastest policy a job can run on equal
work (report.winner_line), the summary tables and a legend of every row,
column and figure printed. baseline and bound
always run: every speedup and gap is relative to them. Gaps are to two
bounds of the job's global batches: the classic one (all work spread over
the world, or the longest sequence alone) and, on lockstep, the
lockstep-aware one (the longest sequence's slot, then the slots the rest
needs); skrull_ext/sim/bound.py. Defaults finish in well under two
minutes on two cores. Sequences longer than a CP group holds are cut
before planning; a run that cut any prints a warning line naming the cells
and counts above the tables (and in results.md).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from tqdm import tqdm

from skrull_ext import _core
from skrull_ext import lengths as length_files
from skrull_ext.errors import DataError
from skrull_ext.scheduler import cost_model as cost_models
from skrull_ext.scheduler.config import TIMELINES
from skrull_ext.scheduler.profile_file import Profile
from skrull_ext.sim import policies as sim_policies
from skrull_ext.sim import scenarios, simulator


def _csv(s: str) -> list[str]:
    return [x for x in (p.strip() for p in s.split(",")) if x]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m skrull_ext.bench simulate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", choices=sorted(scenarios.SUITES), default="all",
                   help="dataset set: the paper's Table 1 distributions, the real files, or both (default all)")
    p.add_argument("--datasets", type=_csv, help="comma list overriding --suite (see skrull_ext.sim.datasets)")
    p.add_argument("--lengths", action="append", metavar="FILE",
                   help="a lengths file of your own (one positive integer per line, the format and reader of "
                        "[dataloader] lengths); repeatable; replaces --suite, adds to --datasets")
    p.add_argument("--models", type=_csv, default=list(scenarios.MODELS), help="comma list of model presets (default: %(default)s)")
    p.add_argument("--dp", type=int, help="DP ranks (default: the paper's setting per cell)")
    p.add_argument("--cp", type=int, help="CP ranks per group (default: the paper's setting per cell)")
    p.add_argument("--batch-size", type=int, help="sequences per DP rank per step (default: paper's)")
    p.add_argument("--bucket-size", type=int,
                   help="BucketSize, tokens per rank (default: the profile's [memory] bucket_size if it has one, "
                        "else the paper's 26K for 0.5B, 13K for 7B)")
    p.add_argument("--timeline", choices=sorted(TIMELINES), default="lockstep",
                   help="the step's timeline every plan is timed on: lockstep (FSDP over the DP ranks, what the "
                        "shipped jobs run) or free (each DP rank back to back, the paper's) (default: %(default)s)")
    p.add_argument("--capacity", type=int, help="tokens a rank really holds, for the overflow count (default: BucketSize)")
    p.add_argument("--policies", type=_csv, default=list(sim_policies.DEFAULT),
                   help=f"comma list from {list(sim_policies.SIM_POLICIES)} (default: all but sorted+skrull)")
    p.add_argument("--lookahead", type=_csv, default=[], metavar="W[,W...]",
                   help="also run skrull with [skrull] lookahead = W for each W (policies skrull+lookaheadW: each "
                        "window of W global batches regrouped, compared on the same samples; default: none)")
    p.add_argument("--overlength", choices=("truncate", "chunk"), default="truncate",
                   help="chunk: also run skrull+chunk ([skrull] overlength = \"chunk\": every sequence whole, those "
                        "beyond a CP group trained in chunks on the DP rank the core assigns) and chunkflow+whole "
                        "(the ChunkFlow peer on the same whole sequences), in their own table and chunked.png "
                        "(default: %(default)s: sequences beyond a CP group cut for every row)")
    p.add_argument("--iterations", type=int, default=100, help="global batches per cell (default 100)")
    p.add_argument("--seed", type=int, default=0, help="sampler and shuffle seed (default 0)")
    p.add_argument("--profile", type=Path, help=f"hardware profile TOML (default {cost_models.HARDWARE_PRESETS['h100-assumed'].name}, assumed)")
    p.add_argument("--plan-margin", type=float,
                   help="plan with every exchange at this multiple of its price, times at 1x ([comm] plan_margin; "
                        "default: the profile's, 1.5 on the assumed H100, 1 on measured profiles)")
    p.add_argument("--out", type=Path, default=Path("outputs/simulate"), help="output folder (default outputs/simulate)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def _policy_shown(bar: tqdm, cell) -> Callable[[str], None]:
    """The bar's postfix names the policy being planned, redrawn at most twice a second: an
    iteration of a large shape is a minute long, most of it in one policy or another."""
    shown = [time.monotonic()]

    def show(policy: str) -> None:
        if (now := time.monotonic()) - shown[0] >= 0.5:
            bar.set_postfix_str(f"{cell.dataset} / {cell.model}: {policy}")
            shown[0] = now

    return show


def main(argv: Sequence[str] | None = None) -> int:
    cli = parser()
    args = cli.parse_args(argv)
    argv = list(sys.argv[1:] if argv is None else argv)
    policies = list(args.policies)
    for w in args.lookahead:
        if not w.isdigit() or not 1 <= int(w) <= _core.MAX_LOOKAHEAD:
            cli.error(f"--lookahead must be integers in [1, {_core.MAX_LOOKAHEAD}], got {w!r}")
        if (name := f"{sim_policies.LOOKAHEAD}{int(w)}") not in policies:
            policies.append(name)
    if args.overlength == "chunk":
        policies += [p for p in sim_policies.CHUNK if p not in policies]
    for must in ("baseline", "bound"):
        if must not in policies:
            policies.insert(0 if must == "baseline" else len(policies), must)
    if args.iterations < 1:
        cli.error(f"--iterations must be >= 1, got {args.iterations}")
    if args.plan_margin is not None and not 1.0 <= args.plan_margin <= _core.MAX_PLAN_MARGIN:
        cli.error(f"--plan-margin must be in [1, {_core.MAX_PLAN_MARGIN:g}], got {args.plan_margin}")
    for path in args.lengths or ():
        length_files.load(path, "--lengths")  # a bad file: DataError, one line naming file:line (run_cli)
    try:  # bad names and values become usage errors, not tracebacks
        names = [*(args.datasets or ([] if args.lengths else scenarios.SUITES[args.suite])), *(args.lengths or ())]
        for p in policies:
            sim_policies.get(p)
        profile = Profile.load(args.profile) if args.profile else cost_models.hardware()
        if args.plan_margin is not None:
            profile = profile.with_plan_margin(args.plan_margin)
        if args.bucket_size is None and (failed := profile.failed_check()) is not None:
            raise ValueError(f"--profile {args.profile}: {failed}, so its BucketSize is not one to simulate with; "
                             "name --bucket-size, or re-measure the profile (python -m skrull_ext.profile)")
        bucket = args.bucket_size if args.bucket_size is not None else profile.bucket_size
        cells = scenarios.grid(names, args.models, dp=args.dp, cp=args.cp,
                               batch_size=args.batch_size, bucket_size=bucket, capacity=args.capacity,
                               timeline=args.timeline)
        for cell in cells:
            profile.cost_model(cost_models.shape(cell.model), repr(cell.model))
    except DataError:  # a --datasets entry that is a bad lengths file: one line too
        raise
    except ValueError as e:
        cli.error(str(e))
    started = time.perf_counter()
    results = []
    with tqdm(total=len(cells) * args.iterations, unit="it", disable=args.quiet, file=sys.stderr) as bar:
        for cell in cells:
            bar.set_postfix_str(f"{cell.dataset} / {cell.model}")
            results.append(simulator.simulate(cell, policies, args.iterations, args.seed, profile,
                                              on_iteration=bar.update, on_policy=_policy_shown(bar, cell)))
    from skrull_ext.bench import report  # after the run: keeps --help fast

    meta = {"command": "python -m skrull_ext.bench simulate " + shlex.join(argv), "profile": profile.label,
            "timeline": args.timeline,
            "iterations": args.iterations, "seed": args.seed, "wall_s": time.perf_counter() - started,
            "policies": policies}
    written = report.write(results, args.out, meta)
    if not args.no_plots:
        from skrull_ext.bench import plots

        written += plots.write(results, args.out, profile.label)
    print(f"hardware profile: {profile.label}; timeline {args.timeline}\n")  # measured file or the assumed H100
    if warning := report.truncation_warning(results):
        print(warning + "\n")
    if winner := report.winner_line(results):
        print(winner + "\n")
    print(report.summary_markdown(results))
    print()
    print(report.matrix_markdown(results))
    if pool := report.pool_markdown(results):
        print("\n" + pool)
    if chunk := report.chunk_markdown(results):
        print("\n" + chunk)
    print("\n" + report.legend(results))
    print(f"\nwrote {', '.join(str(p) for p in written)} ({meta['wall_s']:.0f} s)")
    return 0
