"""torchtitan 0.3.0's MetricsProcessor, with one TensorBoard folder per run and
no MFU on CPU.

TensorBoard folder: torchtitan names a run's folder by the minute it started
(``<dump_folder>/tb/%Y%m%d-%H%M``), so two launches in the same minute (a run
and its continuation, in the same dump_folder) write into one folder and
TensorBoard draws their steps interleaved as one run. Here the folder is named
by the second, with ``-1``, ``-2``, ... when a folder of that second exists
(claimed with ``mkdir``, so two launches cannot share one). Names still sort
in start order, so the newest run is the largest name, as before.

MFU on CPU: torchtitan divides by the peak FLOPS of the device it recognises
and falls back to an A100's, so a CPU run logged an A100 MFU. On CPU this
logs none (``mfu: N/A``, no ``mfu(%)`` tag), as torchtitan does under
quantization. The CPU memory figures come from ``torchtitan_patches``'s CPU
device module (the process's peak resident memory).

Document-aware FLOPs: torchtitan's ``tflops``/``mfu`` price every token's
attention at ``training.seq_len``. A trainer that sets ``meter`` (a
``skrull_ext.train.doc_flops.DocumentMeter``) has each logged step carry
its figures too (``documents/*``, ``compile/graphs``) and a line saying
which MFU is which after torchtitan's.

Colour: torchtitan colours its step and model-size lines with ANSI codes
unless ``[metrics] disable_color_printing``; here they are plain whenever the
log is not a terminal (``colour_terminal``: a redirected log, CI) or
``NO_COLOR`` is set.

Installed by ``use_run_metrics(config)`` (JobTrainer calls it beside
``torchtitan_patches.apply``); the rest of the processor is torchtitan's.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from datetime import datetime

import torch.distributed as dist
from torchtitan.components.metrics import (
    LoggerContainer,
    MetricsProcessor,
    TensorBoardLogger,
    _get_metrics_rank,
)
from torchtitan.config.override import derive
from torchtitan.tools.logging import logger
from torchtitan.tools.utils import NoColor

__all__ = ["RunMetricsProcessor", "claim_run_folder", "colour_terminal", "use_run_metrics"]


def claim_run_folder(parent: str, now: datetime | None = None) -> str:
    """Create and return a new folder under ``parent`` named by the second
    (``20261126-143005``), suffixed ``-N`` if that name is taken."""
    os.makedirs(parent, exist_ok=True)
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    for n in range(10_000):
        path = os.path.join(parent, stamp if n == 0 else f"{stamp}-{n}")
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            continue
    raise RuntimeError(f"{parent}: 10000 runs started in the second {stamp}")


class RunMetricsProcessor(MetricsProcessor):
    @dataclasses.dataclass(kw_only=True, slots=True)
    class Config(MetricsProcessor.Config):
        pass

    def __init__(self, config: Config, **kwargs):
        super().__init__(config, **kwargs)
        from torchtitan_patches import on_cpu

        if not colour_terminal():
            self.color = NoColor()  # what metrics.disable_color_printing gives, without asking for it

        if on_cpu():
            # torchtitan's switch for "no MFU" (it skips MFU under quantization):
            # a CPU has no peak figure to divide by.
            self.has_quantization = True
        self.meter = None
        """The trainer's DocumentMeter (skrull_ext/train/doc_flops.py), or None."""

    def log(self, step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=None):
        """torchtitan's log, with the meter's figures over the same interval."""
        if self.meter is None:
            return super().log(step, global_avg_loss, global_max_loss, grad_norm, extra_metrics=extra_metrics)
        documents = self.meter.metrics(time.perf_counter() - self.time_last_log)
        super().log(step, global_avg_loss, global_max_loss, grad_norm,
                    extra_metrics={**(extra_metrics or {}), **documents})
        logger.info(self.meter.line(step, documents))

    def _build_metric_logger(self, *, config, parallel_dims, dump_folder, pp_schedule, ft_enable=False,
                             ft_replica_id=0, config_dict=None, tag=None):
        """torchtitan's loggers, the TensorBoard one in a folder of this run's own."""
        others = super()._build_metric_logger(
            config=dataclasses.replace(config, enable_tensorboard=False), parallel_dims=parallel_dims,
            dump_folder=dump_folder, pp_schedule=pp_schedule, ft_enable=ft_enable, ft_replica_id=ft_replica_id,
            config_dict=config_dict, tag=tag)
        if not config.enable_tensorboard:
            return others
        rank = dist.get_rank()
        if config.save_for_all_ranks:  # every rank writes under the same run folder: rank 0 names it
            name = [claim_run_folder(os.path.join(dump_folder, config.save_tb_folder)) if rank == 0 else None]
            dist.broadcast_object_list(name, src=0)
            folder = name[0]
        elif rank == _get_metrics_rank(parallel_dims=parallel_dims, pp_schedule=pp_schedule):
            folder = claim_run_folder(os.path.join(dump_folder, config.save_tb_folder))
        else:
            return others
        if ft_enable:
            folder = os.path.join(folder, f"replica_{ft_replica_id}")
        if config.save_for_all_ranks:
            folder = os.path.join(folder, f"rank_{rank}")
        container = others if isinstance(others, LoggerContainer) else LoggerContainer()
        container.add_logger(TensorBoardLogger(folder, tag))
        return container


def colour_terminal(stream=None) -> bool:
    """Whether log lines may carry ANSI colour codes: the log stream (torchtitan's logger
    writes to stdout) is a terminal and ``NO_COLOR`` (no-color.org) is unset. A log
    redirected to a file, a pipe or a CI log gets plain text."""
    stream = sys.stdout if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return bool(isatty is not None and isatty()) and not os.environ.get("NO_COLOR")


def use_run_metrics(config) -> None:
    """Make ``config.metrics`` build a RunMetricsProcessor (same fields); idempotent."""
    if not isinstance(config.metrics, RunMetricsProcessor.Config):
        config.metrics = derive(config.metrics, RunMetricsProcessor.Config)
