"""``JobConfig``: every skrull-ext job's config, Skrull on or off.

torchtitan's ``Trainer.Config`` plus ``[skrull]`` (skrull_config.py), ``[lora]``,
``[validation]`` (validation_config.py) and the heartbeat of ``[comm]``
(comm_config.py). It chooses the trainer by ``skrull.enable``: ``build()`` builds
the class registered for that value (``TRAINERS``). The trainers sit above this
config and register themselves (train/trainer.py: ``SkrullTrainer`` for true,
``PackedTrainer``, torchtitan's own batching, for false), so this module names
none of them: importing train/trainer.py wires ``build()``, as the launchers do.
"""

import dataclasses
from dataclasses import dataclass, field

from torchtitan.config.override import derive
from torchtitan.observability import structured_logger as sl
from torchtitan.trainer import Trainer

from skrull_ext.data.steps.packed import PackedDataLoader
from skrull_ext.data.steps.loader import SkrullDataLoader
from skrull_ext.lora import LoRAConfig
from skrull_ext.train.job.comm_config import SkrullComm
from skrull_ext.train.job.skrull_config import SkrullConfig
from skrull_ext.train.job.tensor_parallel import pp_refusal
from skrull_ext.train.job.validation_config import ValidationConfig

TRAINERS: dict[bool, type[Trainer]] = {}
"""``skrull.enable`` -> the trainer class that runs the job (``register_trainer``)."""


def register_trainer(skrull_enable: bool, trainer: type[Trainer]) -> None:
    """Let a job with ``skrull.enable = skrull_enable`` build ``trainer`` (``JobConfig.build``)."""
    TRAINERS[skrull_enable] = trainer


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
    def trainer_class(self) -> type[Trainer]:
        """The trainer this job runs, resolved from ``skrull.enable`` here only
        (as ``__post_init__`` resolves the dataloader): the class registered for it
        (``TRAINERS``; SkrullTrainer with Skrull on, else PackedTrainer, torchtitan's batching)."""
        trainer = TRAINERS.get(self.skrull.enable)
        if trainer is None:
            raise RuntimeError(f"no trainer is registered for skrull.enable = {self.skrull.enable}: "
                               "import train/trainer.py (it registers both) before build()")
        return trainer

    def build(self, **kwargs) -> Trainer:
        """torchtitan's ``Configurable.Config.build()`` (the trainer gets a copy),
        building ``trainer_class`` rather than the class that holds this config: the choice
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
