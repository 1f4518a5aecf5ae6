"""PackedTrainer: torchtitan's own batching and train_step, for ``skrull.enable = false``.

The job's config builds it when Skrull is off (``JobConfig.trainer_class``, job_config.py):
the same data, through ``PackedDataLoader`` (fixed-shape rows, torchtitan's
gradient accumulation), torchtitan's loss and step, unchanged. What it adds is
what makes the two batchings comparable: the same length limit and sample
counts as Skrull's loader (``skrull.overlength``, data/steps/overlength.py), the same
``skrull/samples_*`` tags in TensorBoard, and the stop before the optimizer on
a non-finite step, and the step timed by the same phases as Skrull's
(train/step_phases.py: the same TensorBoard scalars, step-line clause and
closing lines; ``chunk`` never runs here).

The phases of a step whose code is torchtitan's: torchtitan's ``train_step``
is not restated, so each phase starts where this trainer can see it from
the calls it makes: ``data`` around each ``next`` of the batch iterator,
``mb`` around each ``forward_backward_step``; ``clip`` from the step's last
one (torchtitan clips next, through a module function no hook reaches) to
``checkpointer.maybe_wait_for_staging``, where ``opt`` starts; ``checks``
is the optimizer's pre-step hook (the gradients checked finite: a device flag
the fused optimizer's step reads, optimizer_gate.py) and, after the step,
the flag read (the step's one host sync); ``opt`` ends with ``lr_schedulers.step``, and on a logged
step ``log`` runs from there to the end of ``train_step`` (torchtitan's
loss reductions and line, this trainer's lines). What falls between
(zero_grad, the label count and its all-reduce, the batches' copies to the
device) is the step's ``rest``. Nothing predicts a step here, so there is
no measured/predicted ratio; the marks of a logged step are read at the
next logged step, after its host syncs, as Skrull's are (no sync added).
"""

import math

import torch
from torch.distributed.tensor import DTensor
from torchtitan.tools.logging import logger

from skrull_ext.data.steps.accounting import sample_metrics
from skrull_ext.data.steps.overlength import check_overlength
from skrull_ext.data.steps.packed import PackedDataLoader
from skrull_ext.data.steps.row_layout import context_cuts
from skrull_ext.train.job_trainer import JobTrainer, NonFiniteLossError, name_samples
from skrull_ext.train.optimizer_gate import arm, disarm, gated, not_finite
from skrull_ext.train.step_checks import measured_said


