# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""Command line of the offline profiler (docs/profile.md has the numbers).

    python -m skrull_ext.profile --config-file skrull_ext/jobs/debug_cpu.toml \\
        --memory-limit 1GiB --out profiles/cpu-debug.toml
    torchrun --standalone --nproc_per_node 2 -m skrull_ext.profile \\
        --config-file skrull_ext/jobs/debug_cpu.toml --memory-limit 1GiB \\
        --out profiles/cpu-debug-gloo2.toml

One process measures compute and memory; under torchrun every rank
measures (so compute is timed under the same contention as training) and
the collectives are timed too (gloo on CPU, NCCL on CUDA). Rank 0 writes the
profile and a PNG beside it. Flags this parser does not know are the job's
(``--parallelism.data_parallel_shard_degree 8``), as in ``skrull_ext.train``.
Exits 1, naming the fit and its bound, when a held-out length misses by more
than ``--max-held-out-error``, a packed (multi-document) buffer by more than
``--max-packed-error``, a step time the micro-batch line (micro_batch.py) by
more than ``--max-micro-batch-error``, or the BucketSize check fails (the file is still
written, to look at); 2 on a bad option or job file.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import math
import os
import platform
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

__all__ = ["failures", "main"]


def _parser() -> argparse.ArgumentParser:
    from skrull_ext.cli_errors import argument_type
    from skrull_ext.profile.options import ProfileOptions, parse_bytes, parse_ints
    from skrull_ext.scheduler.cost_model import HARDWARE_PRESETS  # --comm-from: was read only when writing the file

    d = ProfileOptions()
    p = argparse.ArgumentParser(prog="python -m skrull_ext.profile", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config-file", required=True, help="the job file (JOB.toml) whose model, dtype and parallelism are profiled")
    p.add_argument("--out", default="profile.toml", help="profile file to write (default: %(default)s)")
    p.add_argument("--plot", default=None, help="PNG of points vs fits (default: --out with .png)")
    p.add_argument("--no-plot", action="store_true", help="write no PNG (default: write one)")
    ints = argument_type(parse_ints, "ints")
    packed = argument_type(lambda s: tuple(parse_ints(b.replace("+", ",")) for b in s.split(";") if b), "buffers")
    p.add_argument("--lengths", type=ints, default=d.lengths,
                   help="compute ladder, e.g. 128,256,512 or 128:4096 (default: up to 2x the job's longest sequence)")
    p.add_argument("--held-out", type=ints, default=d.held_out,
                   help="lengths timed but not fitted, to test the fit (default: between the ladder's points)")
    p.add_argument("--packed", type=packed,
                   default=d.packed, help="multi-document buffers timed against their prediction (the summed "
                   "per-document FLOPs; one sequence of the buffer's length where the kernel attends over it whole), "
                   "e.g. '256+256;512+128' ('' for none; default: two derived from the job)")
    p.add_argument("--warmup", type=int, default=d.warmup, help="untimed rounds over all compute buffers (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=d.repeats,
                   help="timed rounds; the median per buffer is kept (default: %(default)s)")
    p.add_argument("--layers", type=int, default=d.layers, help="blocks timed per pass (0: all; default: %(default)s)")
    p.add_argument("--clock", default=d.clock, choices=("auto", "wall", "cpu"),
                   help="compute clock (auto: process CPU time for single-threaded CPU runs, else wall; default: %(default)s)")
    p.add_argument("--memory-lengths", type=ints, default=d.memory_lengths,
                   help="memory ladder (default: up to 4x the job's longest sequence)")
    p.add_argument("--memory-limit", type=argument_type(parse_bytes, "bytes"), default=d.memory_limit,
                   help="bytes one rank may use, e.g. 1GiB (default: device total)")
    p.add_argument("--margin", type=float, default=d.margin,
                   help="safety margin on BucketSize, a fraction of the activation budget left free for "
                        "what the fit misses (default: %(default)s)")
    p.add_argument("--world-size", type=int, default=d.world_size,
                   help="ranks of the job the profile is for (FSDP degree; default: this launch's)")
    p.add_argument("--comm-sizes", type=ints, default=d.comm_sizes, help="message bytes, e.g. 4KiB:16MiB (default: 4KiB:16MiB)")
    p.add_argument("--comm-repeats", type=int, default=d.comm_repeats,
                   help="timed rounds of the collectives (default: %(default)s)")
    p.add_argument("--comm-from", default="h100-assumed", choices=sorted(HARDWARE_PRESETS),
                   help="hardware preset for [comm] when one process measures none (default: %(default)s)")
    p.add_argument("--threads", type=int, default=d.threads, help="torch threads per rank (0: torch's default; default: %(default)s)")
    p.add_argument("--ac-modes", type=lambda s: tuple(m.strip() for m in s.split(",") if m.strip()),
                   default=d.ac_modes, help="activation-checkpointing modes measured besides the job's own, e.g. "
                   "none,selective,full ('' for none; default: all three)")
    p.add_argument("--no-check", action="store_true", help="skip the BucketSize memory check (default: run it)")
    p.add_argument("--micro-batch-counts", type=ints, default=d.micro_batch_counts,
                   help="micro-batches per step for the fixed-cost fit, the same tokens each (default: 1,2,4)")
    p.add_argument("--micro-batch-doc", type=int, default=d.micro_batch_doc,
                   help="tokens of each of that step's documents (default: %(default)s)")
    p.add_argument("--micro-batch-repeats", type=int, default=d.micro_batch_repeats,
                   help="timed rounds of those steps; the median per count is kept (default: %(default)s)")
    p.add_argument("--max-micro-batch-error", type=float, default=0.15,
                   help="fail (exit 1) when the step time misses the line over micro-batch counts by more than "
                        "this fraction (default: %(default)s)")
    p.add_argument("--max-held-out-error", type=float, default=0.15,
                   help="fail (exit 1) when a held-out length misses by more than this fraction (default: %(default)s)")
    p.add_argument("--max-packed-error", type=float, default=0.15,
                   help="fail (exit 1) when a packed buffer misses by more than this fraction (default: %(default)s)")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of the random tokens and check buffer (default: %(default)s)")
    return p


def _check_args(args: argparse.Namespace) -> None:
    """The bounds on the fits' errors (ProfileOptions holds the rest), checked before the model is built."""
    for name in ("max_micro_batch_error", "max_held_out_error", "max_packed_error"):
        value = getattr(args, name)
        if not (value >= 0 and math.isfinite(value)):  # nan would pass every bound it is compared with
            raise ValueError(f"--{name.replace('_', '-')}: must be a finite fraction >= 0, got {value}")


def _options(args: argparse.Namespace):
    """The parsed flags as ProfileOptions (its checks raise ValueError naming the option)."""
    from skrull_ext.profile.options import ProfileOptions

    return ProfileOptions(
        lengths=args.lengths, held_out=args.held_out, packed=args.packed, warmup=args.warmup,
        repeats=args.repeats, layers=args.layers, clock=args.clock, memory_lengths=args.memory_lengths,
        memory_limit=args.memory_limit, margin=args.margin, world_size=args.world_size,
        comm_sizes=args.comm_sizes, comm_repeats=args.comm_repeats, threads=args.threads,
        check=not args.no_check, seed=args.seed, micro_batch_counts=args.micro_batch_counts,
        micro_batch_doc=args.micro_batch_doc, micro_batch_repeats=args.micro_batch_repeats, ac_modes=args.ac_modes,
    )


def _device() -> torch.device:
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def _device_name(device: torch.device, world: int) -> str:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        total = torch.cuda.get_device_properties(device).total_memory / 2**30
        return f"{name} ({total:.0f} GiB), {world} process(es)"
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"cpu: {cpu}, {os.cpu_count()} cores, {torch.get_num_threads()} torch thread(s) x {world} process(es)"


def failures(compute, check, max_held_out: float, max_packed: float, micro_batch=None,
             max_micro_batch: float = 0.15) -> list[str]:
    """Why the profile cannot be trusted, one line per missed bound (empty: it can)."""
    out = []
    if micro_batch is not None and micro_batch.fit.max_rel_error > max_micro_batch:
        out.append(f"micro-batch fit: a step time misses the line over micro-batch counts by "
                   f"{micro_batch.fit.max_rel_error:.1%}, more than --max-micro-batch-error {max_micro_batch:.0%}")
    if compute.held_out_max_rel_error > max_held_out:
        out.append(f"compute fit: a held-out length misses by {compute.held_out_max_rel_error:.1%}, "
                   f"more than --max-held-out-error {max_held_out:.0%}")
    if compute.packed_max_rel_error > max_packed:
        priced = ("a buffer priced as one sequence of its length, as the kernel computes it"
                  if getattr(compute, "whole_buffer", False) else
                  "the scheduler predicts a micro-batch as the sum of its documents")
        out.append(f"compute fit: a packed buffer misses by {compute.packed_max_rel_error:.1%}, more than "
                   f"--max-packed-error {max_packed:.0%} ({priced})")
    if check is not None and not check.ok:
        out.append("BucketSize check: a buffer of BucketSize tokens used more memory than the budget; a job "
                   "refuses to take bucket_size = 'profile' from this file (re-profile with a lower --memory-limit "
                   "or a larger --margin)")
    return out


def main(argv: list[str] | None = None) -> int:
    import torchtitan
    from tqdm import tqdm

    from skrull_ext.profile.check import check_bucket
    from skrull_ext.profile.checkpointing import profile_modes, steps_per_mode
    from skrull_ext.profile.comm import profile_comm
    from skrull_ext.profile.compute import profile_compute
    from skrull_ext.profile.memory import freeze_heap, profile_memory
    from skrull_ext.profile.head import profile_head
    from skrull_ext.profile.micro_batch import DEVICE_BOUND_COUNTS, profile_micro_batch
    from skrull_ext.profile.step import profile_step
    from skrull_ext.profile.model import build_job_model, wrapping_line
    from skrull_ext.profile.plot import plot
    from skrull_ext.profile.ranks import is_main
    from skrull_ext.profile.writer import Profile, report, write
    from skrull_ext.scheduler.model_shape import model_compiled
    from skrull_ext.errors import UserError
    from skrull_ext.train.checkpointing import mode_of
    from skrull_ext.train.job.job_file import load_config
    from torchtitan_patches import logs

    from skrull_ext.train.allocator import allocator_line, use_expandable_segments

    allocator = use_expandable_segments()  # the allocator training runs with: its memory is what is measured
    logs.install()  # torchtitan's warnings about its own defaults (HF assets path, initial_load_model_only) dropped
    if (line := allocator_line(allocator)) is not None:
        print(line)
    t0 = time.perf_counter()
    argv = sys.argv[1:] if argv is None else argv
    args, job_args = _parser().parse_known_args(argv)
    try:
        _check_args(args)
        opts = _options(args)
    except ValueError as e:  # ProfileOptions' checks name the option: one line, exit 2
        raise UserError(str(e)) from None

    def config_of(*flags: str):
        return load_config(["--config-file", args.config_file, *job_args, *flags], module="skrull_ext.profile",
                           world_size=opts.world_size or None)

    config = config_of()
    longest = getattr(config.dataloader, "max_len", None) or config.training.seq_len
    opts = opts.for_job(longest, config.model_spec.model.max_seq_len)

    world = int(os.environ.get("WORLD_SIZE", "1"))
    device = _device()
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    if opts.threads:
        torch.set_num_threads(opts.threads)
    torch.manual_seed(opts.seed)
    target_world = opts.world_size or world

    steps = (2 * len(opts.lengths) + len(opts.held_out) + len(opts.packed or ())) * (opts.warmup + opts.repeats) \
        + len(opts.memory_lengths) \
        + (opts.comm_warmup + opts.comm_repeats if world > 1 else 0) + int(opts.check) + 1 \
        + (len(opts.micro_batch_counts) + 1 + len(DEVICE_BOUND_COUNTS)) * (opts.warmup + opts.micro_batch_repeats) \
        + len(set(opts.ac_modes) - {mode_of(config.activation_checkpoint)}) * steps_per_mode(opts)
    bar = tqdm(total=steps, desc="profile", disable=not is_main(), file=sys.stderr)

    def tick(what: str) -> None:
        bar.set_postfix_str(what, refresh=False)
        bar.update()

    try:
        tick("build model")
        # RoPE cache for the model's whole context: the check's BucketSize is not known yet.
        jm = build_job_model(config, device, config.model_spec.model.max_seq_len)
        freeze_heap()  # the imports and this model live to the end: the meters' collections skip them
        compute = profile_compute(jm, opts, tick)
        memory = profile_memory(jm, opts, target_world, tick)
        exchange = config.skrull.kv_exchange if hasattr(config, "skrull") else "auto"
        comm = profile_comm(device, jm.dtype, opts, tick, exchange) if world > 1 else None
        if opts.check:
            tick(f"check {memory.bucket_size} tokens")
        check = check_bucket(jm, memory.bucket_size, memory.predicted, memory.usable - memory.static.total,
                             memory.static.optimizer_states, opts.seed) if opts.check else None
        head = profile_head(jm, opts, tick)
        measured_mode, modes = profile_modes(
            config, lambda mode: config_of("--activation_checkpoint.kind", mode), opts.ac_modes, compute, memory,
            device, config.model_spec.model.max_seq_len, opts, target_world, tick)
        # Then the step outside its micro-batches, which steps the optimizer: nothing is measured after it.
        micro_batch = profile_micro_batch(jm, opts, compute, tick, limit=memory.bucket_size)
        step = profile_step(jm, opts, tick)
        bar.close()
        meta = {
            "source": "measured",
            "device": _device_name(device, world),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "torch": torch.__version__,
            "torchtitan": getattr(torchtitan, "__version__", "?"),
            "job": args.config_file,
            "command": " ".join(["python -m skrull_ext.profile", *argv]),
            "world_size": world,
            "job_world_size": target_world,
            "threads": torch.get_num_threads(),
            "elapsed_s": time.perf_counter() - t0,
            "attention": f"dacp:{config.skrull.attention_kernel}" if jm.dacp else "torchtitan",
            "compile": model_compiled(config),
            "wrapping": wrapping_line(jm.model),  # as the trainer wraps it (profile/model.py)
        }
        if comm is None:
            meta["comm_note"] = f"not measured (one process): [comm] is preset {args.comm_from!r}"
        prof = Profile(jm, compute, memory, comm, args.comm_from, check, meta, micro_batch, head, step, modes,
                       measured_mode)
        failed = failures(compute, check, args.max_held_out_error, args.max_packed_error, micro_batch,
                          args.max_micro_batch_error)
        if is_main():
            d = write(prof, args.out)
            print(report(prof))
            print(f"wrote {args.out}")
            if not args.no_plot:
                png = args.plot or str(Path(args.out).with_suffix(".png"))
                plot(d, png)
                print(f"wrote {png}")
            for f in failed:
                print(f"FAILED: {f}", file=sys.stderr)
        return 1 if failed else 0
    finally:
        bar.close()
        gc.unfreeze()  # a caller in this process (a test) gets its collector back as it was
        if dist.is_initialized():
            dist.destroy_process_group()
