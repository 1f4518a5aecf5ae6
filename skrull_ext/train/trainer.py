"""SkrullTrainer: torchtitan's Trainer fed whole Skrull steps.

Every job's config is ``JobConfig`` (train/job/job_config.py, below the trainers),
whose ``build()`` builds ``SkrullTrainer`` with ``skrull.enable``, else
``PackedTrainer`` (packed_trainer.py: torchtitan's own batching, loss and step on
the same data): this module registers both (``register_trainer``), so importing it
wires ``build()``. What both share is ``JobTrainer`` (job_trainer.py).

SkrullTrainer replaces torchtitan's batch loop, nothing else: each step is
one ``SkrullStep`` from ``SkrullDataLoader``, the gradient accumulated over
the plan's micro-batches (as many as the slowest DP rank has; others run
no-op pads; under ``skrull.free_running`` each DP rank runs its own, FSDP
parameters held unsharded for the step: free_running.py), each CP rank
feeding its own buffer to the model, attention being the DACP attention over
the CP group (local sequences whole, distributed ones by all-gathered K/V).
The loss is the sum of token losses over the number of loss tokens of the
whole global batch (under look-ahead, the window's mean per step:
docs/design/lookahead.md), so the gradient does not depend on the schedule
(docs/design/method.md, "Loss").

Every step, before the optimizer touches the weights, the global loss and
the gradient norm must be finite, otherwise the step stops with an error
naming it and its samples (their ``file:line`` for JSONL); PackedTrainer
checks the gradients the same way. Both dataloaders apply the length limit
(``skrull.overlength``, data/steps/overlength.py) and count every sample read; the
run ends with the summary ``read = trained whole + trained cut + skipped``
(data/steps/accounting.py).
"""

import dataclasses
import math
import os
import statistics
import time
from collections.abc import Iterable, Iterator

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torchtitan.components.dataloader import DataloaderExhaustedError
from torchtitan.distributed.activation_checkpoint import FullAC
from torchtitan.distributed import utils as dist_utils
from torchtitan.tools.logging import logger

from skrull_ext.attention.kernels import kernel_name
from skrull_ext.attention.local_only import computes_whole_buffer, local_only_kernel
from skrull_ext.data.steps.overlength import check_overlength
from skrull_ext.data.steps.loader import SkrullDataLoader, SkrullStep
from skrull_ext.errors import DataError, JobFileError
from skrull_ext.scheduler import Scheduler
from skrull_ext.scheduler.config import timeline_name
from skrull_ext.scheduler.model_shape import compute_dtype, DTYPES, job_shape, model_compiled
from skrull_ext.scheduler.profile_memory import free_running_bytes
from skrull_ext.train.checkpointing import mode_of, settle_checkpointing
from skrull_ext.train.chunk_path import chunk_path
from skrull_ext.train.chunked import unsharded_param_bytes
from skrull_ext.train.compile_limit import compile_settings
from skrull_ext.train.free_running import FreeRunningFSDP
from skrull_ext.train.job.job_config import JobConfig, register_trainer
from skrull_ext.train.job.usage import job_args
from skrull_ext.train.job_trainer import JobTrainer, NonFiniteLossError, name_samples
from skrull_ext.train.optimizer_gate import gated, not_finite, step_unless
from skrull_ext.train.packed_trainer import PackedTrainer
from skrull_ext.train.passes import chunked_samples, step_passes
from skrull_ext.train.plan_log import PlanLog
from skrull_ext.train.run_settings import run_settings
from skrull_ext.train.settle import Settled, settle
from skrull_ext.train.step_checks import (
    RatioSpread, check_plan_digests, loss_and_norm, step_log_line, step_metrics, summed_loss,
)
from skrull_ext.train.step_phases import StepTimes
from skrull_ext.train.validation import Validation
from torchtitan_patches.dacp_attention import install_dacp_attention


