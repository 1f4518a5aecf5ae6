"""Validation loss under Skrull: a held-out set, evaluated every N steps and at the end.

torchtitan's ``[validator]`` feeds torchtitan's batches (rows and their
masks), which the DACP attention cannot take, so a Skrull job refuses it
(job_checks.py) and reads ``[validation]`` instead:

    [validation]
    enable = true
    dataset_path = "held_out.jsonl"   # any file the training data's dataset kind reads
    freq = 50                         # every 50 steps, and at the last step
    keep_best = true                  # <dump_folder>/best_validation: the HF folder of the best step

The held-out samples are batched exactly as training batches are: each batch
of ``global_batch_size`` samples goes through the same length limit
(``skrull.overlength``), the same scheduler (GDS over the DP ranks, DACP
placement within each CP group, at most ``bucket_size`` tokens per rank) and
the same buffers (``StepBuilder``), so validation holds no more memory than
a training step. It runs forward only, under ``torch.no_grad``, and touches no
weight, optimizer state, RNG or training counter: a run with validation
trains bitwise as one without it (tests/integration_tests/test_validation_run.py).

The loss is the training loss's: the sum of token losses over every rank and
batch, divided by the loss tokens of the whole held-out set (summed in
float64). It is logged to the console and to TensorBoard
(``validation/loss``, ``validation/loss_tokens``, ``validation/samples``,
``validation/time_s``). The held-out set and its batches are a function of
the job (the samples are the held-out records in the order ``dataloader.seed``
shuffles them), so every pass of a run, and every run of a job, sees the same
batches.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torchtitan.distributed import utils as dist_utils
from torchtitan.tools.logging import logger

from skrull_ext.data.steps.accounting import RunAccount
from skrull_ext.data.steps.overlength import check_overlength, cut
from skrull_ext.data.steps.loader import StepBuilder
from skrull_ext.data.steps.base import DATASETS
from skrull_ext.train.chunked import chunked_loss
from skrull_ext.train.free_running import after_forward_only
from skrull_ext.train.job.validation_config import ValidationConfig

BEST_FOLDER = "best_validation"
"""Under ``dump_folder``: the HF folder of the best validation step (``keep_best``)."""


class HeldOut:
    """The first ``n`` samples of a source, batched in order: batch ``k``
    (1-based) is samples ``(k-1)*size .. k*size - 1``, the last one shorter."""

    def __init__(self, source, n: int) -> None:
        self.source, self.n = source, n

    def __getattr__(self, name):  # lengths, loss counts, locations: the source's
        return getattr(self.source, name)

    def __getitem__(self, index: int):
        return self.source[index]

    def global_batch(self, step: int, size: int) -> list[int]:
        return list(range((step - 1) * size, min(step * size, self.n)))


@dataclass
class ValidationResult:
    step: int
    loss: float
    loss_tokens: int
    samples: int
    batches: int
    seconds: float
    account: RunAccount = field(default_factory=RunAccount)


class Validation:
    """One rank's validation: the held-out source, its batch builder and the best loss so far."""

    def __init__(self, config: ValidationConfig, dataloader, tokenizer) -> None:
        self.config = config
        data = config.source_config(dataloader.config)
        source = DATASETS[data.dataset](data, tokenizer)
        if getattr(source, "bad", None):
            logger.warning(f"validation: {source.bad_summary()}")
        n = config.samples or (len(source) if hasattr(source, "__len__") else 0)
        if not n:
            raise ValueError("validation.samples: 0 needs a held-out source with a length (set it for synthetic)")
        if hasattr(source, "__len__") and config.samples:
            n = min(n, len(source))
        self.source = HeldOut(source, n)
        self.batch_size = config.global_batch_size or dataloader.config.global_batch_size
        self.batches = -(-n // self.batch_size)
        train = dataloader.builder
        self.limit = train.limit
        self.build = StepBuilder(self.source, train.scheduler, train.limit, self.batch_size,
                                 train.dp_rank, train.cp_rank, lockstep_passes=True, warn=False,
                                 token_multiple=train.token_multiple)
        self.best: ValidationResult | None = None
        logger.info(f"Validation: {n} held-out samples of {data.dataset_path} in {self.batches} batches of "
                    f"{self.batch_size}, every {config.freq or 'last'} step(s)" +
                    (f", best model kept in {BEST_FOLDER}/" if config.keep_best else ""))

    # What check_overlength reads of a loader: a held-out sample over the limit under
    # 'error' fails before training, not at the first validation step.
    step_unit = "validation batch"  # its lines count these, not the run's steps
    def length_bound(self) -> int | None:
        return self.source.max_length

    def step_lengths(self, step: int) -> list[tuple[int, int]]:
        return [(i, self.source.length(i)) for i in self.source.global_batch(step, self.batch_size)]

    def check(self) -> None:
        check_overlength(self, first_step=1, last_step=self.batches)

    @torch.no_grad()
    def run(self, trainer, step: int) -> ValidationResult:
        """Evaluate the held-out set with ``trainer``'s model; log it; keep the best model."""
        start = time.perf_counter()
        for m in trainer.model_parts:
            m.eval()
        account = RunAccount()
        local = torch.zeros((), dtype=torch.float64, device=trainer.device)
        tokens = 0
        for k in range(1, self.batches + 1):
            batch = self.build(k, account)
            tokens += batch.global_valid_tokens
            for mb in batch.micro_batches:
                positions = mb.positions.to(trainer.device)
                with trainer.train_context():
                    pred = trainer.model_parts[0](mb.input.to(trainer.device), positions=positions,
                                                  attention_masks=mb.meta)
                    loss, _ = trainer.loss_fn(pred, mb.labels.to(trainer.device), positions=positions)
                local += loss.double()
                del pred
            # overlength = "chunk": each document whole, in chunks (train/chunked.py), on every DP rank: outside
            # a free-running step FSDP all-gathers every unit over the whole mesh in each forward, so every rank
            # runs every document's chunk passes (as the micro-batches' pad passes); the rank its plan names counts it.
            # Each in the chunk training gives a document of its length (LengthLimit.chunk: the memory rule's
            # fitted chunk, scheduler/chunk_cost.py fitting_chunk), never more than training holds.
            plan = batch.plan
            for k, i in enumerate(batch.samples[len(plan.input_lengths):]):
                sample = cut(self.source[i], plan.chunked[k])  # at its kept length (max_len's cut), as counted
                with trainer.train_context():
                    out = chunked_loss(trainer.model_parts[0], sample.input.to(trainer.device),
                                       sample.labels.to(trainer.device), self.limit.chunk(sample.length),
                                       lambda pred, labels: trainer.loss_fn(pred, labels)[0],
                                       layers=trainer.dacp_attention, group=trainer.cp_group, recompute=False,
                                       traced=trainer.chunk_path.traced, tp=trainer.parallel_dims.tp)
                if plan.chunked_group[k] == self.build.dp_rank:
                    local += out.loss.double()
        for m in trainer.model_parts:
            m.train()
        after_forward_only(trainer.model_parts)  # FSDP as after a backward (free_running.py says why)
        dims = trainer.parallel_dims
        total = dist_utils.dist_sum(local, dims.get_optional_mesh("loss")) if dims.dp_cp_enabled else float(local)
        result = ValidationResult(step, total / max(tokens, 1), tokens, account.totals.read, self.batches,
                                  time.perf_counter() - start, account)
        improved = math.isfinite(result.loss) and (self.best is None or result.loss < self.best.loss)
        if improved:
            self.best = result
        self._log(trainer, result)
        if improved and self.config.keep_best:
            self._keep(trainer, result)
        return result

    def _log(self, trainer, r: ValidationResult) -> None:
        t = r.account.totals
        best = "" if self.best is None else f", best {self.best.loss:.5f} at step {self.best.step}"
        logger.info(f"validation step {r.step}: loss {r.loss:.5f} over {r.loss_tokens} loss tokens of {r.samples} "
                    f"samples ({t.whole} whole + {t.cut} cut + {t.skipped} skipped) in {r.batches} batches, "
                    f"{r.seconds:.2f} s{best}")
        trainer.metrics_processor.logger.log({
            "validation/loss": r.loss, "validation/loss_tokens": float(r.loss_tokens),
            "validation/samples": float(r.samples), "validation/time_s": r.seconds}, r.step)

    def _keep(self, trainer, r: ValidationResult) -> None:
        """Write the model as a HF folder (collective; rank 0 writes, into a fresh folder, then swaps it in)."""
        from skrull_ext.hf.folder import HFExport
        from skrull_ext.lora.peft_io import save_merged

        config = trainer.config
        write = not dist.is_initialized() or dist.get_rank() == 0
        folder = os.path.join(config.dump_folder, BEST_FOLDER)
        fresh = folder + ".tmp"
        if write:
            shutil.rmtree(fresh, ignore_errors=True)
        files = getattr(trainer, "hf_files", None) or HFExport.for_job(config)  # made before the RoPE cache shrank
        save_merged(trainer.model_parts[0], config.model_spec, fresh, files, config.checkpoint.export_dtype,
                    write=write)
        if write:
            with open(os.path.join(fresh, "validation.json"), "w") as f:
                f.write(f'{{"step": {r.step}, "loss": {r.loss!r}, "loss_tokens": {r.loss_tokens}}}\n')
            shutil.rmtree(folder, ignore_errors=True)
            os.replace(fresh, folder)
            logger.info(f"validation: best loss so far ({r.loss:.5f}, step {r.step}): model written to {folder}")
        if dist.is_initialized():
            dist.barrier()
