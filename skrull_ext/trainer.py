"""SkrullTrainer: torchtitan's Trainer with a ``[skrull]`` config section.

The CPU compatibility fixes (``skrull_ext.compat``) are applied first thing,
so every way of launching (``-m skrull_ext.train``, ``-m torchtitan.train
--module skrull_ext``, tests) gets them. With ``skrull.enable = false`` this
trainer is torchtitan's own: same batching, same loss, same step.
"""

from dataclasses import dataclass, field

from torchtitan.trainer import Trainer

from skrull_ext import compat
from skrull_ext.skrull_section import SkrullSection


class SkrullTrainer(Trainer):
    @dataclass(kw_only=True, slots=True)
    class Config(Trainer.Config):
        skrull: SkrullSection = field(default_factory=SkrullSection)
        """How Skrull schedules each global batch (see skrull_section.py)."""

    config: Config

    def __init__(self, config: Config):
        compat.apply(config)
        super().__init__(config)
