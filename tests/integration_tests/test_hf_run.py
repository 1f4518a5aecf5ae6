"""A real run of the debug job on a HF folder (``[model] hf_path``): the
trainer loads the folder's safetensors through torchtitan's checkpointer and
the Qwen2 state-dict adapter, trains one step at lr 0 under Skrull's DACP
attention, and saves HF safetensors that are the source file, bit for bit."""

import os

import pytest
import torch

from skrull_ext.hf.weights import read_safetensors
from tests.integration_tests.hf_folders import hf_job
from tests.integration_tests.launch import losses, torchrun


def _tiny_qwen2(folder: str) -> None:
    import transformers

    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        vocab_size=2048, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
    ))
    with torch.no_grad():  # confident wrong logits: loss far above a random init's ln(2048)
        model.lm_head.weight.normal_(0, 3.0)
    model.save_pretrained(folder)


@pytest.mark.slow
def test_hf_folder_trains_and_saves_back_unchanged(tmp_path):
    hf_folder = str(tmp_path / "tiny-qwen2")
    _tiny_qwen2(hf_folder)
    dump = str(tmp_path / "out")
    job = hf_job(tmp_path / "job.toml", hf_folder, checkpoint="last_save_in_hf = true", edits={"lr = 3e-3": "lr = 0.0"})
    torchrun(1, "skrull_ext.train", [
        "--config-file", job, "--dump_folder", dump,
        "--training.steps", "1", "--metrics.enable_tensorboard",
    ], cwd=str(tmp_path))

    assert losses(dump)[0] > 3 * torch.log(torch.tensor(2048.0)).item()  # the HF weights, not init
    source, saved = read_safetensors(hf_folder), read_safetensors(os.path.join(dump, "checkpoint", "step-1"))
    assert set(saved) == set(source)
    for key, tensor in source.items():
        assert torch.equal(saved[key], tensor), key
