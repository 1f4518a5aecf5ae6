"""Bad config values fail in ``load_config``, before any process group or model,
as one line naming the key and the value; and the launcher's usage."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from skrull_ext.errors import JobFileError
from skrull_ext.train.job.job_checks import check_job
from skrull_ext.train.job.job_file import load_config, load_job

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
DEBUG = os.path.join(ROOT, "skrull_ext", "jobs", "debug_cpu.toml")
TEXT = os.path.join(ROOT, "skrull_ext", "jobs", "debug_cpu_text.toml")

BAD = [
    # (job, flags, world size, what the one-line message must hold)
    (DEBUG, ["--parallelism.context_parallel_degree", "3"], 2,
     "parallelism.context_parallel_degree = 3: 3 (cp x tp x pp x dp_replicate) does not divide the world size 2"),
    (DEBUG, ["--parallelism.context_parallel_degree", "2"], 1, "parallelism.context_parallel_degree = 2:"),
    (DEBUG, ["--parallelism.context_parallel_degree", "0"], 1, "parallelism.context_parallel_degree = 0: must be >= 1"),
    (DEBUG, ["--parallelism.data_parallel_shard_degree", "4"], 2,
     "parallelism.data_parallel_shard_degree = 4: 4 x 1 (cp x tp x pp x dp_replicate) != the world size 2"),
    (DEBUG, ["--parallelism.data_parallel_shard_degree", "0"], 1, "parallelism.data_parallel_shard_degree = 0:"),
    (DEBUG, ["--training.steps", "-1"], 1, "training.steps = -1: must be >= 1"),
    (DEBUG, ["--training.steps", "0"], 1, "training.steps = 0: must be >= 1"),
    (DEBUG, ["--training.seq_len", "0"], 1, "training.seq_len = 0: must be >= 1"),
    (DEBUG, ["--training.local_batch_size", "0"], 1, "training.local_batch_size = 0: must be >= 1"),
    (DEBUG, ["--training.max_norm", "0"], 1, "training.max_norm = 0.0: must be a finite number > 0"),
    (DEBUG, ["--lr_scheduler.warmup_steps", "-2"], 1, "lr_scheduler.warmup_steps = -2: must be >= 0"),
    (DEBUG, ["--lr_scheduler.decay_ratio", "1.5"], 1, "lr_scheduler.decay_ratio = 1.5: must be in [0, 1]"),
    (DEBUG, ["--metrics.log_freq", "0"], 1, "metrics.log_freq = 0: must be >= 1"),
    (DEBUG, ["--checkpoint.enable", "--checkpoint.interval", "0"], 1, "[checkpoint]: Checkpoint interval needs to be at least 1 step. (given: --checkpoint.enable, --checkpoint.interval 0)"),
    (DEBUG, ["--skrull.policy", "fifo"], 1,
     "skrull.policy: 'fifo' is not one of ['skrull', 'skrull-fast', 'skrull-paper', 'skrull-per-rank', 'skrull-pool', 'worstfit']"),
    (DEBUG, ["--training.stepz", "3"], 1, "unknown flag --training.stepz: [training] has no key 'stepz'; did you mean 'steps'?"),
    (DEBUG, ["--training.steps", "ten"], 1, "training.steps: expected an integer, got 'ten'"),
    (DEBUG, ["--training.seq_len", "1.5"], 1, "training.seq_len: expected an integer, got '1.5'"),
    (DEBUG, ["--skrull.cpsat_margin", "x"], 1, "skrull.cpsat_margin: expected a number, got 'x'"),
    (DEBUG, ["--dataloader.packing", "dense"], 1, "dataloader.packing: 'dense' is not one of ['rows', 'stream', 'documents']"),
    (DEBUG, ["--dataloader.packing", "stream"], 1, "dataloader.packing = 'stream' is for torchtitan's batching"),
    (DEBUG, ["--dataloader.min_len", "0"], 1, "dataloader.min_len = 0: must be >= 1"),
    (DEBUG, ["--dataloader.max_len", "1"], 1, "dataloader.max_len = 1: must be >= dataloader.min_len (2)"),
    (DEBUG, ["--dataloader.length_scale", "0"], 1, "dataloader.length_scale = 0.0: must be a finite number > 0"),
    (DEBUG, ["--dataloader.vocab_size", "1"], 1, "dataloader.vocab_size = 1: must be >= 2"),
    (DEBUG, ["--dataloader.seed", "-1"], 1, "dataloader.seed = -1: must be >= 0"),  # was numpy's line, no key
    (TEXT, ["--dataloader.dataset_path", "/nonexistent/x.jsonl"], 1, "dataloader.dataset_path = '/nonexistent/x.jsonl'"),
    (TEXT, ["--dataloader.dataset", "hf", "--dataloader.dataset_path", "/nonexistent/data"], 1,
     "dataloader.dataset_path = '/nonexistent/data': is not a local file or folder"),
    (TEXT, ["--dataloader.chat_template", "/nonexistent/t.jinja"], 1,
     "dataloader.chat_template = '/nonexistent/t.jinja': is neither 'chatml' nor an existing .jinja file"),
    (TEXT, ["--dataloader.columns", "speaker", "who"], 1, "dataloader.columns: unknown name(s) ['speaker']"),
    (TEXT, ["--dataloader.format", "csv"], 1, "dataloader.format: 'csv' is not one of ['auto', 'messages', "),
    (DEBUG, ["--skrull.attention_kernel", "varlen"], 1,
     "skrull.attention_kernel = 'varlen': flash attention needs a CUDA device"),
    (DEBUG, ["--skrull.bucket_size", "-1"], 1, "skrull.bucket_size must be in [1, "),
    (DEBUG, ["--skrull.cpsat_margin", "-0.5"], 1, "skrull.cpsat_margin must be in [0.0, 100.0], got -0.5"),
    (DEBUG, ["--skrull.max_extra_micro_batches", "-1"], 1, "skrull.max_extra_micro_batches must be in [0, 1024], got -1"),
    (DEBUG, ["--skrull.cost_model", "nosuch.toml"], 1, "skrull.cost_model: 'nosuch.toml' is neither a hardware preset"),
    (DEBUG, ["--skrull.lookahead", "0"], 1, 'skrull.lookahead must be an integer in [1, 1024] or "auto" (chosen from the data), got 0'),
    (DEBUG, ["--skrull.lookahead", "2000"], 1, 'skrull.lookahead must be an integer in [1, 1024] or "auto" (chosen from the data), got 2000'),
    (DEBUG, ["--skrull.no-enable", "--skrull.lookahead", "4"], 1,
     "skrull.lookahead = 4: needs skrull.enable = true (torchtitan's batching trains each global batch"),
    (DEBUG, ["--dataloader.global_batch_size", "0"], 1, "dataloader.global_batch_size must be >= 1, got 0"),
    (DEBUG, ["--dataloader.max_len", "1024", "--skrull.bucket_size", "1024"], 1,  # was a traceback per rank
     "training.seq_len = 512: shorter than the longest sample a Skrull step trains whole (1024: dataloader.max_len "
     "1024), whose positions would pass the model's RoPE cache; set training.seq_len to at least 1024, or "
     "dataloader.max_len to at most 512"),
    (DEBUG, ["--dataloader.max_len", "4096", "--skrull.bucket_size", "300", "--parallelism.context_parallel_degree",
             "2"], 2, "training.seq_len = 512: shorter than the longest sample a Skrull step trains whole (600: "
                      "bucket_size 300 x cp 2, what a CP group holds whole)"),
    (DEBUG, ["--checkpoint.initial_load_path", "/models/x"], 1,
     "checkpoint.enable = False: the model's weights load from checkpoint.initial_load_path '/models/x'"),
]


@pytest.mark.parametrize("job, flags, world, message", BAD, ids=[" ".join(b[1]) for b in BAD])
def test_bad_value_fails_at_config_time_naming_the_key(job, flags, world, message, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", str(world))
    with pytest.raises(JobFileError) as info:
        load_config(["--config-file", job, *flags])
    text = str(info.value)
    assert message in text and "\n" not in text


@pytest.mark.parametrize("flags, message", [
    (["--skrull.bucket_size", "1.5"],  # no "write bucket_size = 1.5 without quotes": a flag, and no integer
     "skrull.bucket_size: expected an integer or 'profile', got '1.5'"),
    (["--skrull.lookahead", "2.0"],
     "skrull.lookahead: expected an integer or 'auto', got '2.0'"),
    (["--skrull.free_running", "maybe"],  # each member's alternatives once, not each member's own error
     "skrull.free_running: expected true, false or 'auto', got 'maybe'"),
    (["--skrull.lookahead"],  # a bare flag of a key that is no true/false
     "--skrull.lookahead: needs a value (skrull.lookahead is not a true/false key)"),
    (["--skrull.cost_model", "nope.toml"],  # a path: where it was looked for
     f"skrull.cost_model: 'nope.toml' is neither a hardware preset ['h100-assumed'] nor a profile file "
     f"(no file {str(Path('nope.toml').resolve())!r})"),
    (["--skrull.overlength", "chunk", "--dataloader.max_len", "none"],  # the missing limit, not the RoPE cache
     "dataloader.max_len = None: skrull.overlength = 'chunk' trains a sample longer than this limit in chunks, so "
     "it needs one: set dataloader.max_len, and training.seq_len (the RoPE cache) at least as large"),
])
def test_the_message_is_exactly_the_mistake(flags, message):
    with pytest.raises(JobFileError) as info:
        load_config(["--config-file", DEBUG, *flags])
    assert str(info.value) == message


@pytest.mark.parametrize("line, quoted", [('bucket_size = "1.5"', False), ('bucket_size = "512"', True)])
def test_a_quoted_number_is_named_only_where_unquoting_fixes_it(tmp_path, line, quoted):
    job = tmp_path / "job.toml"
    with open(DEBUG) as f:
        job.write_text(f.read().replace("bucket_size = 256", line))
    with pytest.raises(JobFileError) as info:
        load_config(["--config-file", str(job)])
    assert ("a quoted number is a string in TOML: write bucket_size = 512 without quotes" in str(info.value)) == quoted
    assert ("quoted" in str(info.value)) == quoted


def test_a_missing_job_file_is_named():
    with pytest.raises(JobFileError, match="--config-file /nonexistent.toml: No such file or directory"):
        load_config(["--config-file", "/nonexistent.toml"])


def test_the_shipped_jobs_pass():
    for job in (DEBUG, TEXT):
        check_job(load_job(job), world_size=1, on_cpu=True)
        check_job(load_job(job), world_size=4, on_cpu=True)
    check_job(load_job(os.path.join(ROOT, "skrull_ext", "jobs", "qwen2_5_0_5b_gpu.toml")), world_size=8, on_cpu=False)


TP_COMPILED = ["--parallelism.tensor_parallel_degree", "2", "--compile.enable", "--compile.backend", "aot_eager"]


@pytest.mark.parametrize("flags, said", [
    (["--activation_checkpoint.kind", "full", "--skrull.activation_checkpoint", "job"],
     "activation_checkpoint.kind = 'full'"),
    (["--activation_checkpoint.kind", "selective", "--skrull.no-enable"], "activation_checkpoint.kind = 'selective'"),
    (["--activation_checkpoint.kind", "none", "--skrull.activation_checkpoint", "job"], None),
    (["--activation_checkpoint.kind", "full"], None),  # skrull.activation_checkpoint = 'auto': its choice is checked
])
def test_checkpointed_compiled_tp_is_refused_on_torch_2_13(flags, said, monkeypatch):
    """TP 2 + compile + full or selective checkpointing stopped every rank at its first forward
    on torch 2.13 (AOT autograd saved the block's DeviceMesh for backward), with a traceback
    per rank; 2.11, 2.14 and 2.15 train it (torchtitan_patches/compat.py)."""
    from torchtitan_patches import compat

    import torch

    assert compat._checkpointed_local_map_saves_its_mesh() == torch.__version__.startswith("2.13.")
    monkeypatch.setattr(compat, "_checkpointed_local_map_saves_its_mesh", lambda: True)  # on every lane's torch
    monkeypatch.setenv("WORLD_SIZE", "2")
    if said is None:
        load_config(["--config-file", DEBUG, *TP_COMPILED, *flags])
        return
    with pytest.raises(JobFileError) as info:
        load_config(["--config-file", DEBUG, *TP_COMPILED, *flags])
    assert str(info.value).startswith(f"{said} with compile.enable and parallelism.tensor_parallel_degree = 2 stops "
                                      f"in torch {torch.__version__}'s compiler")
    assert str(info.value).endswith("Set --activation_checkpoint.kind none (with --skrull.activation_checkpoint job), "
                                    "or --compile.no-enable")
    monkeypatch.setattr(compat, "_checkpointed_local_map_saves_its_mesh", lambda: False)
    load_config(["--config-file", DEBUG, *TP_COMPILED, *flags])


def test_varlen_is_accepted_on_cuda():
    config = load_job(DEBUG)
    config.skrull.attention_kernel = "varlen"
    check_job(config, world_size=1, on_cpu=False)
    with pytest.raises(JobFileError, match="skrull.attention_kernel = 'varlen'"):
        check_job(config, world_size=1, on_cpu=True)


def _cli(*args, env=None, python=()):
    """``python [PYTHON] -m skrull_ext.train ARGS``, a process of its own."""
    env = {**os.environ, "PYTHONPATH": os.path.abspath(ROOT), **(env or {})}
    return subprocess.run([sys.executable, *python, "-m", "skrull_ext.train", *args], capture_output=True, text=True,
                          env=env, timeout=300)


@pytest.mark.slow
def test_launcher_usage_and_one_line_errors(monkeypatch, capsys):
    """The real command line, a fresh interpreter: without a job (exit 2, one ``error:`` line
    on stderr) and with --help (no torch imported). A bad value's exit 2 and one line on
    stderr, another rank's silence and ``--traceback`` are ``run_cli``'s reading of the error,
    of RANK and of the flag, asserted here in-process on the same ``load_config`` (each a
    process of its own took ~10 s of CPU importing torch): a UserError that ``run_cli`` lets
    through is Python's exit status 1 with its traceback. The entry point's ``run_cli`` around
    a user error in fresh interpreters: the workers of
    tests/integration_tests/test_runtime_failures.py's data-error launch."""
    bare = _cli()
    assert bare.returncode == 2 and "usage: python -m skrull_ext.train --config-file JOB.toml" in bare.stderr
    assert "--module is required" not in bare.stderr and "Traceback" not in bare.stderr
    assert [line for line in bare.stderr.splitlines() if line.startswith("error:")] == [
        "error: no job given: name one with --config-file JOB.toml (e.g. skrull_ext/jobs/debug_cpu.toml)"]
    assert bare.stderr.rstrip().splitlines()[-1].startswith("error:")  # the last line says what is wrong
    helped = _cli("--help", python=("-X", "importtime"))
    assert helped.returncode == 0 and helped.stdout.startswith("usage: python -m skrull_ext.train")
    imported = {line.split("|")[-1].strip() for line in helped.stderr.splitlines() if line.startswith("import time:")}
    assert "encodings" in imported and "torch" not in imported, helped.stderr[-2000:]  # train/job/usage.py
    cited = helped.stdout.replace("\n", " ").split('(README.md, "')[1].split('"')[0]
    with open(os.path.join(ROOT, "README.md")) as f:
        assert f"\n## {cited}\n" in f.read(), f"the usage cites README section {cited!r}, which is not there"
    jobs = sorted(n for n in os.listdir(os.path.dirname(DEBUG)) if n.endswith(".toml"))
    assert len(jobs) >= 7 and all(name in helped.stdout.split() for name in jobs)  # every shipped job, none stale

    from skrull_ext.cli_errors import run_cli

    def entry(argv):  # skrull_ext/train/__main__.py's main up to its config: all a config error runs of it
        load_config(argv, module="skrull_ext.train")

    capsys.readouterr()
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit) as bad:
        run_cli(entry, ["--config-file", DEBUG, "--training.steps", "-1"])
    said = capsys.readouterr()
    errors = [line for line in said.err.splitlines() if line.startswith("error:")]
    assert bad.value.code == 2 and errors == ["error: training.steps = -1: must be >= 1"], said.err[-3000:]
    assert "Traceback" not in said.err and "error:" not in said.out
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(SystemExit) as other_rank:
        run_cli(entry, ["--config-file", DEBUG, "--training.steps", "-1"])
    assert other_rank.value.code == 2 and "error:" not in capsys.readouterr().err
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(JobFileError, match="training.steps = -1"):  # raised: Python's traceback and exit status 1
        run_cli(entry, ["--config-file", DEBUG, "--training.steps", "-1", "--traceback"])


def test_a_quoted_lookahead_in_toml_is_named_as_a_quoting_problem(tmp_path):
    job = tmp_path / "job.toml"
    with open(DEBUG) as f:
        job.write_text(f.read().replace("[skrull]\n", '[skrull]\nlookahead = "8"\n'))
    with pytest.raises(JobFileError) as info:
        load_config(["--config-file", str(job)])
    assert str(info.value) == ("skrull.lookahead: expected an integer, got '8' (a quoted number is a string in "
                               "TOML: write lookahead = 8 without quotes)")
