"""The cost model prices the model that trains: its shape comes from the job
([model] + dtype), ``[skrull] cost_model`` names only the hardware, and a
measured profile of another shape stops the trainer before any model is built."""

import os

import pytest

from skrull_ext._core import ModelShape
from skrull_ext.scheduler.model_shape import job_shape
from skrull_ext.train.job.job_file import JobConfigManager
from skrull_ext.train.trainer import SkrullTrainer

REPO = os.path.join(os.path.dirname(__file__), "..", "..")
DEBUG = os.path.join(REPO, "skrull_ext", "jobs", "debug_cpu.toml")
GPU = os.path.join(REPO, "skrull_ext", "jobs", "qwen2_5_0_5b_gpu.toml")
PROFILE = os.path.join(REPO, "profiles", "cpu-debug-gloo2.toml")  # measured on llama3/debugmodel, float32


def _shape(s: ModelShape) -> tuple:
    return (s.layers, s.hidden, s.kv_width, s.bytes_per_elem)


def test_shape_follows_the_job_model_and_dtype():
    debug = JobConfigManager().parse_args(["--config-file", DEBUG])
    assert _shape(job_shape(debug)) == (6, 256, 256, 4)  # llama3 debugmodel (MHA), float32
    gpu = JobConfigManager().parse_args(["--config-file", GPU])
    # Qwen2.5-0.5B: 24 layers, 896 wide, 2 KV heads x 64; FSDP computes in bf16.
    assert _shape(job_shape(gpu)) == (24, 896, 128, 2)
    # One GPU too: torchtitan applies FSDP's mixed precision at shard degree 1 (the 2026-11-27
    # H100 profiler priced float32 there, chose the dense kernel and ran out of memory at 8K).
    one = JobConfigManager().parse_args(["--config-file", GPU, "--parallelism.data_parallel_shard_degree", "1",
                                         "--parallelism.context_parallel_degree", "1"])
    assert _shape(job_shape(one)) == (24, 896, 128, 2)
    scheduler = gpu.skrull.build(2, 4, job_shape(gpu), lookahead=1)
    assert _shape(scheduler.cost_model.shape) == (24, 896, 128, 2)


def test_a_profile_of_the_job_model_is_accepted():
    config = JobConfigManager().parse_args(["--config-file", DEBUG, "--skrull.cost_model", PROFILE])
    config.skrull.check_shape(job_shape(config))


def test_a_profile_of_another_model_fails_at_trainer_start_naming_both_shapes(tmp_path):
    config = JobConfigManager().parse_args([
        "--config-file", DEBUG, "--skrull.cost_model", PROFILE,
        "--model.name", "qwen2_5", "--model.flavor", "debugmodel", "--dump_folder", str(tmp_path),
    ])
    with pytest.raises(ValueError, match=(
        r"skrull.cost_model: .*cpu-debug-gloo2.toml: its \[model\] \{'layers': 6, 'hidden': 256, "
        r"'kv_width': 256, 'bytes_per_elem': 4\} is not the shape of qwen2_5/debugmodel "
        r"\{'layers': 4, 'hidden': 256, 'kv_width': 64, 'bytes_per_elem': 4\}"
    )):
        SkrullTrainer(config)
    # A trainer that failed to build holds no lock on its dump folder: the same process may retry.
    assert not (tmp_path / ".skrull_run.lock").exists()


def test_a_profile_of_another_model_is_refused_at_config_time_naming_the_flag():
    """A shipped CPU job pointed at another model (issue 38: --model.hf_path DIR with
    debug_cpu_text.toml gave a ValueError traceback per rank): one line, before any
    process group, naming both shapes and --skrull.cost_model."""
    from skrull_ext.train.job.job_file import JobFileError, load_config

    with pytest.raises(JobFileError) as e:
        load_config(["--config-file", DEBUG, "--model.name", "qwen2_5", "--model.flavor", "debugmodel"])
    message = str(e.value)
    assert message.startswith("skrull.cost_model: ") and "\n" not in message
    assert message.endswith(
        "is not the shape of qwen2_5/debugmodel {'layers': 4, 'hidden': 256, 'kv_width': 64, 'bytes_per_elem': 4}; "
        "set --skrull.cost_model to a hardware preset ['h100-assumed'] or a profile of this model (python -m "
        "skrull_ext.profile --config-file JOB.toml [--model.hf_path DIR] --out P.toml)")
    load_config(["--config-file", DEBUG, "--model.name", "qwen2_5", "--model.flavor", "debugmodel",
                 "--skrull.cost_model", "h100-assumed"])  # a preset prices any shape


def test_model_option_needs_a_job_file():
    with pytest.raises(ValueError, match=r"--model.hf_path needs --config-file"):
        JobConfigManager().parse_args(["--model.hf_path", "/x"])


def test_the_measured_gpu_profile_prices_the_gpu_job_on_one_gpu():
    # profiles/h100-qwen2.5-0.5b.toml: measured by tools/gpu_checks.sh on an H100 (2026-11-27), one process.
    h100 = os.path.join(REPO, "profiles", "h100-qwen2.5-0.5b.toml")
    config = JobConfigManager().parse_args([
        "--config-file", GPU, "--parallelism.data_parallel_shard_degree", "1",
        "--parallelism.context_parallel_degree", "1", "--skrull.cost_model", h100])
    config.skrull.check_shape(job_shape(config))
    cost = config.skrull.build(1, 1, job_shape(config), lookahead=1).cost_model
    # Host-bound eager layers: about 12.7 ms of each layer's forward+backward is fixed.
    assert 12_000 < cost.b_us < 13_500