class PackedTrainer(JobTrainer):
    """JobTrainer with torchtitan's batch_generator, forward_backward_step and train_step, each
    only wrapped in its phases (module docstring)."""

    def __init__(self, config):
        self._step_batches = 0
        """forward_backward_step calls of the step being run (the last starts ``clip``)."""
        self._gate_flag = None
        """The step's device flag armed on the optimizers (optimizer_gate.py), read after their step."""
        self._step_logged = False
        """Whether the step being run is logged (its ``log`` phase, its phases kept)."""
        super().__init__(config)
        self._mark_phases()
        self._log_beside_torchtitans_metrics()
        if isinstance(self.dataloader, PackedDataLoader):  # another torchtitan loader: nothing to count
            self._count_like_skrull(config)

    def _count_like_skrull(self, config) -> None:
        """The loader's length limit, checks and counts as Skrull's (module docstring), the
        non-finite stop armed, and what the loader reports back to this trainer."""
        self.dataloader.set_overlength(config.skrull.overlength)
        check_overlength(self.dataloader, first_step=1, last_step=config.training.steps)
        self.dataloader.check_rows(first_step=1, last_step=config.training.steps)
        self.optimizers.register_step_pre_hook(self._stop_on_non_finite_grads)
        self.optimizers.register_step_post_hook(lambda optimizer, args, kwargs: disarm(optimizer))
        # Each batch's documents (or cut pieces) for the document-aware FLOPs (doc_flops.py):
        # one loader batch is one step here.
        self.dataloader.on_layout = lambda layout: self.document_meter.add(
            (e - s for row in layout for _, s, e in row), *context_cuts(layout))
        # The step a batch is built for (torchtitan's loop counts it before train_step draws):
        # its cut warning names it, not the global batches drawn ('stream', 'documents').
        self.dataloader.training_step = lambda: self.step

    # ------------------------------------------------------------------ the step's phases
    def _mark_phases(self) -> None:
        """Where torchtitan's optimizer update starts and ends (module docstring): the checkpoint
        staging wait opens ``opt`` (closing ``clip``), the learning-rate step closes it and opens
        ``log`` on a logged step. The pre-step hook's ``checks`` is ``_stop_on_non_finite_grads``."""
        phases = self.step_phases
        wait, lr_step = self.checkpointer.maybe_wait_for_staging, self.lr_schedulers.step

        def wait_then_opt() -> None:
            phases.leave()
            phases.enter("opt")
            wait()

        def lr_step_then_log() -> None:
            self._read_the_gated_check()
            lr_step()
            phases.leave()
            if self._step_logged:
                phases.enter("log")

        self.checkpointer.maybe_wait_for_staging = wait_then_opt
        self.lr_schedulers.step = lr_step_then_log

    def train_step(self, data_iterator) -> None:
        """torchtitan's train_step, unchanged, as one timed step (module docstring)."""
        phases = self.step_phases
        phases.begin(self.step)
        self._step_batches = 0
        self._step_logged = self.metrics_processor.should_log(self.step)
        try:
            super().train_step(data_iterator)
        finally:
            phases.leave()
        phases.end(0.0, keep=self._step_logged)  # nothing predicted; read at the next logged step (or at close)

    def batch_generator(self, data_iterable):
        """torchtitan's, each batch's wait timed as ``data``."""
        batches = super().batch_generator(data_iterable)
        while True:
            with self.step_phases.phase("data"):
                batch = next(batches)
            yield batch

    def forward_backward_step(self, **kwargs):
        """torchtitan's, timed as ``mb``; after the step's last, ``clip`` starts."""
        with self.step_phases.phase("mb"):
            loss = super().forward_backward_step(**kwargs)
        self._step_batches += 1
        if self._step_batches == self.gradient_accumulation_steps:
            self.step_phases.enter("clip")
        return loss

    def _log_phases(self, step: int) -> None:
        """On a logged step, after torchtitan's line: the previous logged step's phases, read now
        (written to TensorBoard at that step), as Skrull's step line gives them."""
        times = self._read_phases()
        if times is not None:
            logger.info(f"step {step}: {measured_said(times, {}).removesuffix('; ')}")

    def _summary_tail(self) -> str:
        """Under 'stream' and 'documents': what the run drew and carries untrained past its last
        step (not counted above: a sample counts when trained, data/steps/packed.py), and under 'stream'
        how many it trained split across rows (the step lines' 'cut documents', which 'trained cut',
        samples cut to the length limit, does not count)."""
        loader = getattr(self, "dataloader", None)
        if not isinstance(loader, PackedDataLoader) or loader.config.packing == "rows":
            return ""
        carried = list(dict.fromkeys(k for k, _, _ in loader.carry))
        partly = len({k for k, s, _ in loader.carry if s > 0})
        out = ""
        if loader.config.packing == "stream":
            out += (f"; dataloader.packing 'stream' split {loader.split} of this launch's trained samples across rows "
                    "(each trained whole, a piece after a split without the context before it)")
        if carried:
            out += (f"; {len(carried)} samples drawn are carried past step {self.step}, not trained"
                    + (f" ({partly} of them in part)" if partly else "")
                    + " and not counted: a run resumed from its checkpoint trains them first")
        return out

    def _log_beside_torchtitans_metrics(self) -> None:
        """torchtitan's own train_step logs the step: add the same ``skrull/samples_*``
        tags Skrull's steps log (where the loader counts them), so the accounting reads
        the same in TensorBoard under both batchings, and after its line the phases
        of the previous logged step (``_log_phases``)."""
        log, loader = self.metrics_processor.log, self.dataloader
        counted = isinstance(loader, PackedDataLoader)

        def log_with_samples(step, *args, extra_metrics=None, **kwargs):
            samples = sample_metrics(loader.last_counts, loader.account.totals.as_dict()) if counted else {}
            out = log(step, *args, extra_metrics={**(extra_metrics or {}), **samples}, **kwargs)
            self._log_phases(step)
            return out

        self.metrics_processor.log = log_with_samples

    def _stop_on_non_finite_grads(self, optimizer, args, kwargs) -> None:
        """torchtitan checks the loss after the optimizer step, and only on logged
        steps; this optimizer pre-step hook makes a non-finite step change nothing.
        torchtitan's clip_grad_norm_ scales every gradient by max_norm / (global norm), so a
        non-finite norm leaves every rank's gradients non-finite and a local check
        agrees on every rank without a collective. Where the optimizer can skip its step on
        the device (optimizer_gate.py) the check is a device flag read after the step is queued
        (``_read_the_gated_check``, before the learning-rate step); else it is read here (one host
        sync per step either way)."""
        phases = self.step_phases
        phases.leave()  # opt, opened by the staging wait
        with phases.phase("checks"):
            local = [p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
                     for m in self.model_parts for p in m.parameters() if p.grad is not None]
            norm = torch.stack(torch._foreach_norm(local)).sum() if local else None
            self._gate_flag = None
            if norm is not None and gated(optimizer):
                self._gate_flag = not_finite(norm)
                arm(optimizer, self._gate_flag)
            finite = norm is None or self._gate_flag is not None or math.isfinite(float(norm.item()))
        phases.enter("opt")
        if not finite:
            self._stop("stopped before the optimizer step")

    def _read_the_gated_check(self) -> None:
        """Before the learning-rate step (after the optimizer's post-step hooks, the flag taken off
        there): the gated step's flag read (the step's host sync), and the run stopped where the
        step was not finite (its update skipped on the device)."""
        flag, self._gate_flag = self._gate_flag, None
        if flag is None:
            return
        phases = self.step_phases
        phases.leave()
        with phases.phase("checks"):
            bad = bool(flag.item())
        phases.enter("opt")
        if bad:
            self._stop("the optimizer's update skipped on the device")

    def _stop(self, how: str) -> None:
        self.stopped_step = (self.step, self.dataloader.config.global_batch_size)
        raise NonFiniteLossError(
            f"step {self.step}: the gradients are not finite; {how} (the weights are those of step "
            f"{self.step - 1}). Samples of the step: "
            f"{name_samples(self.dataloader.source, self.dataloader.last_samples)}"
        )
