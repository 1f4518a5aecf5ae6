"""``JobConfig``: every skrull-ext job's config, Skrull on or off.

torchtitan's ``Trainer.Config`` plus ``[skrull]`` (skrull_config.py), ``[lora]``,
``[validation]`` and the heartbeat of ``[comm]``. It chooses the trainer:
``build()`` builds ``SkrullTrainer`` (trainer.py, which holds this class as its
``Config``, so torchtitan's Configurable wires the owner) with ``skrull.enable``,
else ``PackedTrainer`` (packed_trainer.py: torchtitan's own batching).
"""

import dataclasses
from dataclasses import dataclass, field

from torchtitan.config.override import derive
from torchtitan.observability import structured_logger as sl
from torchtitan.trainer import Trainer

from skrull_ext.data.steps.packed import PackedDataLoader
from skrull_ext.data.steps.loader import SkrullDataLoader
from skrull_ext.lora import LoRAConfig
from skrull_ext.train.job_trainer import JobTrainer
from skrull_ext.train.packed_trainer import PackedTrainer
from skrull_ext.train.job.skrull_config import SkrullConfig
from skrull_ext.train.tensor_parallel import pp_refusal
from skrull_ext.train.validation import ValidationConfig
from skrull_ext.train.watchdog import SkrullComm


@dataclass(kw_only=True, slots=True)
class JobConfig(Trainer.Config):
    """Every skrull-ext job's config, Skrull on or off: torchtitan's sections plus ``[skrull]``,
    ``[lora]``, ``[validation]`` and the heartbeat of ``[comm]``; ``build()`` builds
    ``trainer_class``."""

    skrull: SkrullConfig = field(default_factory=SkrullConfig)
    """How Skrull schedules each global batch (see skrull_config.py)."""

    lora: LoRAConfig = field(default_factory=LoRAConfig)
    """LoRA adapters on a frozen base model (skrull_ext/lora, docs/lora.md)."""

    comm: SkrullComm = field(default_factory=SkrullComm)
    """torchtitan's [comm] plus heartbeat_timeout_seconds (the stopped-rank watch, watchdog.py)."""

    validation: ValidationConfig = field(default_factory=ValidationConfig)
    """A held-out set's loss every N steps and at the end, batched by Skrull (validation.py)."""

    @property
    def trainer_class(self) -> type[JobTrainer]:
        """The trainer this job runs, resolved from ``skrull.enable`` here only
        (as ``__post_init__`` resolves the dataloader): the owner
        (SkrullTrainer, whose ``Config`` this is) with Skrull on, else PackedTrainer, torchtitan's batching."""
        return self._owner if self.skrull.enable else PackedTrainer

    def build(self, **kwargs) -> JobTrainer:
        """torchtitan's ``Configurable.Config.build()`` (the trainer gets a copy),
        building ``trainer_class`` rather than always the owner: the choice
        follows the final config, whichever launcher parsed it (a job file,
        ``--skrull.no-enable``, torchtitan's ``--module/--config``)."""
        if kwargs:
            raise ValueError(f"a trainer takes no build() arguments, got {sorted(kwargs)}")
        with sl.log_trace_span(f"{type(self).__qualname__}.build"):
            return self.trainer_class(config=dataclasses.replace(self))

    def __post_init__(self):
        Trainer.Config.__post_init__(self)
        if self.skrull.enable and not isinstance(self.dataloader, SkrullDataLoader.Config):
            raise ValueError(
                "skrull.enable needs [dataloader] kind = \"skrull\" "
                f"(got {type(self.dataloader).__qualname__})"
            )
        if self.skrull.enable and self.dataloader.packing != "rows":
            raise ValueError(
                f"dataloader.packing = {self.dataloader.packing!r} is for torchtitan's batching "
                "(skrull.enable = false); Skrull's loader neither pads nor cuts samples"
            )
        if not self.skrull.enable and isinstance(self.dataloader, SkrullDataLoader.Config):
            # Same data, torchtitan's batching: the switch works from the CLI.
            self.dataloader = derive(self.dataloader, PackedDataLoader.Config)
        if self.skrull.enable and self.parallelism.pipeline_parallel_degree > 1:
            raise ValueError(pp_refusal(self.parallelism.pipeline_parallel_degree))
