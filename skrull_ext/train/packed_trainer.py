"""PackedTrainer: torchtitan's own batching and train_step, for ``skrull.enable = false``.

The job's config builds it when Skrull is off (``JobConfig.trainer_class``, job_config.py):
the same data, through ``PackedDataLoader`` (fixed-shape rows, torchtitan's
gradient accumulation), torchtitan's loss and step, unchanged. What it adds is
what makes the two batchings comparable: the same length limit and sample
counts as Skrull's loader (``skrull.overlength``, data/steps/overlength.py), the same
``skrull/samples_*`` tags in TensorBoard, and the stop before the optimizer on
a non-finite step.
"""

import math

import torch
from torch.distributed.tensor import DTensor

from skrull_ext.data.steps.accounting import sample_metrics
from skrull_ext.data.steps.overlength import check_overlength
from skrull_ext.data.steps.packed import PackedDataLoader
from skrull_ext.data.steps.row_layout import context_cuts
from skrull_ext.train.job_trainer import JobTrainer, NonFiniteLossError, name_samples


class PackedTrainer(JobTrainer):
    """JobTrainer with torchtitan's batch_generator and train_step (none overridden)."""

    def __init__(self, config):
        super().__init__(config)
        if isinstance(self.dataloader, PackedDataLoader):  # another torchtitan loader: nothing to count
            self.dataloader.set_overlength(config.skrull.overlength)
            check_overlength(self.dataloader, first_step=1, last_step=config.training.steps)
            self.dataloader.check_rows(first_step=1, last_step=config.training.steps)
            self.optimizers.register_step_pre_hook(self._stop_on_non_finite_grads)
            # Each batch's documents (or cut pieces) for the document-aware FLOPs (doc_flops.py):
            # one loader batch is one step here.
            self.dataloader.on_layout = lambda layout: self.document_meter.add(
                (e - s for row in layout for _, s, e in row), *context_cuts(layout))
            self._log_samples_with_torchtitans_metrics()

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

    def _log_samples_with_torchtitans_metrics(self) -> None:
        """torchtitan's own train_step logs the step: add the same ``skrull/samples_*``
        tags Skrull's steps log, so the accounting reads the same in TensorBoard
        under both batchings."""
        log, loader = self.metrics_processor.log, self.dataloader

        def log_with_samples(step, *args, extra_metrics=None, **kwargs):
            samples = sample_metrics(loader.last_counts, loader.account.totals.as_dict())
            return log(step, *args, extra_metrics={**(extra_metrics or {}), **samples}, **kwargs)

        self.metrics_processor.log = log_with_samples

    def _stop_on_non_finite_grads(self, optimizer, args, kwargs) -> None:
        """torchtitan checks the loss after the optimizer step, and only on logged
        steps; this optimizer pre-step hook stops before it. torchtitan's
        clip_grad_norm_ scales every gradient by max_norm / (global norm), so a
        non-finite norm leaves every rank's gradients non-finite and a local check
        agrees on every rank without a collective (one host sync per step)."""
        local = [p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
                 for m in self.model_parts for p in m.parameters() if p.grad is not None]
        if not local or math.isfinite(float(torch.stack(torch._foreach_norm(local)).sum().item())):
            return
        self.stopped_step = (self.step, self.dataloader.config.global_batch_size)
        raise NonFiniteLossError(
            f"step {self.step}: the gradients are not finite; stopped before the optimizer step (the weights are "
            f"those of step {self.step - 1}). Samples of the step: "
            f"{name_samples(self.dataloader.source, self.dataloader.last_samples)}"
        )
