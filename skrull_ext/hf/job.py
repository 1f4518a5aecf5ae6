"""What ``[model] hf_path = "DIR"`` sets in a job besides the model spec.

A job that names a pretrained folder means to fine-tune those weights, so
training must not silently start from a random init. torchtitan loads HF
weights through its checkpointer (``initial_load_in_hf``, the spec's
state-dict adapter, DCP's HuggingFaceStorageReader), and only when
checkpointing is enabled; these become the job's base values, which the
job's own ``[checkpoint]`` table (applied afterwards) can still change. A
checkpoint already in the job's folder wins over the initial load, which is
how a fine-tuning run resumes.

The tokenizer is the folder's too (tokenizer.json, tokenizer_config.json,
through torchtitan's HuggingFaceTokenizer), so a job needs no [tokenizer]
section; its own section still wins. A folder without tokenizer.json (a
weights-only checkpoint) keeps the base config's synthetic tokenizer, which
the synthetic dataset needs no more than.
"""

import dataclasses
import os

from skrull_ext.data.sources.tokenizer import LocalTokenizer


def hf_job_defaults(config, hf_path: str):
    """``config`` (a Trainer.Config) set to start from the HF folder ``hf_path``."""
    folder = os.path.abspath(hf_path)  # torchtitan requires an absolute initial_load_path
    checkpoint = dataclasses.replace(
        config.checkpoint,
        enable=True,
        initial_load_path=folder,
        initial_load_in_hf=True,
        initial_load_model_only=True,
    )
    # hf_assets_path: torchtitan's tokenizer folder and where the adapter
    # looks for model.safetensors.index.json (HF shard layout on save).
    updates = dict(checkpoint=checkpoint, hf_assets_path=folder)
    if os.path.isfile(os.path.join(folder, "tokenizer.json")):
        updates["tokenizer"] = LocalTokenizer.Config()  # empty path: hf_assets_path
    return dataclasses.replace(config, **updates)