def resolve_device_defaults(config) -> None:
    """Set the torchtitan defaults a Skrull run cannot keep on any device, when
    the trainer is built (the config is final then; a job file or flag that
    turns Skrull off later would otherwise inherit them).

    CUDA graphs: torchtitan 0.3.0 captures fwd+bwd in one CUDA graph by default
    (``training.disable_cuda_graphs`` false) and replays it on every call. A
    Skrull step calls it once per micro-batch with a new buffer length, a new
    DacpBatchMeta (host-side plans) and DACP's collectives on a side stream,
    which a static graph cannot replay, so graphs are off while Skrull is on.
    """
    if config.skrull.enable and not config.training.disable_cuda_graphs:
        config.training = dataclasses.replace(config.training, disable_cuda_graphs=True)
        logger.info("Skrull: training.disable_cuda_graphs set (a CUDA graph cannot replay DACP micro-batches)")


class SkrullTrainer(JobTrainer):
    """JobTrainer fed whole Skrull steps: its own batch_generator and the
    micro-batch loop of train_step (the scheduler and the DACP attention set up
    after torchtitan's model)."""

    Config = JobConfig
    """Every job's config (train/job/job_config.py), whose ``build()`` builds the trainer
    registered for its ``skrull.enable`` (below: this class, or PackedTrainer)."""

    config: Config

    def __init__(self, config: Config):
        self.plan_log: PlanLog | None = None
        self.validation: Validation | None = None
        """The held-out set's loss ([validation], validation.py); None when off."""
        self.free_running: FreeRunningFSDP | None = None
        """The step's FSDP switches under ``skrull.free_running`` (free_running.py)."""
        self.ratio_spread = RatioSpread()
        self.data_wait_ms: list[float] = []
        """Per step, how long the training loop waited for its data (``skrull/data_wait_ms``)."""
        super().__init__(config)
        self._init_skrull()
        self._checks_once_loaded()

    # ------------------------------------------------------------------ setup
    def _before_model(self, config: Config) -> None:
        """The device defaults Skrull cannot keep, and the cost model's shape: a
        profile of another model fails here, before any model is built."""
        resolve_device_defaults(config)
        self.model_shape = job_shape(config)
        config.skrull.check_shape(self.model_shape, self._model_name(config))

    def init_distributed(self):
        """torchtitan's, then the activation-checkpointing mode (``_choose_checkpointing``): the
        first point where the job's dims are known and its model is not yet built."""
        dims = super().init_distributed()
        self._choose_checkpointing(dims)
        return dims

    def _choose_checkpointing(self, dims) -> None:
        """The mode the job runs, put in ``config.activation_checkpoint`` before torchtitan's
        parallelize function applies it (train/checkpointing.py); logged in one line."""
        try:
            choice = settle_checkpointing(self.config, dims, self.model_shape, self._model_name(self.config))
        except ValueError as e:  # the launcher prints it as one line (cli_errors)
            raise JobFileError(str(e)) from None
        logger.info(choice.line())

    def _init_skrull(self) -> None:
        dims = self.parallel_dims
        cp_group = dims.get_mesh("cp").get_group() if dims.cp_enabled else None
        cp_rank = dist.get_rank(cp_group) if cp_group is not None else 0
        self.cp_group = cp_group
        """What a chunked sample's chunks are sharded over (``overlength = "chunk"``, train/chunked.py)."""
        self.dacp_attention = install_dacp_attention(
            self.model_parts, cp_group, kernel=self.config.skrull.attention_kernel,
            exchange=self.config.skrull.kv_exchange,
        )
        assert isinstance(self.dataloader, SkrullDataLoader)
        skrull = self.config.skrull
        if (warning := skrull.profile_cp_warning(dims.cp)) is not None:
            logger.warning(warning)
        if (note := skrull.profile_step_note(dist.get_world_size() if dist.is_initialized() else 1)) is not None:
            logger.info(note)
        compiled = model_compiled(self.config)
        if (warning := skrull.profile_compile_warning(compiled)) is not None:
            logger.warning(warning)
        self.local_only_kernel = local_only_kernel(skrull.attention_kernel, compiled, self.device,
                                                   compute_dtype(self.config))
        """Compiled: the kernel an all-local micro-batch's attention traces into the blocks (local_only.py)."""
        whole = computes_whole_buffer(skrull.attention_kernel, compiled, self.device, compute_dtype(self.config))
        if (warning := skrull.profile_kernel_warning(whole)) is not None:
            logger.warning(warning)
        self.full_ac = isinstance(self.config.activation_checkpoint, FullAC.Config)
        self.dacp_stats = [m.stats for m in self.dacp_attention]
        """The layers' counters, which attention_input bumps for a traced micro-batch."""
        self.chunk_path = path = chunk_path(compiled)  # how chunked documents run (chunk_path.py)
        for line in (*compile_settings(compiled, self.model_parts), path.line(skrull.overlength)):
            if line is not None:
                logger.info(line)
        switches = FreeRunningFSDP(self.model_parts)
        unsharded = self._unsharded_bytes() if switches else None  # no FSDP unit: nothing to hold unsharded
        settled = self._settle(dims, unsharded)
        settled.log(logger)
        execution = settled.execution
        self.free_running = switches if execution.free_running else None
        self.free_running_bytes = unsharded if execution.free_running else 0.0
        """What free-running holds beyond the static account and the activations (``skrull/free_running_bytes``)."""
        self.skrull_job = settled.job
        """The job's scheduling, settled once (train/settle.py): the Scheduler, its plans, the step
        builder and this trainer read it, not the [skrull] section's scheduling keys (defer_grad_sync
        aside: scheduler/job.py)."""
        self.scheduler = Scheduler(self.skrull_job)
        self.run_settings = run_settings(mode_of(self.config.activation_checkpoint), self.skrull_job.bucket_size,
                                         getattr(self, "loss_fn", None))
        """The checkpointing mode, BucketSize and head chunk settled at start-up, logged with each logged
        step (run_settings.py: ``skrull/activation_checkpoint`` and the others)."""
        self.dataloader.attach(self.scheduler, cp_rank, dims.cp, pin=self.device.type == "cuda", tp=dims.tp)
        self.dataloader.hold_builds = True  # the next step built once this one's micro-batches are queued
        if skrull.plan_log:
            rank = dist.get_rank() if dist.is_initialized() else 0
            self.plan_log = PlanLog(self.config.dump_folder, rank)
        self.validation = (Validation(self.config.validation, self.dataloader, self.tokenizer)
                           if self.config.validation.enable else None)
        if self.validation is not None:
            self.validation.check()  # a held-out sample over the limit under 'error' fails here
        logger.info(
            f"Skrull: global batch {self.config.dataloader.global_batch_size} sequences a step (dataloader."
            "global_batch_size; the batch sizes torchtitan's line above gives are its own batching's, which this "
            "replaces), "
            f"policy {self.skrull_job.policy.name}, bucket_size {self.skrull_job.bucket_size} ({execution.bucket_from}), "
            f"DP {self.dataloader.dp_world_size} x CP {dims.cp} x TP {dims.tp}, cp_rank {cp_rank}, "
            f"attention kernel {kernel_name(skrull.attention_kernel, self.device, compute_dtype(self.config))}, "
            f"timeline {timeline_name(self.skrull_job.timeline)}, look-ahead {self.skrull_job.lookahead}"
            + (" (free_running: FSDP parameters unsharded for each step, no pad passes)" if execution.free_running
               else "")
        )

    def _checks_once_loaded(self) -> None:
        """Run ``_start_checks`` right after torchtitan's ``train()`` loads the checkpoint (the
        windows a resumed run trains are the checkpoint's continued: data/steps/windows.py), before
        its first step. torchtitan has no hook there, so its ``checkpointer.load`` is wrapped."""
        load = self.checkpointer.load

        def load_then_check(*args, **kwargs):
            loaded = load(*args, **kwargs)
            self._start_checks()
            return loaded

        self.checkpointer.load = load_then_check

    def _start_checks(self) -> None:
        """Before the first step of this launch, on the windows it trains (``Windows`` says where
        its last one ends): an over-length sequence under 'error' in any global batch the run
        reads fails here (a resumed run whose width changed may read past ``training.steps``),
        and a run whose ``training.steps`` ends inside a window says, once, which samples that
        window will leave untrained."""
        loader, steps = self.dataloader, self.config.training.steps
        first = loader.step + 1
        if first > steps:
            return
        check_overlength(loader, first_step=first, last_step=loader.windows.end(steps))
        if (line := self._left_line(steps, start=True)) is not None:
            logger.warning(line)

    def _left_line(self, steps: int, start: bool) -> str | None:
        """What a run of ``steps`` steps leaves of the window it stops inside (None: it ends one)."""
        loader = self.dataloader
        left_steps = loader.windows.left(steps)
        if not left_steps:
            return None
        win = loader.builder.window(steps)
        left = win.trained_after(steps)
        said = (f"steps {left_steps.start}..{left_steps.stop - 1}" if len(left_steps) > 1
                else f"step {left_steps.start}")
        if not start:
            return (f"training.steps {steps} ended inside look-ahead window {win.index} (steps {win.first}.."
                    f"{win.last}): {len(left)} samples it had regrouped onto {said} were read ahead and not "
                    "trained (named at start-up; not counted above)")
        multiple = win.first - 1  # the end of the window before
        return (f"training.steps {steps} ends inside look-ahead window {win.index} (steps {win.first}..{win.last}, "
                f"skrull.lookahead {win.width}): the {len(left)} samples the window regroups onto {said} will not "
                f"be trained: {name_samples(loader.source, left)}. To train every sample read, set training.steps "
                f"to {win.last}{f' or {multiple}' if multiple > 0 else ''} (whole windows), or resume from the last "
                "checkpoint with more steps (docs/design/lookahead.md)")

    def _unsharded_bytes(self) -> float:
        """What free-running holds, counted from the built model: the unsharded parameters in FSDP's
        mixed_precision_param, the gradients of trainable ones (not a LoRA base) in the wider of that
        and its reduce dtype (FSDP accumulates unsynchronised gradients there)."""
        params = [p for m in self.model_parts for p in m.parameters()]
        training = self.config.training
        param_bytes = DTYPES[training.mixed_precision_param].itemsize
        grad_bytes = max(param_bytes, DTYPES[training.mixed_precision_reduce].itemsize)
        return free_running_bytes(sum(p.numel() for p in params),  # DTensor: the whole parameter
                                  sum(p.numel() for p in params if p.requires_grad), param_bytes, grad_bytes)

    def _unsharded_params(self) -> float:
        """Every FSDP unit's unsharded parameters in ``mixed_precision_param`` (0 without FSDP): what
        a checkpointed chunk's recompute gathers at once (scheduler/chunk_cost.py)."""
        return unsharded_param_bytes(self.model_parts, DTYPES[self.config.training.mixed_precision_param].itemsize)

    def _settle(self, dims, unsharded: float | None) -> Settled:
        """The job settled once (train/settle.py): execution, BucketSize, timeline, look-ahead
        width; ``unsharded``: what free-running would hold (None: no FSDP unit, nothing to
        hold). A refusal is one line."""
        loader = self.dataloader
        try:
            return settle(self.config.skrull, dp=loader.dp_world_size, cp=dims.cp, dp_shard=dims.dp_shard,
                          dp_replicate=dims.dp_replicate, shape=self.model_shape,
                          model_name=self._model_name(self.config), unsharded=unsharded,
                          training_steps=self.config.training.steps,
                          raw_lengths=lambda k: [n for _, n in loader.step_lengths(k)],
                          limited_lengths=loader.decided_lengths, chunked_lengths=loader.decided_chunked,
                          check_lengths=lambda job, last: check_overlength(loader, 1, last, loader.limit_of(job),
                                                                           quiet=True),
                          gradient_bytes=float(sum(p.numel() * p.element_size() for m in self.model_parts
                                                   for p in m.parameters() if p.requires_grad)),
                          unsharded_params=self._unsharded_params(), chunk_regather=self.chunk_path.traced,
                          no_free_running=getattr(getattr(self, "loss_fn", None), "free_running_blocked", None))
        except ValueError as e:  # the launcher prints it as one line (cli_errors)
            raise JobFileError(str(e)) from None

    @staticmethod
    def _model_name(config) -> str:
        spec = config.model_spec
        return f"{spec.name}/{spec.flavor}"

    # ------------------------------------------------------------------ steps
    def batch_generator(self, data_iterable: Iterable) -> Iterator[SkrullStep]:
        """torchtitan's batch_generator for whole steps: one ``SkrullStep`` per
        optimizer step (its micro-batches, their plan and counts), the time the
        loop waited for it kept per step (``skrull/data_wait_ms``)."""
        it = iter(data_iterable)
        while True:
            start = time.perf_counter()
            try:
                step = next(it)
            except StopIteration as ex:  # as torchtitan: the unfinished step is dropped
                raise DataloaderExhaustedError() from ex
            waited = time.perf_counter() - start  # ~0 when the step was built ahead (prefetch_steps)
            chunked = [s.length for s in step.chunked]  # trained whole, each over the CP group
            self.metrics_processor.ntokens_since_last_log += step.num_tokens + sum(chunked) // self.parallel_dims.cp
            self.document_meter.add(step.plan.trained_lengths + chunked)
            self.metrics_processor.data_loading_times.append(waited)
            self.data_wait_ms.append(waited * 1e3)
            yield step
            del step  # freed here, not timed as waiting: a step's plan is thousands of objects at scale

    def train_step(self, data_iterator: Iterator[SkrullStep]) -> None:
        """One optimizer step over one ``SkrullStep``: the plan's micro-batches
        (train/passes.py ``step_passes``) in place of torchtitan's batch loop.

        The rest mirrors torchtitan 0.3.0's ``Trainer.train_step``, in its order:
        its first three lines (zero_grad, the learning rates, should_log), the
        optimizer update (clip_grad_norm_, maybe_wait_for_staging, optimizers.step,
        lr_schedulers.step; torchtitan wraps these in an "optim" trace span, this
        step does not) and its logged loss reductions (``_log_step``). Each piece
        is one of the step's phases (step_phases.py: data, checks, mb, chunk, clip,
        opt, log), timed without a host sync of its own.
        torchtitan offers no hook to reuse it around a different batch loop: its
        train_step pulls ``gradient_accumulation_steps`` fixed-shape batches and
        all-reduces their label counts inline, where a Skrull step is one plan
        whose micro-batch count varies by step and whose global loss-token count
        the plan already holds; and it checks the loss after the optimizer step,
        on logged steps only, where a Skrull step stops before it, every step
        (``_check_finite``).
        """
        phases = self.step_phases
        phases.begin(self.step)
        with phases.phase("data"):
            step = next(data_iterator)
        self.optimizers.zero_grad(set_to_none=self.config.training.disable_cuda_graphs)
        lr_metrics = self.lr_schedulers.get_metrics()
        should_log = self.metrics_processor.should_log(self.step)
        # The loss divisor: the step's loss tokens, or under look-ahead its window's mean per step. A fill
        # on the device, not torch.tensor(..., device=): a host-to-device copy waits for the stream.
        global_valid_tokens = torch.full((), step.loss_tokens, device=self.device)
        with phases.phase("checks"):
            if self.config.skrull.check_plan_hash:
                check_plan_digests(step.plan, self.dataloader.dp_rank, self.device)
            if self.plan_log is not None:
                self.plan_log.write(step)
        accumulated = step_passes(self, step, global_valid_tokens)
        # Every micro-batch queued: the prefetch thread builds the next step now, while this thread
        # queues the clipping and then waits for the device at the finiteness check (GIL released),
        # not from the step's start, where its Python would hold up the host work the device waits on.
        self.dataloader.resume_building()
        with phases.phase("clip"):
            grad_norm = dist_utils.clip_grad_norm_(
                [p for m in self.model_parts for p in m.parameters()],
                self.config.training.max_norm,
                foreach=True,
                pp_mesh=None,
                ep_enabled=self.parallel_dims.ep_enabled,
            )
        dims = self.parallel_dims
        with phases.phase("checks"):
            total = summed_loss(accumulated, dims.get_optional_mesh("loss") if dims.dp_cp_enabled else None)
        gate = gated(self.optimizers)  # the step queued before the check's read, skipped on the device if it fails
        if gate:
            with phases.phase("opt"):
                self.checkpointer.maybe_wait_for_staging()
                step_unless(self.optimizers, not_finite(total, grad_norm))
        with phases.phase("checks"):
            global_avg, norm = self._check_finite(step, total, grad_norm, gate)
        reduced = None
        if should_log:  # the logged reductions' reads now, the queue just drained
            with phases.phase("log"):
                reduced = self._log_reductions(step, accumulated, global_valid_tokens)
        with phases.phase("opt"):
            if not gate:
                self.checkpointer.maybe_wait_for_staging()
                self.optimizers.step()
            self.lr_schedulers.step()
        if should_log:
            with phases.phase("log"):
                global_avg *= step.loss_tokens / step.global_valid_tokens  # the step's own mean token loss
                self._log_step(step, global_avg, norm, lr_metrics, reduced)
        if self.validation is not None and self.config.validation.due(self.step, self.config.training.steps):
            with phases.phase("val"):
                self.validation.run(self, self.step)  # forward only: no weight, RNG or counter changes
        phases.end(step.plan.makespan_us, keep=should_log)  # read at the next logged step (or at close)

    def _chunked_samples(self, step: SkrullStep, global_valid_tokens: torch.Tensor) -> torch.Tensor:
        """This rank's chunked samples (passes.py); a method so a subclass can meter them (profile.check)."""
        return chunked_samples(self, step, global_valid_tokens)

    def _check_finite(self, step: SkrullStep, total: torch.Tensor, grad_norm: torch.Tensor,
                      gated: bool) -> tuple[float, float]:
        """(global mean loss, gradient norm), both finite, or NonFiniteLossError. Every step: the
        loss summed over the ranks (``total``: step_checks.summed_loss; the global mean is the plain
        sum, as in torchtitan) and the global gradient norm, read (the step's one host sync) after
        the optimizer step is queued where it is ``gated`` (optimizer_gate.py), else before it."""
        global_avg, norm = loss_and_norm(total, grad_norm)
        if not (math.isfinite(global_avg) and math.isfinite(norm)):
            self.stopped_step = (self.step, step.account.counts.read)
            how = "the optimizer's update skipped on the device" if gated else "stopped before the optimizer step"
            raise NonFiniteLossError(
                f"step {self.step}: loss {global_avg}, gradient norm {norm}; {how} "
                f"(the weights are those of step {self.step - 1}). Samples of the step: "
                f"{name_samples(self.dataloader.source, step.samples)}"
            )
        return global_avg, norm

    def _set_grad_sync(self, on: bool) -> None:
        """FSDP reduce-scatters gradients only where ``on`` (the step's last micro-batch)."""
        for part in self.model_parts:
            if isinstance(part, FSDPModule):
                part.set_requires_gradient_sync(on)

    def close(self) -> None:
        """The prefetch thread and plan log stopped; then the closing lines and the run summary
        (JobTrainer.close)."""
        if isinstance(getattr(self, "dataloader", None), SkrullDataLoader):
            self.dataloader.close()  # stops the prefetch thread
        if self.plan_log is not None:
            self.plan_log.close()
        super().close()

    def _closing_lines(self) -> None:
        """The step's phases (JobTrainer), then the measured / predicted time ratios."""
        super()._closing_lines()
        if self.ratio_spread.ratios:
            logger.info(f"Skrull: measured / predicted step time (the whole step as run): {self.ratio_spread.line()} "
                        f"(cost model {self.config.skrull.cost_model})")

    def _summary_tail(self) -> str:
        left = None
        if isinstance(getattr(self, "dataloader", None), SkrullDataLoader) and self.dataloader.builder is not None \
                and self.step == self.config.training.steps:
            try:
                left = self._left_line(self.step, start=False)
            except DataError:  # the window cannot be rebuilt (a sample refused): the start-up line said it all
                left = None
        return ("" if left is None else f"; {left}") + self._data_wait_summary()

    def _data_wait_summary(self) -> str:
        """'; data wait per step: median .. ms' over the steps trained, the
        first (built while the loop waited, nothing ahead yet) left out when there are others."""
        waits = self.data_wait_ms[1:] or self.data_wait_ms
        if not waits:
            return ""
        k = getattr(self.dataloader.config, "prefetch_steps", 0)
        return (f"; data wait per step this launch: median {statistics.median(waits):.2f} ms, max {max(waits):.2f} ms over "
                f"{len(waits)} steps{' after the first' if len(self.data_wait_ms) > 1 else ''} "
                f"(dataloader.prefetch_steps {k}; first step {self.data_wait_ms[0]:.1f} ms)")

    def _log_reductions(self, step, accumulated, global_valid_tokens) -> tuple[float, float] | None:
        """A logged step's reductions over the loss mesh: (the largest rank's mean token loss, the
        tokens seen), None with one rank (the step's own mean and count then). Each is an all-reduce
        and a read: train_step takes them right after the finiteness check, where the device's queue
        has just drained, so they wait for the two all-reduces only, and the optimizer's kernels then
        run under the logging's host work (after the optimizer step, their reads waited for it)."""
        if not self.parallel_dims.dp_cp_enabled:
            return None
        local_valid = max(step.local_valid_tokens, 1)
        local_avg = accumulated * global_valid_tokens / local_valid
        ntokens = torch.full((), self.ntokens_seen, dtype=torch.int64, device=self.device)  # no host copy
        mesh = self.parallel_dims.get_optional_mesh("loss")
        return dist_utils.dist_max(local_avg, mesh), dist_utils.dist_sum(ntokens, mesh)

    def _log_step(self, step, global_avg: float, grad_norm: float, lr_metrics,
                  reduced: tuple[float, float] | None) -> None:
        if reduced is not None:
            global_max, ntokens_seen = reduced
        else:
            global_max = global_avg
            ntokens_seen = self.ntokens_seen
        skrull = step_metrics(step, self.dacp_attention)
        skrull["skrull/data_wait_ms"] = self.data_wait_ms[-1] if self.data_wait_ms else float("nan")
        skrull["skrull/free_running_bytes"] = self.free_running_bytes
        skrull.update(self.run_settings)
        extra = {"n_tokens_seen": ntokens_seen, **lr_metrics, **skrull}
        self.metrics_processor.log(self.step, global_avg, global_max, grad_norm, extra_metrics=extra)
        times = self._read_phases()
        logger.info(step_log_line(self.step, skrull, times, self.ratio_spread.summary()))

    def _phase_metrics(self, times: StepTimes, metrics: dict[str, float]) -> None:
        """The step's measured / predicted ratio added to the run's spread (its scalars beside the
        phases'), and the drift warning once the spread says the profile is another machine's."""
        self.ratio_spread.add(metrics)
        if (drift := self.ratio_spread.drift_warning(self.config.skrull.cost_model, int(os.environ.get(
                "WORLD_SIZE", "1")), job_args())) is not None:
            logger.warning(drift)


register_trainer(True, SkrullTrainer)
register_trainer(False, PackedTrainer)
