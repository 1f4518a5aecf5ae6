"""Finish a HF folder: config.json and tokenizer files beside the weights.

torchtitan's ``[checkpoint] last_save_in_hf`` writes only the safetensors
(through the spec's state-dict adapter), and ``python -m skrull_ext.export``
writes them from a mid-run DCP checkpoint; ``transformers``'
``from_pretrained`` also needs config.json, and a fine-tuned model is used
with its tokenizer. ``HFExport`` holds what to put beside the weights,
decided when the job starts:

- config.json: the source folder's when the job started from ``[model]
  hf_path`` (it keeps every key transformers and downstream tools read, e.g.
  token ids), with its dtype set to the one the weights were written in;
  otherwise one written from the model spec (``hf_config_json``).
- the tokenizer files of the job's tokenizer folder (none for the synthetic
  tokenizer), its chat template among them, and the source folder's
  generation_config.json;
- the chat template the run trained with when it is not the tokenizer's own
  (``dataloader.chat_template``, or the ChatML fallback), as
  chat_template.jinja: served with another template, the model would meet
  markers it was not fine-tuned on.

Every HF folder the product writes goes through here (the last checkpoint,
the export, a LoRA run's merged folder), so all carry the same files.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass

import torch
from safetensors.torch import save_file
from torchtitan.components.tokenizer import HuggingFaceTokenizer

from skrull_ext import assets
from skrull_ext.data.sources.chat_template import trained_template
from skrull_ext.models.hf_config import hf_config_json, read_hf_config, spec_dims
from skrull_ext.scheduler.model_shape import DTYPES

TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
    "tokenizer.model", "chat_template.jinja", "added_tokens.json",
)
"""Files HF tokenizers are saved as; whichever exist are copied."""
SOURCE_FILES = ("generation_config.json",)
"""Files of the source model folder that describe the model, not its weights."""


@dataclass(frozen=True)
class HFExport:
    config_json: dict
    """config.json to write (its dtype is set when written)."""
    tokenizer_dir: str | None
    """Folder whose TOKENIZER_FILES are copied, or None."""
    source_dir: str | None = None
    """The HF folder the job started from, or None."""
    chat_template: str | None = None
    """The template the run trained with when not the tokenizer's own (chat_template.jinja), or None."""

    @classmethod
    def for_job(cls, config) -> HFExport:
        """What a job's HF folders carry besides the weights (any job). Call it before
        torchtitan's trainer is built: it shrinks the RoPE cache (``max_seq_len``) to
        ``training.seq_len``, and a config.json written from the shrunk spec says
        ``max_position_embeddings`` 512 beside a rope_scaling of 8192 (transformers warns)."""
        source = config.hf_assets_path or None
        if source and os.path.isfile(os.path.join(source, "config.json")):
            config_json = read_hf_config(source)
        else:
            source = None
            spec = config.model_spec
            config_json = hf_config_json(spec.name, spec_dims(spec.model))
        tokenizer = _tokenizer_dir(config)
        data = config.dataloader
        template = trained_template(tokenizer, getattr(data, "chat_template", ""), getattr(data, "dataset", ""),
                                    getattr(data, "format", "auto"))
        return cls(config_json, tokenizer, source, template)

    @classmethod
    def of_folder(cls, folder: str) -> HFExport:
        """What a HF folder of a model made from the one in ``folder`` carries: its
        config.json, tokenizer files (when it has a tokenizer.json) and generation config."""
        tokenizer = folder if os.path.isfile(os.path.join(folder, "tokenizer.json")) else None
        return cls(read_hf_config(folder), tokenizer, folder)

    @staticmethod
    def written_at_end(config) -> bool:
        """Whether the job writes a HF folder when it ends (its last checkpoint in HF
        format, or a LoRA run's merged model)."""
        ckpt, lora = config.checkpoint, getattr(config, "lora", None)
        return (ckpt.enable and ckpt.last_save_in_hf) or (lora is not None and lora.enable and lora.save_merged)

    def write(self, folder: str, tensors: dict[str, torch.Tensor], dtype: str) -> list[str]:
        """Write ``tensors`` (HF keys) as ``folder``/model.safetensors in ``dtype``, then ``finish``;
        returns the names of the files written."""
        os.makedirs(folder, exist_ok=True)
        save_file({k: v.to(DTYPES[dtype]).contiguous() for k, v in tensors.items()},
                  os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
        return ["model.safetensors", *self.finish(folder, dtype)]

    def finish(self, folder: str, dtype: str) -> list[str]:
        """Write config.json (weights in ``dtype``) and copy the tokenizer files into ``folder``;
        returns the names of the files written, so what is reported is what was written (a
        synthetic tokenizer has no files to copy)."""
        written = ["config.json"]
        cfg = dict(self.config_json)
        cfg["torch_dtype"] = dtype
        cfg.pop("dtype", None)  # transformers 5's name for it; one key, read by 4 and 5
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2, sort_keys=True)
            f.write("\n")
        for src_dir, names in ((self.tokenizer_dir, TOKENIZER_FILES), (self.source_dir, SOURCE_FILES)):
            for name in names if src_dir else ():
                path = os.path.join(src_dir, name)
                if os.path.isfile(path):
                    shutil.copyfile(path, os.path.join(folder, name))
                    written.append(name)
        if self.chat_template is not None:
            with open(os.path.join(folder, "chat_template.jinja"), "w", encoding="utf-8") as f:
                f.write(self.chat_template)
            written.append("chat_template.jinja")
        return list(dict.fromkeys(written))


def files_said(names: list[str]) -> str:
    """``names`` of a written HF folder, in words for a log line: the tokenizer files
    counted as such, or said to be absent (a synthetic tokenizer has none)."""
    tokenizer = [n for n in names if n in TOKENIZER_FILES]
    rest = [n for n in names if n not in TOKENIZER_FILES]
    said = ", ".join(rest)
    if tokenizer:
        return f"{said}, tokenizer files ({', '.join(tokenizer)})"
    return (f"{said}; no tokenizer files (the job's tokenizer has none: a synthetic one, or a folder without "
            "tokenizer.json)")


def _tokenizer_dir(config) -> str | None:
    """The folder the job's tokenizer reads (None for the synthetic one)."""
    if not isinstance(config.tokenizer, HuggingFaceTokenizer.Config):
        return None
    path = getattr(config.tokenizer, "path", "") or config.hf_assets_path
    folder = assets.tokenizer_path(path) if path else ""
    return folder if os.path.isfile(os.path.join(folder, "tokenizer.json")) else None
