"""A bad HF folder fails before training, naming the file and the tensor.

Each case breaks one thing in a tiny Qwen2 folder written by transformers'
``save_pretrained`` and starts the trainer on it (``[model] hf_path``); the
check runs in SkrullTrainer's constructor, before any process group, model
or checkpoint load (skrull_ext/hf/checks.py).
"""

import json
import os
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from skrull_ext.hf.checks import HFWeightsError
from skrull_ext.train.job.job_file import JobConfigManager, JobFileError
from skrull_ext.train.trainer import SkrullTrainer

DEBUG = os.path.join(os.path.dirname(__file__), "..", "..", "skrull_ext", "jobs", "debug_cpu.toml")


@pytest.fixture(scope="session")
def good_folder(tmp_path_factory) -> str:
    import transformers

    folder = tmp_path_factory.mktemp("tiny-qwen2-good")
    torch.manual_seed(0)
    transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        vocab_size=2048, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=True,
    )).save_pretrained(folder)
    return str(folder)


def _broken(tmp_path, good: str, change) -> str:
    folder = str(tmp_path / "broken")
    shutil.copytree(good, folder)
    path = os.path.join(folder, "model.safetensors")
    tensors = load_file(path)
    change(tensors, folder)
    save_file(tensors, path, metadata={"format": "pt"})
    return folder


def _start(folder: str):
    config = JobConfigManager().parse_args([
        "--config-file", DEBUG, "--model.hf_path", folder, "--checkpoint.enable",
        "--skrull.cost_model", "h100-assumed",  # the shipped job's profile is of another model
        "--dump_folder", folder + ".out",  # its own: another xdist worker may be building a trainer
    ])
    return SkrullTrainer(config)


def _drop(t, _):
    del t["model.layers.1.self_attn.k_proj.bias"]


def _extra(t, _):
    t["model.layers.1.self_attn.q_norm.weight"] = torch.ones(16)


def _reshape(t, _):
    t["model.layers.0.mlp.up_proj.weight"] = torch.zeros(128, 64)


def _half(t, _):
    t["model.layers.0.self_attn.o_proj.weight"] = t["model.layers.0.self_attn.o_proj.weight"].half()


def _config_says_bf16(t, folder):
    path = os.path.join(folder, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    cfg.pop("torch_dtype", None)
    cfg["dtype"] = "bfloat16"
    with open(path, "w") as f:
        json.dump(cfg, f)


@pytest.mark.parametrize("change, message", [
    (_drop, r"broken: tensor 'model.layers.1.self_attn.k_proj.bias' missing from \['model.safetensors'\] "
            r"\(1 missing in all\), but .*broken/config.json needs it"),
    (_extra, r"broken/model.safetensors: tensor 'model.layers.1.self_attn.q_norm.weight' is not a parameter "
             r"of the model .*broken/config.json describes"),
    (_reshape, r"broken/model.safetensors: tensor 'model.layers.0.mlp.up_proj.weight' has shape \[128, 64\], "
               r"but .*broken/config.json makes it \[96, 64\]"),
    (_half, r"broken/model.safetensors: tensor 'model.layers.0.self_attn.o_proj.weight' is torch.float16, "
            r"but .*broken/config.json \(torch_dtype\) is torch.float32"),
    (_config_says_bf16, r"broken/model.safetensors: tensor '.*' is torch.float32, but .*broken/config.json "
                        r"\(torch_dtype\) is torch.bfloat16"),
], ids=["missing_tensor", "extra_tensor", "shape", "dtype", "config_dtype"])
def test_bad_weights_fail_before_training(tmp_path, good_folder, change, message):
    with pytest.raises(HFWeightsError, match=message):
        _start(_broken(tmp_path, good_folder, change))


def test_folder_without_config_json(tmp_path, good_folder):
    folder = _broken(tmp_path, good_folder, lambda t, f: os.remove(os.path.join(f, "config.json")))
    with pytest.raises(JobFileError, match=re.escape(os.path.join(folder, "config.json")) + ": not found"):
        _start(folder)


def test_folder_without_weights(tmp_path, good_folder):
    folder = str(tmp_path / "no-weights")
    os.makedirs(folder)
    shutil.copy(os.path.join(good_folder, "config.json"), folder)
    with pytest.raises(HFWeightsError, match=r"no-weights: no \*.safetensors files"):
        _start(folder)


def test_the_good_folder_passes(good_folder):
    from skrull_ext.hf.checks import check_hf_folder
    from skrull_ext.models.registry import build_model_spec

    check_hf_folder(good_folder, build_model_spec(hf_path=good_folder))
