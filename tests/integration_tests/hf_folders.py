"""Tiny random HF model folders, one per supported family, and the debug job
pointed at one of them (``[model] hf_path``): what the HF integration tests
train, built at test time with transformers ``save_pretrained`` (no download).
"""

import os
import re
import shutil

import torch
import transformers

from skrull_ext import assets
from tests.hf_tiny import perturb
from tests.integration_tests.launch import REPO

DEBUG_JOB = os.path.join(REPO, "skrull_ext", "jobs", "debug_cpu.toml")
VOCAB = 2048
DIMS = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
"""GQA (4 query heads, 2 KV heads) in every family."""
FAMILIES = {
    "qwen2_5": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, dict(tie_word_embeddings=True)),
    "llama3": (transformers.LlamaConfig, transformers.LlamaForCausalLM, dict(tie_word_embeddings=False)),
    # head_dim 32 != hidden / heads, as in the released Qwen3 models.
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, dict(head_dim=32, tie_word_embeddings=True)),
}


def save_tiny_model(folder: str, family: str, perturbed: bool = False) -> str:
    """Save a tiny random ``family`` model with the shipped tiny BPE
    tokenizer beside it into ``folder``; return ``folder``."""
    config_cls, model_cls, extra = FAMILIES[family]
    torch.manual_seed(0)
    model = model_cls(config_cls(**DIMS, **extra))
    if perturbed:
        perturb(model, seed=1)
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(assets.tokenizer_path("tiny_bpe"), name), folder)
    return folder


def hf_job(path, hf_folder: str, checkpoint: str, dataloader: dict | None = None,
           edits: dict[str, str] | None = None) -> str:
    """Write debug_cpu.toml, pointed at ``hf_folder``, to ``path``; return it.

    ``checkpoint``: the body of its ``[checkpoint]`` table. ``dataloader``:
    keys set in ``[dataloader]`` (replacing the debug job's value).
    ``edits``: literal replacements, each of text the job holds once.
    """
    with open(DEBUG_JOB) as f:
        text = f.read()
    text = re.sub(r"\[model\]\n(.+\n)+", f'[model]\nhf_path = "{hf_folder}"\n', text)
    text = re.sub(r"\[checkpoint\]\n(.+\n)+", f"[checkpoint]\n{checkpoint}\n", text)
    # the shipped job's measured profile is of the debug model, not of these folders' models
    text = re.sub(r'cost_model = "[^"]*"', 'cost_model = "h100-assumed"', text)
    for key, value in (dataloader or {}).items():
        text, n = re.subn(rf"(\[dataloader\]\n(?:.+\n)*?){key} = [^\n]*\n", rf"\g<1>{key} = {value}\n", text)
        if n == 0:
            text = text.replace("[dataloader]\n", f"[dataloader]\n{key} = {value}\n")
    for old, new in (edits or {}).items():
        assert text.count(old) == 1, f"{old!r} is not in {DEBUG_JOB} once"
        text = text.replace(old, new)
    with open(path, "w") as f:
        f.write(text)
    return str(path)
