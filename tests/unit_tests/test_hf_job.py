"""``[model] hf_path`` in job files: the spec comes from the folder's
config.json and the job starts from its weights."""

import json
import os
import textwrap

import pytest
import transformers

from skrull_ext.train.job.job_file import JobFileError, load_job


@pytest.fixture(scope="module")
def qwen2_folder(tmp_path_factory) -> str:
    """A HF Qwen2 folder: only config.json is read when a job is loaded."""
    folder = tmp_path_factory.mktemp("tiny-qwen2")
    transformers.Qwen2Config(
        vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        tie_word_embeddings=False, architectures=["Qwen2ForCausalLM"],
    ).save_pretrained(folder)
    return str(folder)


def _job(tmp_path, body: str) -> str:
    path = tmp_path / "job.toml"
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_hf_path_job_builds_the_folder_model(tmp_path, qwen2_folder):
    config = load_job(_job(tmp_path, f"""
        [model]
        hf_path = "{qwen2_folder}"

        [training]
        seq_len = 256
    """))
    spec, model = config.model_spec, config.model_spec.model
    attention = model.layers[0].attention
    assert (spec.name, spec.flavor) == ("qwen2_5", "tiny-qwen20")
    assert (len(model.layers), model.dim, model.vocab_size) == (3, 64, 512)
    assert (attention.n_heads, attention.n_kv_heads, attention.head_dim) == (4, 2, 16)
    assert not model.enable_weight_tying
    assert attention.qkv_linear.wqkv.bias and attention.qk_norm is None
    assert config.tokenizer.vocab_size == 512 == config.loss.loss_fn.global_vocab_size
    # Fine-tuning starts from the folder's weights, through torchtitan's checkpointer.
    assert config.checkpoint.enable and config.checkpoint.initial_load_in_hf
    assert config.checkpoint.initial_load_path == config.hf_assets_path == qwen2_folder


def test_hf_path_job_keeps_its_own_checkpoint_settings(tmp_path, qwen2_folder):
    config = load_job(_job(tmp_path, f"""
        [model]
        name = "qwen2_5"
        flavor = "tiny"
        hf_path = "{qwen2_folder}"

        [checkpoint]
        interval = 7
        enable = false
    """))
    assert config.model_spec.flavor == "tiny"
    assert config.checkpoint.interval == 7 and not config.checkpoint.enable
    # ... but a launch refuses it: without the checkpointer the folder's weights never load.
    from skrull_ext.train.job.job_file import load_config

    with pytest.raises(JobFileError, match=r"checkpoint.enable = False: the model's weights load from "
                                           r"checkpoint.initial_load_path .* random weights; add "
                                           r"--checkpoint.enable \(or \[checkpoint\] enable = true\)$"):
        load_config(["--config-file", str(tmp_path / "job.toml")])


@pytest.mark.parametrize(
    "model, message",
    [
        ('name = "llama3"\nhf_path = "{folder}"',
         r"model.name: 'llama3', but model.hf_path '.*' holds a qwen2_5 model"),
        ("hf_path = 3", r"model.hf_path: expected a folder path string, got 3"),
        ('hf_path = "{tmp}/nowhere"', r"nowhere/config.json: not found"),
        ('hf_path = "{gpt2}"', r"architectures \['GPT2LMHeadModel'\] is not supported; supported: "),
    ],
)
def test_hf_path_errors_name_the_key(tmp_path, qwen2_folder, model, message):
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    body = "[model]\n" + model.format(folder=qwen2_folder, tmp=tmp_path, gpt2=gpt2)
    with pytest.raises(JobFileError, match=message):
        load_job(_job(tmp_path, body))


def test_hf_path_relative_to_the_working_directory(tmp_path, qwen2_folder, monkeypatch):
    monkeypatch.chdir(os.path.dirname(qwen2_folder))
    config = load_job(_job(tmp_path, f"""
        [model]
        hf_path = "{os.path.basename(qwen2_folder)}"
    """))
    assert config.checkpoint.initial_load_path == qwen2_folder


@pytest.fixture(scope="module")
def folder_with_tokenizer(tmp_path_factory, qwen2_folder) -> str:
    """The Qwen2 folder plus a HF tokenizer (the shipped tiny BPE's files)."""
    import shutil

    from skrull_ext import assets

    folder = tmp_path_factory.mktemp("tiny-qwen2-tok")
    shutil.copy(os.path.join(qwen2_folder, "config.json"), folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(assets.tokenizer_path("tiny_bpe"), name), folder)
    return str(folder)


def test_hf_path_tokenizer_is_the_folders(tmp_path, folder_with_tokenizer):
    from skrull_ext.data.sources.tokenizer import LocalTokenizer

    config = load_job(_job(tmp_path, f"""
        [model]
        hf_path = "{folder_with_tokenizer}"
    """))
    assert isinstance(config.tokenizer, LocalTokenizer.Config) and config.tokenizer.path == ""
    tokenizer = config.tokenizer.build(tokenizer_path=config.hf_assets_path)
    assert tokenizer.get_vocab_size() == 1024  # tiny_bpe's, read from the folder
    assert tokenizer.decode(tokenizer.encode("hello world")).strip() == "hello world"


def test_hf_path_job_tokenizer_section_wins(tmp_path, folder_with_tokenizer, qwen2_folder):
    from skrull_ext.data.sources.tokenizer import SyntheticTokenizer

    config = load_job(_job(tmp_path, f"""
        [model]
        hf_path = "{folder_with_tokenizer}"

        [tokenizer]
        kind = "synthetic"
        vocab_size = 512
    """))
    assert isinstance(config.tokenizer, SyntheticTokenizer.Config)
    # A weights-only folder (no tokenizer.json) keeps the synthetic tokenizer.
    bare = load_job(_job(tmp_path, f'[model]\nhf_path = "{qwen2_folder}"\n'))
    assert isinstance(bare.tokenizer, SyntheticTokenizer.Config)


def test_cli_model_hf_path_replaces_the_job_files_model(tmp_path, qwen2_folder):
    from skrull_ext.train.job.job_file import JobConfigManager

    debug = os.path.join(os.path.dirname(__file__), "..", "..", "skrull_ext", "jobs", "debug_cpu.toml")
    config = JobConfigManager().parse_args(["--config-file", debug, "--model.hf_path", qwen2_folder])
    assert (config.model_spec.name, len(config.model_spec.model.layers)) == ("qwen2_5", 3)
    assert config.checkpoint.initial_load_path == qwen2_folder
