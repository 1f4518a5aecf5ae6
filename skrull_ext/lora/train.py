# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""What a LoRA training run writes when it ends: the peft adapter
(``[lora] save_adapter``), the merged model (``save_merged``), and the
merged model again in the last checkpoint's HF folder
(``[checkpoint] last_save_in_hf``).

torchtitan's last save runs the model's state dict through the state-dict
adapter, which has no HF name for ``lora_a`` / ``lora_b`` and drops them: the
folder it writes holds the frozen base, the trained adapters nowhere. So for
a LoRA run that folder's weights are replaced by the merged ones, written
in ``[checkpoint] export_dtype`` like the rest of it; the merged folder uses
the same dtype. Both are complete HF folders (config.json, tokenizer files,
chat template: ``HFExport``).

Every rank calls this (gathering FSDP shards is collective); rank 0 writes.
Pipeline parallelism splits the model over ranks and is not handled (the
Skrull trainer refuses PP anyway).
"""

from __future__ import annotations

import glob
import os
import shutil

import torch.distributed as dist
from torchtitan.tools.logging import logger

from skrull_ext.hf.folder import files_said
from skrull_ext.lora.peft_io import merged_hf_state_dict, save_adapter

TORCHTITAN_HF_WEIGHTS = ("model-*-of-*.safetensors", "model.safetensors.index.json", "sharded")
"""What torchtitan's ``last_save_in_hf`` writes into the step folder: the consolidated
shards, their index, and the per-rank shards they were made from (``sharded/``)."""


def save_lora_outputs(trainer, last_hf_folder: str | None = None) -> None:
    """Write the run's LoRA outputs; ``last_hf_folder``: the step folder torchtitan's
    ``last_save_in_hf`` wrote (its base weights are replaced by the merged ones)."""
    config = trainer.config
    lora = getattr(config, "lora", None)
    if lora is None or not lora.enable:
        return
    if not (lora.save_adapter or lora.save_merged or last_hf_folder):
        return
    if len(trainer.model_parts) != 1:
        raise ValueError("lora: one model part expected to write adapters and merged models (no pipeline parallelism)")
    model, spec = trainer.model_parts[0], config.model_spec
    write = not dist.is_initialized() or dist.get_rank() == 0
    if lora.save_adapter:
        folder = os.path.join(config.dump_folder, "lora_adapter")
        save_adapter(model, spec, lora, folder, base_model_name_or_path=config.hf_assets_path or None, write=write)
        logger.info(f"LoRA: adapter written to {folder} (peft format)")
    if not (lora.save_merged or last_hf_folder):
        return
    merged = merged_hf_state_dict(model, spec, keep=write)  # collective: every rank gathers, rank 0 keeps
    if not write:
        return
    dtype = config.checkpoint.export_dtype
    if lora.save_merged:
        folder = os.path.join(config.dump_folder, "lora_merged")
        written = trainer.hf_export.write(folder, merged, dtype)
        logger.info(f"LoRA: merged model written to {folder} (HF folder, weights in {dtype}: {files_said(written)})")
    if last_hf_folder:
        drop_torchtitan_hf_weights(last_hf_folder)
        trainer.hf_export.write(last_hf_folder, merged, dtype)
        logger.info(f"LoRA: {last_hf_folder} holds the merged model (the adapters folded into the base weights)")


def drop_torchtitan_hf_weights(folder: str) -> None:
    """Remove the weights torchtitan's last save wrote into ``folder`` (TORCHTITAN_HF_WEIGHTS)."""
    for pattern in TORCHTITAN_HF_WEIGHTS:
        for path in glob.glob(os.path.join(folder, pattern)):
            if os.path.isdir(path):
                shutil.rmtree(path)
            else:
                os.remove(path)
