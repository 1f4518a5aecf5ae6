"""JobTrainer: what every skrull-ext job's trainer does, whichever batching.

torchtitan's Trainer plus, around it: the dump folder's lock (run_lock.py),
the launcher watch and the Ctrl-C line (launcher_watch.py, interrupt.py),
the CPU fixes (``torchtitan_patches``), rank 0's log lines, a TensorBoard
folder per run, LoRA, the HF folder checks before any model is built and the
HF/LoRA outputs after the last step, the stopped-rank watch, and the run
summary ``read = trained whole + trained cut + skipped``
(data/steps/accounting.py). The batching is a subclass:
``PackedTrainer`` (packed_trainer.py, torchtitan's own batching and step) or
``SkrullTrainer`` (trainer.py, the Skrull plan's micro-batches). Which one a
job runs is the config's choice (``JobConfig.trainer_class``, job_config.py), so
neither branches on ``skrull.enable``.
"""

import os
import shutil

import torch.distributed as dist
from torchtitan.components.checkpoint import DATALOADER
from torchtitan.models.common.config_utils import decoder_vocab_size
from torchtitan.tools.logging import logger
from torchtitan.trainer import Trainer

import torchtitan_patches
from skrull_ext.data.steps.overlength import location
from skrull_ext.hf.checks import check_hf_folder
from skrull_ext.hf.folder import HFExport, files_said
from skrull_ext.lora import apply_lora
from skrull_ext.lora.train import save_lora_outputs
from skrull_ext.train import interrupt, launcher_watch, stop_line
from skrull_ext.scheduler.model_shape import compute_dtype
from skrull_ext.train.doc_flops import DocumentFlops, DocumentMeter
from skrull_ext.train.head_loss import ChunkedHeadLoss, HeadBackward, resolve_chunking, resolve_head_backward
from skrull_ext.train.job.resume_checks import check_continue
from skrull_ext.train.job.weights_from_checkpoint import params_loaded_whole
from skrull_ext.train.run_lock import claim_dump_folder
from skrull_ext.train.step_phases import StepPhases, StepTimes, clock_for, phases_summary
from skrull_ext.train.watchdog import start_heartbeat
from torchtitan_patches import logs, param_init
from torchtitan_patches.metrics import use_run_metrics


class NonFiniteLossError(RuntimeError):
    """A step's loss or gradient norm is not finite; the optimizer did not step."""


def name_samples(source, indices: list[int], most: int = 8) -> str:
    """The samples of a step, with their records (``file:line``) where the source knows them."""
    names = [f"{i} ({location(source, i)})" if hasattr(source, "location") else str(i) for i in indices[:most]]
    return ", ".join(names) + (f" and {len(indices) - most} more" if len(indices) > most else "")


