"""LoRA: the ``[lora]`` section, the converted models, and the adapters out.

Interop: a tiny random transformers model of each family is saved with
``save_pretrained``; the torchtitan model is built from that folder with
``[lora]`` applied, its base loaded from the folder, its adapters trained a
few AdamW steps. The adapter folder it writes is loaded by peft onto the
transformers model, and the merged folder by transformers alone; both must
give the torchtitan model's float32 logits (1e-5).
"""

import json

import pytest
import torch
import transformers
from torchtitan.models.common import ScaledDotProductAttention

from skrull_ext.models.hf_config import spec_from_hf
from skrull_ext.hf.folder import HFExport
from skrull_ext.lora import LoRAConfig, with_lora
from skrull_ext.lora.converter import DropoutLoRALinear, lora_modules
from skrull_ext.lora.peft_io import adapter_tensors, load_hf_base, merged_hf_state_dict, save_adapter, save_merged
from skrull_ext.models.fqn import plain_fqn
from skrull_ext.models.registry import build_model_spec
from skrull_ext.train.job.job_file import JobFileError, load_job
from tests.hf_tiny import folder_factory

TOL = 1e-5
VOCAB = 256
_GQA = dict(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, rope_theta=1e6,
)
CASES = {
    "llama3": (transformers.LlamaConfig, transformers.LlamaForCausalLM,
               dict(_GQA, rms_norm_eps=1e-5, tie_word_embeddings=False)),
    "qwen2_5": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM,
                dict(_GQA, rms_norm_eps=1e-6, tie_word_embeddings=True)),
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM,
              dict(_GQA, head_dim=32, rms_norm_eps=1e-6, tie_word_embeddings=True)),
}


# ------------------------------------------------------------------ config
def _job(tmp_path, lora: str, model: str = 'name = "llama3"\nflavor = "debugmodel"') -> str:
    path = tmp_path / "job.toml"
    path.write_text(f"[model]\n{model}\n\n[lora]\n{lora}\n")
    return str(path)


def test_lora_table_turns_lora_on(tmp_path):
    config = load_job(_job(tmp_path, "rank = 4\nalpha = 8\ntarget_modules = ['o_proj']\nlayers = [1]"))
    assert config.lora.enable and config.lora.rank == 4 and config.lora.alpha == 8.0
    assert config.lora.titan_targets() == ["wo"]
    assert not load_job(_job(tmp_path, "enable = false")).lora.enable


@pytest.mark.parametrize("body, message", [
    ("rank = 0", "lora.rank"),
    ("alpha = -1", "lora.alpha"),
    ("dropout = 1.0", "lora.dropout"),
    ("target_modules = ['q_proj', 'v_proj']", "lora.target_modules"),
    ("target_modules = ['output']", "lora.target_modules"),
    ("target_modules = ['lm_head']\nlayers = [0]", r"lora.layers: \[0\] with 'lm_head' .* peft's layers_to_transform"),
    ("target_modules = []", "lora.target_modules"),
    ("layers = [-1]", "lora.layers"),
    ("ranks = 4", "ranks"),
])
def test_bad_lora_values_name_the_key(tmp_path, body, message):
    with pytest.raises(JobFileError, match=message):
        load_job(_job(tmp_path, body))


@pytest.mark.parametrize("family", ["llama3", "qwen2_5", "qwen3"])
def test_every_family_converts(family):
    lora = LoRAConfig(enable=True, rank=4, layers=[0, 1], dropout=0.1)
    spec = with_lora(build_model_spec(family, "debugmodel"), lora)
    model = spec.model.build()
    adapted = lora_modules(model)
    assert sorted({n.split(".")[1] for n in adapted}) == ["0", "1"]
    assert len(adapted) == 2 * 5 and all(isinstance(m, DropoutLoRALinear) for m in adapted.values())
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_a." in n or ".lora_b." in n for n in trainable)


def test_lm_head_adapts_the_head_and_is_refused_where_the_head_is_the_embedding():
    """``lm_head`` in target_modules: the head becomes a LoRA linear (outside the layers, trainable
    adapters only); a model that ties its head to the embedding is refused, naming the key."""
    lora = LoRAConfig(enable=True, rank=4, target_modules=["o_proj", "lm_head"])
    assert lora.titan_targets() == ["lm_head", "wo"] and lora.hf_targets() == ["o_proj", "lm_head"]
    model = with_lora(build_model_spec("llama3", "debugmodel"), lora).model.build()
    adapted = lora_modules(model)
    assert isinstance(adapted["lm_head"], DropoutLoRALinear) and len(adapted) == 1 + len(model.layers)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert {"lm_head.lora_a.weight", "lm_head.lora_b.weight"} <= trainable and "lm_head.weight" not in trainable
    spec = with_lora(build_model_spec("llama3", "debugmodel"), lora)  # its HF state dicts: the base only
    hf = spec.state_dict_adapter(spec.model, None).to_hf(model.state_dict())
    assert "lm_head.weight" in hf and not [k for k in hf if "lora" in k]
    assert "lm_head" not in lora_modules(with_lora(build_model_spec("llama3", "debugmodel"),
                                                   LoRAConfig(enable=True)).model.build())  # not by default
    for family in ("qwen2_5", "qwen3"):  # their debug models tie the head to the embedding
        with pytest.raises(ValueError, match=r"lora.target_modules: 'lm_head' on a model whose head is its embedding"):
            with_lora(build_model_spec(family, "debugmodel"), lora)


