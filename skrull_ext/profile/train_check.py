# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""Is BucketSize honoured by a real training run? Measure every rank's peak.

check.py fills one buffer inside the profiler's own process. This runs the
job itself (SkrullTrainer under torchrun: FSDP, DACP attention over the CP
group, the job's optimizer and data) with ``[skrull] cost_model`` = the
profile and ``bucket_size = "profile"`` (the profile's BucketSize), and wraps each
training step in a process meter (``memory.PROCESS_METERS``: on CPU the
VmHWM reset through /proc/self/clear_refs, on CUDA the allocator peak).
Per step and rank:

    measured  = this rank's static tensors (local shards of parameters,
                gradients and optimizer state) + peak above the step's start
    predicted = the profile's static account + A(n) / (1 - margin)

n is the most tokens the rank held in one micro-batch of the step (its
buffer: zigzag padding of distributed sequences included) and A the
profile's activation fit. BucketSize was derived so that predicted <= usable
for n <= BucketSize; measured <= predicted at every step is the claim that
the BucketSize is honoured, measured instead of assumed. Whether the plans
came near BucketSize depends on the data: the report prints the tokens next
to BucketSize, so a run of short sequences cannot pass for a full one.

    torchrun --nproc_per_node 2 -m skrull_ext.profile.train_check \\
        --profile profiles/cpu-debug-gloo2.toml --config-file JOB.toml [job flags]
    python -m skrull_ext.profile.check --train --profile P.toml --config-file JOB.toml [job flags]

Under ``--skrull.overlength chunk`` the trainer's chunked samples (run after
the step's micro-batches, train/chunked.py) are metered apart: the meter
restarts when they begin (the step's peak so far is kept and folded back), and
per step and rank

    measured  = static tensors + what the rank held when they began (above the
                step's start) + their peak above that
    predicted = the profile's static account + (A(chunk / cp) +
                chunk_cost's peak_bytes_beyond_chunk) / (1 - margin)

for the longest of them, and their wall and process CPU time against
``chunk_cost(...).us`` summed (printed, not a verdict: a training run's clock
on a shared host).

Every rank exits 1 when any rank's measurement exceeds its prediction.
The steps are the job's own, so the run trains (and saves, if the job does).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict

import torch.distributed as dist

from skrull_ext.profile.check_chunked import dense_kernel
from skrull_ext.profile.memory import PROCESS_METERS, local_bytes, optimizer_state_tensors
from skrull_ext.profile.ranks import sync
from skrull_ext.profile.train_report import (ChunkedMemory, StepMemory, chunked_predicted, format_chunked,
                                             format_report, report)
from skrull_ext.scheduler.model_shape import compute_dtype
from skrull_ext.scheduler.profile_file import Profile
from skrull_ext.train.job.job_file import load_config
from skrull_ext.train.trainer import SkrullTrainer

__all__ = ["MeteredTrainer", "main"]


class _Tap:
    """Iterator that remembers the last item it handed out (the step's plan and buffers)."""

    def __init__(self, it):
        self.it, self.last = it, None

    def __iter__(self):
        return self

    def __next__(self):
        self.last = next(self.it)
        return self.last


class MeteredTrainer(SkrullTrainer):
    """SkrullTrainer with each step between ``meter.start()`` and ``meter.peak()``.

    Nothing in the step changes; the meter's start collects garbage and, on
    CPU, returns freed heap to the OS (glibc's mmap/trim thresholds are fixed
    at 64 KiB, as in the profiler) so that resident memory follows live tensors.
    """

    def __init__(self, config, profile: Profile | None = None):
        if not config.skrull.enable:
            raise ValueError("the memory check measures Skrull's plans: skrull.enable must be true")
        super().__init__(config)
        self.meter = PROCESS_METERS[self.device.type](self.device)
        self.records: list[StepMemory] = []
        self.chunked_records: list[ChunkedMemory] = []
        """Each step's chunked samples (``overlength = "chunk"``), metered apart."""
        self.check_profile = profile
        self._before_chunked: tuple[float, float] | None = None
        self._peak_at_reset = 0.0
        # torchtitan's metrics log resets the device's peak (on CPU VmHWM through clear_refs: the
        # patched device module) at the end of the step, before train_step reads it: the verdict
        # measured what the step held after its last log, ~100 MiB of a 3696-token step's ~900.
        monitor = self.metrics_processor.device_memory_monitor
        reset = monitor.reset_peak_stats

        def keep_then_reset() -> None:
            self._peak_at_reset = max(self._peak_at_reset, self.meter.peak())
            reset()

        monitor.reset_peak_stats = keep_then_reset

    def _meter_start(self) -> None:
        self.meter.start()
        self._peak_at_reset = 0.0

    def _meter_peak(self) -> float:
        """The peak above the meter's start, the part before a torchtitan reset included."""
        return max(self.meter.peak(), self._peak_at_reset)

    def train_step(self, data_iterator) -> None:
        tap = _Tap(data_iterator)
        self._meter_start()
        start, self._before_chunked = self.meter.base, None
        super().train_step(tap)
        peak = self._meter_peak()
        if self._before_chunked is not None:  # the meter restarted around the chunked samples: fold both parts
            before, offset = self._before_chunked
            peak = max(before, offset + peak)
        step, cp_rank = tap.last, self.dataloader.cp_rank
        plan_tokens = max(mb.rank_tokens[cp_rank] for mb in step.plan.ranks[step.dp_rank]) \
            if step.plan.ranks[step.dp_rank] else 0
        self.records.append(StepMemory(
            rank=dist.get_rank() if dist.is_initialized() else 0, step=self.step,
            micro_batches=len(step.micro_batches), plan_tokens=int(plan_tokens),
            buffer_tokens=max(mb.num_tokens for mb in step.micro_batches),
            start=start, peak=peak, static=float(self.static_bytes()),
        ))

    def _chunked_samples(self, step, global_valid_tokens):
        """The trainer's chunked samples between two meter restarts, timed on the wall clock. The
        step's record keeps its micro-batches and what follows the chunked samples (the peak
        before them and the one after, folded in ``train_step``), so BucketSize's verdict stays
        about the plan's micro-batches. A lockstep rank with none of its own runs all-pad documents
        (scheduler/chunk_lockstep.py): nothing to record."""
        if self.check_profile is None or not step.chunked:
            return super()._chunked_samples(step, global_valid_tokens)
        before, step_base = self._meter_peak(), self.meter.base
        self._meter_start()
        offset = self.meter.base - step_base
        sync(self.device)
        t0, c0 = time.perf_counter(), time.process_time()
        total = super()._chunked_samples(step, global_valid_tokens)
        sync(self.device)
        us, cpu_us = (time.perf_counter() - t0) * 1e6, (time.process_time() - c0) * 1e6
        peak = self._meter_peak()
        self._meter_start()  # the rest of the step (clipping, the optimizer) is the step's again
        self._before_chunked = (before, self.meter.base - step_base)
        lengths = [s.length for s in step.chunked]
        chunks, cp = [self.skrull_job.chunk_for(n) for n in lengths], self.parallel_dims.cp
        grads = sum(p.numel() * p.element_size() for m in self.model_parts for p in m.parameters() if p.requires_grad)
        prof = self.check_profile
        dense = dense_kernel(self.config.skrull.attention_kernel, self.device, compute_dtype(self.config))
        cost = prof.cost_model(chunk_regather=self.chunk_path.traced)  # as the trainer's (settle.py)
        predicted_us, predicted = chunked_predicted(cost, prof.memory(), lengths, chunks, cp, float(grads),
                                                    dense, unsharded_bytes=self._unsharded_params())
        self.chunked_records.append(ChunkedMemory(
            rank=dist.get_rank() if dist.is_initialized() else 0, step=self.step, lengths=lengths, chunk=min(chunks),
            cp=cp, above_step_start=offset, peak=peak, static=float(self.static_bytes()), us=us, cpu_us=cpu_us,
            predicted_us=predicted_us, predicted=predicted,
        ))
        return total

    def static_bytes(self) -> int:
        params = [p for m in self.model_parts for p in m.parameters()]
        return local_bytes(params) + local_bytes(p.grad for p in params) \
            + local_bytes(optimizer_state_tensors(self.optimizers))


def job_argv(profile: str, job_args: list[str]) -> list[str]:
    """The job's command line planned by ``profile``: its cost model and BucketSize, in
    lockstep execution (put first, so that the job's own flags, which come later, override
    them). Lockstep: the profile's BucketSize is derived for it (a profile made with
    ``--skrull.free_running true`` leaves the room, and that flag checks it); under the
    default "auto" the trainer may pick free-running at a smaller BucketSize
    (train/execution.py), which would not check the profile's."""
    return ["--skrull.cost_model", profile, "--skrull.bucket_size", "profile", "--skrull.free_running", "false",
            *job_args]


def main(argv: list[str] | None = None) -> int:
    """torchrun -m skrull_ext.profile.train_check --profile P.toml --config-file JOB.toml [job flags]"""
    from torchtitan.tools.logging import init_logger

    p = argparse.ArgumentParser(prog="python -m skrull_ext.profile.train_check", description=__doc__.split("\n")[0])
    p.add_argument("--profile", required=True, help="profile TOML: its cost model and BucketSize plan the run")
    p.add_argument("--out", help="JSON of every step and the verdicts (default <dump_folder>/memory_check.json)")
    args, job_args = p.parse_known_args(sys.argv[1:] if argv is None else argv)
    pm = Profile.load(args.profile).memory()
    init_logger()
    config = load_config(job_argv(args.profile, job_args))
    trainer = MeteredTrainer(config, Profile.load(args.profile))
    try:
        trainer.train()
        records, chunked = trainer.records, trainer.chunked_records
        if dist.is_initialized():
            # plain dicts: under ``-m`` the class lives in __main__, which pickles badly
            gathered: list[list[dict]] = [[] for _ in range(dist.get_world_size())]
            dist.all_gather_object(gathered, [asdict(r) for r in records])
            records = [StepMemory(**r) for rs in gathered for r in rs]
            dist.all_gather_object(gathered, [asdict(r) for r in chunked])
            chunked = [ChunkedMemory(**r) for rs in gathered for r in rs]
    finally:
        trainer.close()
    verdicts = report(records, pm)
    ok = all(v.ok for v in verdicts) and all(r.ok for r in chunked)
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(format_report(verdicts, records, pm), flush=True)
        if chunked:
            print(format_chunked(chunked), flush=True)
        out = args.out or os.path.join(config.dump_folder, "memory_check.json")
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "w") as f:
            json.dump({"profile": args.profile, "bucket_size": pm.bucket_size, "ok": ok,
                       "steps": [{**asdict(r), "measured": r.measured, "predicted": pm.budget(r.buffer_tokens)}
                                 for r in records],
                       "ranks": [asdict(v) for v in verdicts],
                       "chunked": [{**asdict(r), "measured": r.measured, "ok": r.ok} for r in chunked]}, f, indent=1)
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
