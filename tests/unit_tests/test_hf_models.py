"""HF checkpoints in and out, checked against transformers (CPU, no download).

Tiny random transformers models of each supported architecture are saved
with ``save_pretrained`` into a session tmp dir; the torchtitan model is
built from that folder through ``spec_from_hf`` (the ``hf_path`` code path),
loaded through its state-dict adapter, and its float32 logits are compared
with transformers' on the same tokens.
"""

import json
import os
import shutil

import pytest
import torch
import transformers
from torch.nn.attention.flex_attention import and_masks, create_block_mask
from torchtitan.config.override import derive
from torchtitan.models.common import (
    FlexAttention,
    ScaledDotProductAttention,
    get_causal_mask_mod,
    get_efficient_causal_mask_mod_for_packed_document,
)

from skrull_ext.models.hf_config import HFConfigError, hf_architecture, hf_dims, spec_from_hf
from skrull_ext.hf.weights import load_hf_weights, read_safetensors, save_hf_weights
from skrull_ext.models.registry import QWEN2_5_FLAVORS, build_model_spec
from tests.hf_tiny import folder_factory, perturb
from torchtitan_patches.dense_attention import DenseMaskAttention

TOL = 1e-5
VOCAB, BATCH, SEQ = 256, 2, 24
_GQA = dict(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
)
CASES = {
    # Llama 3.1 RoPE scaling with original_max_position_embeddings = 16 puts
    # head_dim 16's frequencies in all three bands (kept, smoothed, scaled).
    "llama3": (transformers.LlamaConfig, transformers.LlamaForCausalLM, dict(
        _GQA, rms_norm_eps=1e-5, tie_word_embeddings=False, rope_theta=500000.0,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                          high_freq_factor=4.0, original_max_position_embeddings=16),
    )),
    "qwen2_5_tied": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, dict(
        _GQA, rms_norm_eps=1e-6, tie_word_embeddings=True, rope_theta=1e6,
    )),
    "qwen2_5_untied": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, dict(
        _GQA, rms_norm_eps=1e-6, tie_word_embeddings=False, rope_theta=1e6,
    )),
    # head_dim 32 != hidden / heads, as in the released Qwen3 models.
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, dict(
        _GQA, head_dim=32, rms_norm_eps=1e-6, tie_word_embeddings=True, rope_theta=1e6,
    )),
}


@pytest.fixture(scope="session")
def hf_folder(tmp_path_factory):
    """``hf_folder(case)``: a saved tiny random model of that case (cached)."""
    return folder_factory(tmp_path_factory, CASES)


def _tokens():
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(2))


# The dense_mask runs pack two documents per row: positions restart at the
# second, and attention must not cross into the first (SFT packing).
DOCS = {"sdpa": [SEQ], "dense_mask": [10, SEQ - 10]}


def _hf_logits(folder: str, case: str, attention: str = "sdpa") -> torch.Tensor:
    """transformers' logits, each packed document run on its own."""
    model_cls = CASES[case][1]
    ref = model_cls.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32)
    with torch.no_grad():
        docs = _tokens().split(DOCS[attention], dim=1)
        return torch.cat([ref.eval()(doc).logits for doc in docs], dim=1)


def _titan(folder: str, attention: str):
    """The torchtitan model of ``folder`` with its HF weights loaded.

    ``attention``: "sdpa" (torchtitan's causal SDPA, no mask) or "dense_mask"
    (the FlexAttention subclass skrull-ext trains with on CPU, fed the
    causal + packed-document BlockMask torchtitan trains with).
    """
    spec = spec_from_hf(folder)
    for layer in spec.model.layers:
        inner = layer.attention.inner_attention
        assert isinstance(inner, FlexAttention.Config)
        layer.attention.inner_attention = (
            ScaledDotProductAttention.Config()
            if attention == "sdpa"
            else derive(inner, DenseMaskAttention.Config)
        )
    model = spec.model.build().eval()
    load_hf_weights(model, spec, folder)
    return spec, model


def _titan_logits(model, attention: str) -> torch.Tensor:
    tokens = _tokens()
    with torch.no_grad():
        if attention == "sdpa":
            return model(tokens)
        positions = torch.cat([torch.arange(n) for n in DOCS[attention]]).expand(BATCH, SEQ)
        # torchtitan's get_attention_masks compiles create_block_mask; the
        # same mask_mods eagerly avoid a C++ build on CPU.
        mask_mod = and_masks(
            get_causal_mask_mod(), get_efficient_causal_mask_mod_for_packed_document(positions)
        )
        block_mask = create_block_mask(mask_mod, BATCH, None, SEQ, SEQ, device="cpu")
        return model(tokens, positions, block_mask)


def _check_parity(hf_folder, case: str, attention: str) -> None:
    folder = hf_folder(case)
    _, model = _titan(folder, attention)
    ours, theirs = _titan_logits(model, attention), _hf_logits(folder, case, attention)
    diff = (ours - theirs).abs().max().item()
    print(f"{case} {attention}: max abs logit diff {diff:.3g} (logits up to {theirs.abs().max():.3g})")
    assert theirs.abs().max() > 0.5  # not trivially small logits
    assert diff <= TOL


