"""config.json written from a model spec (jobs not started from a HF folder)
and the export command's refusals (no GPU, no process group)."""

import os

import pytest

from skrull_ext.export import main
from skrull_ext.models.hf_config import hf_architecture, hf_config_json, hf_dims, spec_dims
from skrull_ext.models.registry import build_model_spec


@pytest.mark.parametrize("name, flavor", [("llama3", "debugmodel"), ("qwen3", "0.6B"), ("qwen2_5", "0.5B")])
def test_config_json_from_a_spec_gives_the_spec_back(name, flavor):
    dims = spec_dims(build_model_spec(name, flavor).model)
    cfg = hf_config_json(name, dims, "bfloat16")
    arch_name, arch = hf_architecture(cfg)
    assert arch.family == name and cfg["torch_dtype"] == "bfloat16"
    assert hf_dims(cfg, arch) == dims


def test_export_refuses_what_is_not_a_checkpoint_of_the_model(tmp_path, capsys):
    import transformers

    src = tmp_path / "src"
    transformers.Qwen2Config(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2).save_pretrained(src)
    out = str(tmp_path / "out")
    assert main([str(tmp_path / "nowhere"), out, "--hf-path", str(src)]) == 2
    assert "nowhere: no such checkpoint folder" in capsys.readouterr().err
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "model.safetensors").write_bytes(b"")
    assert main([str(tmp_path / "hf"), out, "--hf-path", str(src)]) == 2
    assert "hf/.metadata: not found, so not a DCP checkpoint (it holds *.safetensors" in capsys.readouterr().err
    assert main([str(tmp_path), out, "--hf-path", str(tmp_path / "nowhere")]) == 2
    assert "nowhere/config.json: not found" in capsys.readouterr().err


def test_export_refuses_a_checkpoint_of_another_model(tmp_path, capsys):
    """A DCP checkpoint of a 2-layer model asked for as a 3-layer one, and
    with a different width: each fails naming the tensor and the model."""
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp
    import transformers

    def folder(name, **kw):
        path = tmp_path / name
        transformers.Qwen2Config(vocab_size=256, intermediate_size=96, num_attention_heads=4,
                                 num_key_value_heads=2, **kw).save_pretrained(path)
        return str(path)

    small = folder("small", hidden_size=64, num_hidden_layers=2)
    spec = build_model_spec(hf_path=small)
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in spec.model.build().state_dict().items()}
    state = {k: torch.zeros(shape) for k, shape in shapes.items()}
    ckpt = str(tmp_path / "step-1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=ckpt, no_dist=True)
    out = str(tmp_path / "out")
    assert main([ckpt, out, "--hf-path", folder("deeper", hidden_size=64, num_hidden_layers=3)]) == 2
    assert "step-1: tensor 'layers.2.attention.qkv_linear.wq.weight' of qwen2_5/deeper is not in the checkpoint" \
        in capsys.readouterr().err
    assert main([ckpt, out, "--hf-path", folder("wider", hidden_size=128, num_hidden_layers=2)]) == 2
    assert "step-1: tensor 'tok_embeddings.weight' has shape [256, 64], but qwen2_5/wider has [256, 128]" \
        in capsys.readouterr().err
    assert main([ckpt, out, "--hf-path", small]) == 0 and os.path.isfile(os.path.join(out, "config.json"))
    # What it says it wrote is what it wrote: this folder has no tokenizer (it said "tokenizer files").
    said = capsys.readouterr().out.strip()
    assert said == (f"wrote {out}: model.safetensors, config.json; no tokenizer files (the "
                    "job's tokenizer has none: a synthetic one, or a folder without tokenizer.json)")
    assert not any(name.startswith("tokenizer") for name in os.listdir(out))
    import shutil

    from skrull_ext import assets

    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(assets.tokenizer_path("tiny_bpe"), name), small)
    assert main([ckpt, str(tmp_path / "out2"), "--hf-path", small]) == 0
    assert capsys.readouterr().out.strip().endswith(
        "model.safetensors, config.json, tokenizer files (tokenizer.json, tokenizer_config.json)")

    # Issue 50: into a non-empty folder it overwrote without a word. Refused, the folder untouched ...
    before = {name: os.path.getmtime(os.path.join(out, name)) for name in os.listdir(out)}
    (tmp_path / "out" / "model-00001-of-00002.safetensors").write_bytes(b"stale")
    assert main([ckpt, out, "--hf-path", small]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: {out}: is not empty ('config.json' and 2 more); name a new or empty folder, or add --overwrite "
        "to replace its contents")
    assert {n: os.path.getmtime(os.path.join(out, n)) for n in before} == before
    # ... replaced with --overwrite (no stale shard left beside the new weights) ...
    assert main([ckpt, out, "--hf-path", small, "--overwrite"]) == 0
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    # ... and never the folder that holds the checkpoint.
    assert main([ckpt, str(tmp_path), "--hf-path", small, "--overwrite"]) == 2
    assert "holds the checkpoint" in capsys.readouterr().err and os.path.isdir(ckpt)


def test_export_refuses_lora_adapters_it_cannot_scale(tmp_path, capsys):
    """A LoRA run's checkpoint holds the base and the adapters; named by the HF
    folder alone (no [lora]: no alpha), the export fails in one line naming
    --config-file rather than writing the untrained base."""
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp
    import transformers

    src = tmp_path / "src"
    transformers.Qwen2Config(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2).save_pretrained(src)
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in build_model_spec(hf_path=str(src)).model.build().state_dict().items()}
    state = {k: torch.zeros(shape) for k, shape in shapes.items()}
    state["layers.0.attention.wo.lora_a.weight"] = torch.zeros(4, 64)
    state["optimizer.state.layers.0.attention.wo.lora_a.weight.exp_avg"] = torch.zeros(4, 64)
    ckpt, out = str(tmp_path / "step-1"), str(tmp_path / "out")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=ckpt, no_dist=True)
    assert main([ckpt, out, "--hf-path", str(src)]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert errors == [f"error: {ckpt}: holds LoRA adapters ('layers.0.attention.wo.lora_a.weight'), but the "
                      "model named (qwen2_5/src, no [lora]) has none; export it with --config-file JOB, the [lora] job "
                      "that trained it (its lora.alpha scales the adapters), or use that run's lora_merged or "
                      "lora_adapter folder"]
    assert not os.path.exists(out)