class JobTrainer(Trainer):
    """The shared base of the two batchings. Its config is ``JobConfig``
    (job_config.py, every job's config), whose ``build()`` builds the subclass the
    config names; a subclass built directly for a config that names the other
    one is refused before anything is built."""

    def __init__(self, config):
        if not isinstance(self, config.trainer_class):
            raise TypeError(
                f"{type(self).__name__} cannot run a job with skrull.enable = {config.skrull.enable}: "
                f"that job's trainer is {config.trainer_class.__name__} (config.build() builds it)"
            )
        # Before anything is written: rank 0 owns the dump folder or the run stops here, in one line
        # (the other ranks wait for it in init_process_group, which a refused rank 0 never joins).
        self.run_lock = claim_dump_folder(config.dump_folder, int(os.environ.get("RANK", "0")))
        try:
            self._build(config)
        except BaseException:  # a trainer that was not built holds no folder (a retry in the same process)
            if self.run_lock is not None:
                self.run_lock.release()
                self.run_lock = None
            raise

    def _build(self, config) -> None:
        """Everything after the dump folder's lock: the checks and torchtitan's Trainer."""
        stop_line.track(self, config)
        if launcher_watch.start_launcher_watch() is not None:  # under torchrun
            interrupt.install()
        # The CPU fixes for every trainer, however its config was made (torchtitan's
        # launcher, a test building one in Python); torchtitan_patches says which entry applies them.
        torchtitan_patches.apply(config)
        logs.install()  # rank 0's lines only; skrull_ext.train installs it sooner
        use_run_metrics(config)  # a TensorBoard folder per run; no MFU on CPU
        apply_lora(config)  # before torchtitan builds config.model_spec.model
        self._before_model(config)
        ckpt = config.checkpoint
        if ckpt.enable and ckpt.initial_load_in_hf and ckpt.initial_load_path:
            check_hf_folder(ckpt.initial_load_path, config.model_spec)  # a bad folder fails before any model
        # a HF last save cannot continue a run: one line naming checkpoint.load_step
        continues = check_continue(config)
        self.hf_files = HFExport.for_job(config)  # before the trainer shrinks the RoPE cache
        """What any HF folder the run writes carries besides weights (validation's best model too)."""
        self.hf_export = self.hf_files if HFExport.written_at_end(config) else None
        """``hf_files`` when the run writes a HF folder when it ends (None: it writes none)."""
        self.stopped_step: tuple[int, int] | None = None
        """(step, samples read) of a step stopped before its optimizer step (non-finite loss)."""
        with param_init.skip_param_init(params_loaded_whole(config)):  # the start-up load writes them
            super().__init__(config)
        expect = getattr(self.dataloader, "expect_checkpoint", None)  # skrull-ext's loaders (data/steps/base.py)
        if continues is not None and expect is not None and DATALOADER not in config.checkpoint.exclude_from_loading:
            # its keys before DCP loads them: a checkpoint without data_order loads, said in one line
            expect(os.path.abspath(continues.path), continues.dataloader_keys)
        self.step_phases = StepPhases(clock_for(self.device))
        """The phases of each step, timed on the device's clock (step_phases.py); the batching marks them."""
        self._chunk_head(config)
        self.document_meter = DocumentMeter(
            DocumentFlops.of_model(config.model_spec.model, self.model_parts),
            dist.get_world_size() if dist.is_initialized() else 1,
            None if torchtitan_patches.on_cpu() else self.metrics_processor.gpu_peak_flops, config.training.seq_len)
        """Each step's FLOPs from its documents (doc_flops.py), logged beside torchtitan's figures."""
        self.metrics_processor.meter = self.document_meter
        vocab, model_vocab = self.tokenizer.get_vocab_size(), decoder_vocab_size(config.model_spec)
        if vocab > model_vocab:
            raise ValueError(
                f"the tokenizer's vocabulary ({vocab}) is larger than the model's ({model_vocab}): "
                "token ids would index past the embedding"
            )

    def _chunk_head(self, config) -> None:
        """The chunk of the head and loss (train/head_loss.py), and how its chunks get their
        gradients (``[loss] head_backward``), settled once, in two lines: the profile's measured
        bytes a token where the job has a measured profile."""
        if not isinstance(self.loss_fn, ChunkedHeadLoss):
            return
        skrull = config.skrull
        backward = resolve_head_backward(config.loss, self.loss_fn.lm_head, self.loss_fn.loss_fn,
                                         self.parallel_dims.tp_enabled,
                                         skrull.enable and skrull.overlength == "chunk")
        profile = skrull.measured_profile() if skrull.enable else None
        cp = self.parallel_dims.cp
        tokens, bound = ((skrull.resolved_bucket_size(), "the job's BucketSize") if skrull.enable
                         else (config.training.local_batch_size * config.training.seq_len // cp,
                               "local_batch_size x seq_len / cp"))
        shape = (config.loss, decoder_vocab_size(config.model_spec), compute_dtype(config).itemsize, profile)
        # the head in the model's forward holds what a recompute chunk of the micro-batch holds
        chunking = resolve_chunking(*shape, head_backward="recompute")
        whole = chunking.chunk_tokens >= tokens and config.loss.head_backward != "in_forward"
        if not whole and backward.mode == "in_forward":
            chunking = resolve_chunking(*shape, head_backward="in_forward")
        self.loss_fn.set_chunking(chunking)
        line = chunking.line(tokens, bound)
        if whole:  # one chunk holds every micro-batch: nothing to chunk
            self.loss_fn.put_head_back(self.model_parts)
            line += "; one chunk holds a micro-batch, so the head runs in the model's forward"
            backward = HeadBackward("autograd's", "the head in the model's forward, unchunked")
        elif self.loss_fn.pass_head_through(self.model_parts):
            line += "; the head module runs in the model's forward, its weight applied per chunk"
        # else a head whose forward head_loss.HEAD_FORWARDS does not know: called from the loss, DP lockstep
        if backward.mode in ("in_forward", "recompute"):
            self.loss_fn.set_head_backward(backward.mode)
        logger.info(line)
        logger.info(backward.line())

    def _before_model(self, config) -> None:
        """What the batching resolves and checks on the config before torchtitan
        builds anything (after LoRA, before the HF folder checks); nothing here."""

    def train(self) -> None:
        """``_train`` with the stopped-rank watch on (``[comm] heartbeat_timeout_seconds``,
        watchdog.py): a rank that stops answering ends the job in one line naming it. A
        collective that timed out first (train_timeout_seconds) is followed by the ranks
        whose heartbeat had stopped."""
        heartbeat = start_heartbeat(getattr(self.config.comm, "heartbeat_timeout_seconds", 0.0),
                                    lambda: self.step)
        try:
            self._train()
        except Exception:
            watch = launcher_watch.current()
            if watch is not None and watch.orphaned():  # a peer left because the launcher died
                launcher_watch.end_orphan(watch.launcher_pid)
            for rank, step, age in heartbeat.silent() if heartbeat is not None else ():
                logger.error(f"rank {rank} has not answered for {age:.1f} s (its last heartbeat at step {step})")
            raise
        finally:
            if heartbeat is not None:
                heartbeat.stop()

    def _train(self) -> None:
        """torchtitan's loop; then the LoRA outputs ([lora] save_adapter/save_merged),
        and, when the last checkpoint was saved in HF format (``last_save_in_hf``),
        config.json and tokenizer files beside its weights, so the folder is one
        ``from_pretrained`` loads (skrull_ext/hf/folder.py). In a LoRA run that
        folder's weights are the merged model's (skrull_ext/lora/train.py). The folder holds
        one copy of the weights: torchtitan's per-rank shards (``sharded/``) are removed once
        consolidated."""
        super().train()
        ckpt = self.config.checkpoint
        last_hf = (ckpt.enable and ckpt.last_save_in_hf and not ckpt.load_only
                   and self.step == self.config.training.steps)
        folder = os.path.join(self.checkpointer.folder, f"step-{self.step}") if last_hf else None
        save_lora_outputs(self, folder)
        if folder is None:
            return
        if dist.is_initialized():
            dist.barrier()  # every rank has consolidated its part of the weights into the folder
        if not dist.is_initialized() or dist.get_rank() == 0:
            # torchtitan writes the per-rank shards to step-N/sharded/ and consolidates them beside it;
            # the shards are then a second full copy of the weights (15 GB on a 7B), read by nothing.
            shutil.rmtree(os.path.join(folder, "sharded"), ignore_errors=True)
            written = self.hf_export.finish(folder, ckpt.export_dtype)
            logger.info(f"HF model folder {folder}: the weights, {files_said(written)}")
        if dist.is_initialized():
            dist.barrier()

    def _read_phases(self, wait: bool = False) -> StepTimes | None:
        """The last logged step's phases (step_phases.py), read once and written to TensorBoard at
        that step, with what the batching adds (``_phase_metrics``). ``wait``: synchronise first
        (at close, the last); otherwise a step's marks are read once they are done, no host sync."""
        times = self.step_phases.take(wait=wait)
        if times is None:
            return None
        metrics = times.metrics()
        self._phase_metrics(times, metrics)
        self.metrics_processor.logger.log(metrics, times.step)
        return times

    def _phase_metrics(self, times: StepTimes, metrics: dict[str, float]) -> None:
        """What the batching adds to a step's phase scalars before they are written; nothing here."""

    def _closing_lines(self) -> None:
        """Before the run summary: the last logged step's phases and the run's median phases."""
        if getattr(self, "step_phases", None) is None:
            return
        if (last := self._read_phases(wait=True)) is not None:
            logger.info(f"Skrull: step {last.step} (the last): {last.clause()}")
        if (line := phases_summary(self.step_phases.read)) is not None:
            logger.info(f"Skrull: {line}")

    def close(self) -> None:
        """The closing lines (``_closing_lines``), the run summary (every sample read, where it
        went), then torchtitan's close."""
        self._closing_lines()
        account = getattr(getattr(self, "dataloader", None), "account", None)
        if account is not None and account.totals.read:
            stopped = ("" if self.stopped_step is None else
                       f" (step {self.stopped_step[0]} stopped before its optimizer update: its "
                       f"{self.stopped_step[1]} samples are counted as read but did not change the weights)")
            source = self.dataloader.source
            bad = f"; at load, {source.bad_summary()}" if getattr(source, "bad", None) else ""
            logger.info(f"Run summary: {account.summary(self._launch_label(account))}{bad}{stopped}"
                        f"{self._summary_tail()}")
        super().close()
        if getattr(self, "run_lock", None) is not None:
            self.run_lock.release()
            self.run_lock = None

    launch_first_step: int | None = None
    """The step this launch began at (``should_continue_training``); None before the loop."""

    def should_continue_training(self) -> bool:
        """torchtitan's; its first call, right after the checkpoint loaded, notes the step this
        launch begins at for the run summary (``_launch_label``). Not the loader's step: under
        'stream' and 'documents' packing that counts the data's global batches, several a step,
        and a resumed launch's summary said "this launch trained no step" after training steps."""
        if self.launch_first_step is None:
            self.launch_first_step = self.step + 1
        return super().should_continue_training()

    def _launch_label(self, account) -> str:
        """Which steps the summary's totals cover: the run's (every launch, kept across
        resumes), and, after a resume, this launch's share beside them."""
        first = self.step + 1 if self.launch_first_step is None else self.launch_first_step  # None: no loop yet
        if first <= 1:
            return f" over the run, steps 1..{self.step}, all in this launch"
        if self.step < first:  # stopped before its first step (a start-up check after the checkpoint loaded)
            return f" over the run, steps 1..{self.step} (every launch); this launch trained no step"
        c = account.launch()
        return (f" over the run, steps 1..{self.step} (every launch); this launch, steps {first}..{self.step}: "
                f"samples read {c.read} = trained whole {c.whole} + trained cut {c.cut} + skipped {c.skipped}")

    def _summary_tail(self) -> str:
        """What the batching adds to the run summary line; nothing here."""
        return ""
