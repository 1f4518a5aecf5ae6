"""Which jobs need no random initialization of parameters: their start-up load overwrites each.

torchtitan's Trainer builds the model on meta, ``to_empty``s it and runs
``init_weights`` (every parameter drawn from the RNG, then every buffer,
RoPE's cache included), and only then, in ``train()``, loads the checkpoint.
When that load is a DCP checkpoint of the model (a job with a seed checkpoint
as ``checkpoint.initial_load_path``: that seed, or the latest full save in the
run's own folder when it has one), DCP's default planner refuses a state dict key the checkpoint lacks, so every
parameter is overwritten: the draws were wasted. On the debug job they are a
third of a rank's start-up CPU (0.2 of 0.7 s). Here, for such a job, the
trainer's construction skips the parameters' initialization
(torchtitan_patches/param_init.py; buffers are still initialized: no
checkpoint holds RoPE's cache).

Same run: the parameters hold the checkpoint's values either way, and nothing
after model construction draws from torch's global RNG (the product's own
draws, the LoRA adapters' initialization included, use seeded generators; a
LoRA job keeps the initialization anyway, its adapters are not in a base
seed). Losses and gradients of the debug CP 2 run are bitwise those of a run
that initializes.

Not skipped: no load, a job without ``initial_load_path`` (its resume from
the run's own folder draws the parameters as before), a HF load (its adapter may not map every parameter),
the model excluded from loading, a seed checkpoint being created, LoRA, and
a HF folder in the run's own checkpoint folder as the step to load.
"""

from __future__ import annotations

import os

from skrull_ext.train.job.resume_checks import saved_steps

__all__ = ["params_loaded_whole"]


def params_loaded_whole(config) -> bool:
    """Whether the start-up load writes every parameter: a DCP model state, with nothing left out."""
    ckpt = config.checkpoint
    lora = getattr(config, "lora", None)
    if (not ckpt.enable or ckpt.create_seed_checkpoint or ckpt.initial_load_in_hf or not ckpt.initial_load_path
            or "model" in ckpt.exclude_from_loading or (lora is not None and lora.enable) or "://" in ckpt.folder):
        return False
    full, hf = saved_steps(os.path.join(config.dump_folder, ckpt.folder))
    load = max(full + hf, default=-1) if ckpt.load_step == -1 else ckpt.load_step
    return load == -1 or load in full