def test_layers_outside_the_model_are_named():
    with pytest.raises(ValueError, match="lora.layers"):
        with_lora(build_model_spec("llama3", "debugmodel"), LoRAConfig(enable=True, layers=[99]))


# ------------------------------------------------------------------ interop
@pytest.fixture(scope="session")
def hf_base(tmp_path_factory):
    """``hf_base(case)``: a saved tiny random transformers model (cached)."""
    return folder_factory(tmp_path_factory, CASES)


def _tokens(n: int = 20, seed: int = 2) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, n), generator=torch.Generator().manual_seed(seed))


def _trained_titan(folder: str, lora: LoRAConfig, steps: int = 3):
    """The torchtitan LoRA model of ``folder`` (SDPA attention), adapters trained ``steps`` AdamW steps."""
    spec = with_lora(spec_from_hf(folder), lora)
    for layer in spec.model.layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    torch.manual_seed(3)
    model = spec.model.build()
    model.init_states()
    load_hf_base(model, spec, folder)
    base = {k: v.clone() for k, v in model.state_dict().items() if ".lora_" not in k}
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for step in range(steps):
        tokens = _tokens(seed=10 + step)
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in base.items()), "a base weight changed"
    assert any(m.lora_b.weight.abs().max() > 0 for m in lora_modules(model).values())
    return spec, model.eval()


# peft 0.x calls a transformers API that transformers 5 deprecates (not our code).
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
@pytest.mark.parametrize("case, lora", [
    ("llama3", LoRAConfig(enable=True, rank=4, alpha=8.0)),
    ("qwen2_5", LoRAConfig(enable=True, rank=8, alpha=16.0, dropout=0.1)),
    ("qwen3", LoRAConfig(enable=True, rank=4, alpha=4.0, target_modules=["q_proj", "k_proj", "v_proj", "down_proj"],
                         layers=[0, 2])),
    ("llama3", LoRAConfig(enable=True, rank=4, alpha=8.0, dropout=0.1, target_modules=["down_proj", "lm_head"])),
])
def test_lora_adapter_loads_in_peft_and_merged_model_matches(hf_base, tmp_path, case, lora):
    import peft

    folder = hf_base(case)
    spec, model = _trained_titan(folder, lora)
    tokens = _tokens(seed=99)
    with torch.no_grad():
        ours = model(tokens)

    save_adapter(model, spec, lora, str(tmp_path / "adapter"), base_model_name_or_path=folder)
    cfg = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert cfg["r"] == lora.rank and cfg["target_modules"] == lora.hf_targets()
    model_cls = CASES[case][1]
    base = model_cls.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32)
    with torch.no_grad():
        plain = base.eval()(tokens).logits
    peft_model = peft.PeftModel.from_pretrained(base, str(tmp_path / "adapter")).eval()
    with torch.no_grad():
        theirs = peft_model(tokens).logits
    diff = (ours - theirs).abs().max().item()
    print(f"{case}: peft vs torchtitan max |logit diff| {diff:.3g}; adapter moved logits by "
          f"{(theirs - plain).abs().max().item():.3g}")
    assert (theirs - plain).abs().max() > 100 * TOL, "the adapter does not change the logits"
    assert diff <= TOL

    save_merged(model, spec, str(tmp_path / "merged"), HFExport.of_folder(folder))
    merged = model_cls.from_pretrained(str(tmp_path / "merged"), attn_implementation="eager", dtype=torch.float32)
    with torch.no_grad():
        folded = merged.eval()(tokens).logits
    diff = (ours - folded).abs().max().item()
    print(f"{case}: merged vs torchtitan max |logit diff| {diff:.3g}")
    assert diff <= TOL


class _FSDP1Like(torch.nn.Module):
    """Holds its module where FSDP1's FullyShardedDataParallel does (no process group needed)."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self._fsdp_wrapped_module = module


def test_wrapper_segments_leave_module_names():
    assert plain_fqn("layers.0._orig_mod._checkpoint_wrapped_module.attention.wo") == "layers.0.attention.wo"
    assert plain_fqn("layers.3._fsdp_wrapped_module.feed_forward.w1.bias") == "layers.3.feed_forward.w1.bias"
    assert plain_fqn("layers.1") == plain_fqn("layers.1._checkpoint_wrapped_module") == "layers.1"


def test_adapter_and_merged_model_of_wrapped_blocks_are_the_unwrapped_ones(hf_base):
    """Activation checkpointing, torch.compile and FSDP1 each wrap a block and add a
    segment to its module names (torchtitan's parallelize step does this after the
    model is built); the adapter and the merged model written must not change."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    spec, model = _trained_titan(hf_base("llama3"), LoRAConfig(enable=True, rank=4, alpha=8.0), steps=1)
    adapter, merged = adapter_tensors(model, spec), merged_hf_state_dict(model, spec)
    layers = model.layers
    wrapped = {"0": checkpoint_wrapper(layers["0"]), "1": torch.compile(layers["1"]),  # compiled lazily: never run here
               "2": checkpoint_wrapper(_FSDP1Like(layers["2"]))}
    for name, block in wrapped.items():
        layers.register_module(name, block)
    names = set(lora_modules(model))
    assert {n.split(".")[2] for n in names} == {"_checkpoint_wrapped_module", "_orig_mod"}
    assert any("._fsdp_wrapped_module." in n for n in names)
    for got, want in ((adapter_tensors(model, spec), adapter), (merged_hf_state_dict(model, spec), merged)):
        assert got.keys() == want.keys()
        assert all(torch.equal(got[k], want[k]) for k in want)
