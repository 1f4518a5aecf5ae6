"""HF folder in, HF folder out, checked against transformers (issue 13 item 4).

A tiny random HF model of each family (transformers ``save_pretrained``, with
the shipped tiny BPE tokenizer beside it) is fine-tuned for 2 steps by the
product's trainer (``[model] hf_path``, 1 process, Skrull's DACP attention),
which saves a DCP checkpoint at step 1 and its last checkpoint in HF format
at step 2. Then:

- ``python -m skrull_ext.export`` turns the step-1 DCP checkpoint into a HF
  folder; transformers loads it and its logits equal those of a torchtitan
  model holding the step-1 weights read straight from the DCP checkpoint;
- the step-2 folder is complete as written by the trainer (config.json,
  tokenizer) and transformers' logits equal the torchtitan model's on it.
"""

import json
import os
import re
import shutil

import pytest
import torch
import transformers

from skrull_ext import assets
from tests.integration_tests.launch import REPO, torchrun

TOL = 1e-5
DEBUG_JOB = os.path.join(REPO, "skrull_ext", "jobs", "debug_cpu.toml")
_DIMS = dict(vocab_size=2048, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)
FAMILIES = {
    "qwen2_5": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, dict(tie_word_embeddings=True)),
    "llama3": (transformers.LlamaConfig, transformers.LlamaForCausalLM, dict(tie_word_embeddings=False)),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, dict(head_dim=32, tie_word_embeddings=True)),
}


def _source(folder: str, family: str) -> None:
    config_cls, model_cls, extra = FAMILIES[family]
    torch.manual_seed(0)
    model = model_cls(config_cls(**_DIMS, **extra))
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(assets.tokenizer_path("tiny_bpe"), name), folder)


def _job(tmp_path, hf_folder: str) -> str:
    with open(DEBUG_JOB) as f:
        text = f.read()
    text = re.sub(r"\[model\]\n(.+\n)+", f'[model]\nhf_path = "{hf_folder}"\n', text)
    text = re.sub(r"\[checkpoint\]\n(.+\n)+", "[checkpoint]\nenable = true\ninterval = 1\nlast_save_in_hf = true\n", text)
    # the shipped job's measured profile is of the debug model, not of these folders' models
    text = re.sub(r'cost_model = "[^"]*"', 'cost_model = "h100-assumed"', text)
    path = tmp_path / "job.toml"
    path.write_text(text)
    return str(path)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """``trained(family)``: (source folder, checkpoint folder) of a 2-step run (cached)."""
    runs = {}

    def run(family: str):
        if family not in runs:
            tmp = tmp_path_factory.mktemp(f"roundtrip-{family}")
            source = str(tmp / f"tiny-{family}")
            _source(source, family)
            dump = str(tmp / "out")
            torchrun(1, "skrull_ext.train", ["--config-file", _job(tmp, source), "--dump_folder", dump,
                                            "--training.steps", "2"], cwd=str(tmp))
            runs[family] = (source, os.path.join(dump, "checkpoint"))
        return runs[family]

    return run


def _tokens() -> torch.Tensor:
    return torch.randint(0, 2048, (2, 40), generator=torch.Generator().manual_seed(5))


def _titan_model(folder: str):
    """The torchtitan model of a HF folder's config.json, causal SDPA attention, float32."""
    from torchtitan.models.common import ScaledDotProductAttention

    from skrull_ext.hf.config import spec_from_hf

    spec = spec_from_hf(folder)
    for layer in spec.model.layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    return spec, spec.model.build().eval()


def _hf_logits(folder: str) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        return model.eval()(_tokens()).logits


def _compare(ours: torch.Tensor, folder: str, what: str) -> float:
    theirs = _hf_logits(folder)
    diff = (ours - theirs).abs().max().item()
    print(f"{what}: max abs logit diff {diff:.3g} (logits up to {theirs.abs().max():.3g})")
    assert theirs.abs().max() > 0.1
    assert diff <= TOL
    return diff


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_hf_round_trip_export_of_a_mid_run_checkpoint(trained, tmp_path, family):
    from skrull_ext.export import load_single_process, main

    source, checkpoints = trained(family)
    out = str(tmp_path / "export")
    assert main([os.path.join(checkpoints, "step-1"), out, "--hf-path", source]) == 0
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(os.listdir(out))

    # The trained model: the step-1 weights read straight from the DCP checkpoint.
    spec, model = _titan_model(source)
    state = model.state_dict()
    load_single_process(state, os.path.join(checkpoints, "step-1"))
    model.load_state_dict(state)
    with torch.no_grad():
        ours = model(_tokens())
    _compare(ours, out, f"{family} step-1 DCP -> export")
    # It trained: not the source weights any more.
    assert (_hf_logits(source) - ours).abs().max() > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_hf_round_trip_last_save_is_a_complete_hf_folder(trained, family):
    from skrull_ext.hf.weights import load_hf_weights

    source, checkpoints = trained(family)
    final = os.path.join(checkpoints, "step-2")
    assert {"config.json", "tokenizer.json", "tokenizer_config.json"} <= set(os.listdir(final))
    with open(os.path.join(final, "config.json")) as f, open(os.path.join(source, "config.json")) as g:
        saved, original = json.load(f), json.load(g)
    assert saved["torch_dtype"] == "float32"  # what the checkpointer wrote (export_dtype)
    assert {k: v for k, v in saved.items() if "dtype" not in k} == {k: v for k, v in original.items() if "dtype" not in k}
    spec, model = _titan_model(final)
    load_hf_weights(model, spec, final)
    with torch.no_grad():
        ours = model(_tokens())
    _compare(ours, final, f"{family} step-2 last_save_in_hf")
    tokenizer = transformers.AutoTokenizer.from_pretrained(final)
    assert tokenizer.decode(tokenizer("hello world")["input_ids"], skip_special_tokens=True).strip() == "hello world"
