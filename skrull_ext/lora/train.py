# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""What a LoRA training run writes when it ends (``[lora] save_adapter``,
``save_merged``): peft and HF folders under the dump folder.

Every rank calls this (gathering FSDP shards is collective); rank 0 writes.
Pipeline parallelism splits the model over ranks and is not handled (the
Skrull trainer refuses PP anyway).
"""

from __future__ import annotations

import os

import torch.distributed as dist
from torchtitan.tools.logging import logger

from skrull_ext.lora.peft_io import save_adapter, save_merged


def save_lora_outputs(trainer) -> None:
    config = trainer.config
    lora = getattr(config, "lora", None)
    if lora is None or not lora.enable or not (lora.save_adapter or lora.save_merged):
        return
    if len(trainer.model_parts) != 1:
        raise ValueError("lora.save_adapter / save_merged: one model part expected (no pipeline parallelism)")
    model, spec = trainer.model_parts[0], config.model_spec
    write = not dist.is_initialized() or dist.get_rank() == 0
    source = config.hf_assets_path or None
    if lora.save_adapter:
        folder = os.path.join(config.dump_folder, "lora_adapter")
        save_adapter(model, spec, lora, folder, base_model_name_or_path=source, write=write)
        logger.info(f"LoRA: adapter written to {folder} (peft format)")
    if lora.save_merged:
        folder = os.path.join(config.dump_folder, "lora_merged")
        save_merged(model, spec, folder, source=source, write=write)
        logger.info(f"LoRA: merged model written to {folder}")