@pytest.mark.parametrize("attention", ["sdpa", "dense_mask"])
def test_hf_logits_parity_llama3(hf_folder, attention):
    _check_parity(hf_folder, "llama3", attention)


@pytest.mark.parametrize("attention", ["sdpa", "dense_mask"])
@pytest.mark.parametrize("case", ["qwen2_5_tied", "qwen2_5_untied"])
def test_hf_logits_parity_qwen2_5(hf_folder, case, attention):
    _check_parity(hf_folder, case, attention)


@pytest.mark.parametrize("attention", ["sdpa", "dense_mask"])
def test_hf_logits_parity_qwen3(hf_folder, attention):
    _check_parity(hf_folder, "qwen3", attention)


@pytest.mark.parametrize("case", sorted(CASES))
def test_hf_export_round_trip(hf_folder, tmp_path, case):
    """torchtitan weights -> HF keys -> transformers from_pretrained: same
    logits. The torchtitan model is changed after loading, so the export
    carries its own weights, not the source file's."""
    source = hf_folder(case)
    spec, model = _titan(source, "sdpa")
    perturb(model, seed=3)
    out = tmp_path / "export"
    save_hf_weights(model, spec, str(out))
    shutil.copy(os.path.join(source, "config.json"), out / "config.json")

    assert set(read_safetensors(str(out))) == set(read_safetensors(source))
    ours, theirs = _titan_logits(model, "sdpa"), _hf_logits(str(out), case)
    print(f"{case} export: max abs logit diff {(ours - theirs).abs().max().item():.3g}")
    assert (ours - theirs).abs().max().item() <= TOL


def test_hf_spec_sizes(hf_folder):
    spec = spec_from_hf(hf_folder("qwen3"))
    attention = spec.model.layers[0].attention
    assert (spec.name, len(spec.model.layers), spec.model.dim) == ("qwen3", 2, 64)
    assert (attention.n_heads, attention.n_kv_heads, attention.head_dim) == (4, 2, 32)
    assert spec.model.enable_weight_tying and attention.qk_norm is not None
    assert attention.rope.theta == 1e6 and spec.model.norm.eps == 1e-6
    llama = spec_from_hf(hf_folder("llama3")).model
    assert not llama.enable_weight_tying and llama.norm.eps == 1e-5
    rope = llama.layers[0].attention.rope
    assert (rope.scaling, rope.scaling_factor, rope.original_max_position_embeddings) == ("llama", 8.0, 16)


# Qwen/Qwen2.5-0.5B's config.json as released (transformers 4 layout).
QWEN2_5_0_5B_CONFIG = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
    "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24,
    "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
    "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "sliding_window": 32768, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "transformers_version": "4.40.1", "use_cache": True, "use_mrope": False,
    "use_sliding_window": False, "vocab_size": 151936,
}


def _write_config(folder, config: dict) -> str:
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    return str(folder)


def test_qwen2_5_0_5b_flavor_is_the_released_model(tmp_path):
    cfg = QWEN2_5_0_5B_CONFIG
    assert hf_dims(cfg, hf_architecture(cfg)[1]) == QWEN2_5_FLAVORS["0.5B"]
    spec = spec_from_hf(_write_config(tmp_path / "Qwen2.5-0.5B", cfg))
    assert (spec.name, spec.flavor) == ("qwen2_5", "Qwen2.5-0.5B")
    with torch.device("meta"):
        model = build_model_spec("qwen2_5", "0.5B").model.build()
    assert sum(p.numel() for p in model.parameters()) == 494_032_768


def test_unsupported_architecture_is_named(tmp_path):
    folder = _write_config(tmp_path, {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"})
    with pytest.raises(HFConfigError, match=(
        r"config.json: architectures \['GPT2LMHeadModel'\] is not supported; "
        r"supported: \['LlamaForCausalLM', 'Qwen2ForCausalLM', 'Qwen3ForCausalLM'\]"
    )):
        spec_from_hf(folder)


@pytest.mark.parametrize(
    "change, message",
    [
        # max_window_layers 24 = num_hidden_layers: no layer slides (accepted, test_bad_inputs.py); 20 does
        ({"use_sliding_window": True, "max_window_layers": 20},
         r"use_sliding_window = true with max_window_layers = 20 gives layers 20-23 of 24 sliding-window "
         r"attention \(window 32768\), which is not supported"),
        ({"layer_types": ["full_attention"] * 23 + ["chunked_attention"]},
         r"layer_types \['chunked_attention'\] is not supported"),
        ({"hidden_act": "gelu"}, r"hidden_act = 'gelu' is not supported \(only 'silu'\)"),
        ({"rope_scaling": {"type": "yarn", "factor": 4.0}}, r"rope type 'yarn' is not supported"),
        ({"num_hidden_layers": None}, r"missing 'num_hidden_layers'|num_hidden_layers"),
    ],
)
def test_options_that_would_change_the_model_are_refused(tmp_path, change, message):
    config = {k: v for k, v in {**QWEN2_5_0_5B_CONFIG, **change}.items() if v is not None}
    with pytest.raises(HFConfigError, match=message):
        spec_from_hf(_write_config(tmp_path, config))


def test_missing_config_json(tmp_path):
    with pytest.raises(HFConfigError, match=r"config.json: not found"):
        spec_from_hf(str(tmp_path))
