"""Every shipped job file is one the loader accepts (without building the model).

The fine-tuning jobs name a placeholder HF folder (``/models/...``); as a user
does on the command line, ``--model.hf_path`` substitutes a tiny HF folder of
the same family (config.json and tokenizer files only: loading a job reads no
weights).
"""

import glob
import os
import shutil

import pytest
import tomllib
import transformers

from skrull_ext import assets
from skrull_ext.data.sources.tokenizer import LocalTokenizer
from skrull_ext.scheduler.model_shape import job_shape
from skrull_ext.train.job.job_file import JobConfigManager

JOBS = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "..", "skrull_ext", "jobs", "*.toml")))
_DIMS = dict(vocab_size=2048, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32768)
FAMILIES = {  # job file name prefix -> (HF config class, skrull family)
    "llama3": (transformers.LlamaConfig, "llama3"),
    "qwen2_5": (transformers.Qwen2Config, "qwen2_5"),
    "qwen3": (transformers.Qwen3Config, "qwen3"),
}


@pytest.fixture(scope="session")
def tiny_folders(tmp_path_factory) -> dict[str, str]:
    folders = {}
    for prefix, (config_cls, _) in FAMILIES.items():
        folder = tmp_path_factory.mktemp(f"tiny-{prefix}")
        config_cls(**_DIMS).save_pretrained(folder)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(assets.tokenizer_path("tiny_bpe"), name), folder)
        folders[prefix] = str(folder)
    return folders


def _hf_path(job: str) -> str | None:
    with open(job, "rb") as f:
        return tomllib.load(f).get("model", {}).get("hf_path")


def test_every_family_has_a_fine_tuning_job():
    names = [os.path.basename(j) for j in JOBS if _hf_path(j)]
    assert {p for p in FAMILIES if any(n.startswith(p) for n in names)} == set(FAMILIES), names


@pytest.mark.parametrize("job", JOBS, ids=os.path.basename)
def test_shipped_job_loads(job, tiny_folders):
    args = ["--config-file", job]
    fine_tune = _hf_path(job) is not None
    if fine_tune:
        prefix = next(p for p in FAMILIES if os.path.basename(job).startswith(p))
        args += ["--model.hf_path", tiny_folders[prefix]]
    config = JobConfigManager().parse_args(args)
    p = config.parallelism
    world = max(p.data_parallel_shard_degree, 1) * p.context_parallel_degree
    shape = job_shape(config)
    assert shape.layers == len(config.model_spec.model.layers)
    config.skrull.check_shape(shape)
    if fine_tune:
        assert config.model_spec.name == FAMILIES[prefix][1]
        assert config.checkpoint.enable and config.checkpoint.initial_load_in_hf
        assert config.checkpoint.initial_load_path == tiny_folders[prefix]
        assert config.checkpoint.last_save_in_hf
        assert isinstance(config.tokenizer, LocalTokenizer.Config)  # the folder's tokenizer
        # The paper's large-model setting: DP 4 x CP 8 on 32 GPUs, bf16 compute.
        assert (p.data_parallel_shard_degree, p.context_parallel_degree) == (4, 8)
        assert shape.bytes_per_elem == 2


@pytest.mark.parametrize("job", [j for j in JOBS if _hf_path(j)], ids=os.path.basename)
def test_gpu_job_resolves_its_cuda_only_defaults(job, tiny_folders):
    """The reading review of what only a GPU would exercise, pinned on the
    config a GPU job resolves to (no CPU fix applied): CUDA graphs off under
    Skrull, no compile, no symmetric-memory FSDP or async TP, flash attention
    (varlen) for bf16 on CUDA, the all-gather K/V exchange on NCCL (p2p only
    on gloo, where it was measured), CP-SAT off, bf16
    parameters as the cost model prices them (docs/gpu.md, "Defaults a GPU job
    resolves to")."""
    import types

    import torch

    from skrull_ext.attention.kernels import auto_kernel
    from skrull_ext.attention.transport import AUTO_BY_BACKEND
    from skrull_ext.train.trainer import resolve_device_defaults

    prefix = next(p for p in FAMILIES if os.path.basename(job).startswith(p))
    config = JobConfigManager().parse_args(["--config-file", job, "--model.hf_path", tiny_folders[prefix]])
    resolve_device_defaults(config)
    s = config.skrull
    assert s.enable and config.training.disable_cuda_graphs
    assert not config.compile.enable and not config.compile.enable_async_tensor_parallel
    assert not config.parallelism.enable_fsdp_symm_mem and not config.training.enable_cpu_offload
    assert not config.debug.batch_invariant and not s.cpsat
    assert s.attention_kernel == "auto" and auto_kernel(types.SimpleNamespace(is_cuda=True, dtype=torch.bfloat16)) == "varlen"
    assert s.kv_exchange == "auto" and AUTO_BY_BACKEND.get("nccl", "all_gather") == "all_gather"
    assert config.training.mixed_precision_param == "bfloat16"
    assert job_shape(config).bytes_per_elem == 2


def test_the_small_gpu_job_compiles_with_the_measured_h200_profile():
    """qwen2_5_0_5b_gpu.toml as a GPU resolves it (docs/gpu.md, "Defaults a GPU job resolves to"):
    compiled, priced by the H200 profile measured with it (compiled, its attention weight fitted,
    the model wrapped in FSDP as the trainer wraps it at one rank: GPU run 9), at that profile's
    BucketSize, CUDA graphs off under Skrull."""
    from skrull_ext.scheduler.profile_file import Profile
    from skrull_ext.train.trainer import resolve_device_defaults

    job = next(j for j in JOBS if os.path.basename(j) == "qwen2_5_0_5b_gpu.toml")
    config = JobConfigManager().parse_args(["--config-file", job])
    resolve_device_defaults(config)
    assert config.compile.enable and "model" in config.compile.components and config.training.disable_cuda_graphs
    s = config.skrull
    assert s.bucket_size == "profile" and os.path.basename(s.cost_model) == "h200-qwen2.5-0.5b.toml"
    profile = Profile.load(s.cost_model)
    assert profile.meta["compile"] is True and profile.meta["device"].startswith("NVIDIA H200")
    assert 0.4 < profile.cost_model().attention_weight < 0.7 and profile.memory().bucket_size == 177719
    assert profile.meta["wrapping"].startswith("FSDP x1 ") and "compute bfloat16" in profile.meta["wrapping"]
    # GPU run 9's: the step outside its micro-batches and both checkpointing modes it measured, for
    # skrull.activation_checkpoint = "auto" (it chose none there: BucketSize 133,119).
    assert profile.data["step"]["fixed_us"] > 0 and profile.data["activation_checkpoint"]["measured"] == "selective"
    assert {m: profile.data["activation_checkpoint"][m]["bucket_size"] for m in ("none", "selective")} == {
        "none": 133119, "selective": 177719}
