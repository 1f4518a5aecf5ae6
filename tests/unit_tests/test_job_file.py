"""Job files: TOML -> dataclass config, CLI overrides, precise errors."""

import os
import re
import textwrap
from pathlib import Path

import pytest

from skrull_ext.data.steps.packed import PackedDataLoader
from skrull_ext.data.steps.loader import SkrullDataLoader
from skrull_ext.train.job.job_checks import check_job
from skrull_ext.train.job.job_file import JobConfigManager, JobFileError, load_job
from skrull_ext.train.trainer import JobConfig, resolve_device_defaults

JOBS = os.path.join(os.path.dirname(__file__), "..", "..", "skrull_ext", "jobs")
DEBUG = os.path.join(JOBS, "debug_cpu.toml")


def _write(tmp_path, body: str) -> str:
    path = tmp_path / "job.toml"
    path.write_text(textwrap.dedent(body))
    return str(path)


MINIMAL = """
[model]
name = "llama3"
flavor = "debugmodel"
"""


def test_debug_job_loads():
    config = load_job(DEBUG)
    assert isinstance(config, JobConfig)
    assert config.model_spec.name == "llama3" and config.model_spec.flavor == "debugmodel"
    assert config.training.seq_len == 512 and config.training.dtype == "float32"
    assert config.dataloader.length_scale == 32.0 and config.dataloader.max_len == 512
    assert isinstance(config.dataloader, SkrullDataLoader.Config) and config.skrull.enable
    assert config.activation_checkpoint is None
    assert config.optimizer.param_groups[0].optimizer_kwargs["lr"] == 3e-3
    assert config.skrull.bucket_size == 256 and config.skrull.check_plan_hash
    assert config.tokenizer.vocab_size == 2048 == config.loss.loss_fn.global_vocab_size


def test_gpu_job_loads():
    config = load_job(os.path.join(JOBS, "qwen2_5_0_5b_gpu.toml"))
    assert config.model_spec.name == "qwen2_5"
    assert config.tokenizer.vocab_size == 151936


@pytest.mark.parametrize(
    "body, message",
    [
        ("[training]\nstepz = 3",
         r"unknown key\(s\) \['stepz'\] in \[training\] \(did you mean 'steps'\?\); allowed: .*'steps'"),
        ("[trainig]\nsteps = 3",
         r"unknown key\(s\) \['trainig'\] in the job file \(did you mean 'training'\?\); allowed: .*'training'"),
        ("[skrul]\nenable = true", r"unknown key\(s\) \['skrul'\] in the job file \(did you mean 'skrull'\?\)"),
        ("[training]\nstepz = 3\nseqlen = 9", r"\['seqlen', 'stepz'\] in \[training\] \(did you mean 'seq_len' for "
         r"'seqlen', 'steps' for 'stepz'\?\)"),
        ("[training]\nsteps = 'ten'", r"training.steps: expected an integer, got 'ten'"),
        ("[training]\ndtype = 'float16'", r"training.dtype: 'float16' is not one of \['bfloat16', 'float32'\]"),
        ("[skrull]\npolicy = 'fifo'", r"skrull.policy: 'fifo' is not one of \['skrull', 'skrull-fast', 'skrull-paper', 'skrull-per-rank', 'skrull-pool', 'worstfit'\]"),
        ("[skrull]\noverlength = 'wrap'", r"skrull.overlength: 'wrap' is not one of \['error', 'truncate', 'drop', 'chunk'\]"),
        ("[skrull]\nkv_exchange = 'ring'", r"skrull.kv_exchange: 'ring' is not one of \['auto', 'all_gather', 'p2p'\]"),
        ("[skrull]\nattention_kernel = 'flex'",
         r"skrull.attention_kernel: 'flex' is not one of \['auto', 'dense', 'tiles', 'segments', 'varlen'\]"),
        ("[skrull]\nenable = true\n[dataloader]\nkind = 'packed'", r"skrull.enable needs \[dataloader\] kind = \"skrull\""),
        ("[skrull]\nbucket_size = -1", r"skrull.bucket_size must be in \[1, "),
        ("[skrull]\nbucket_size = 0",
         r'^skrull.bucket_size must be in \[1, 68719476736\] or "profile" \(the measured profile\'s BucketSize\), got 0$'),
        ("[skrull]\nbucket_size = 'profile'", r"^skrull.bucket_size = 'profile' takes BucketSize from a profile file, "
         r"but skrull.cost_model is the hardware preset 'h100-assumed'"),
        ("[skrull]\nbucket_size = 'measured'", r"^skrull.bucket_size: expected an integer or 'profile', got 'measured'$"),
        ("[skrull]\nfree_running = 'maybe'", r"^skrull.free_running: expected true, false or 'auto', got 'maybe'$"),
        ("[skrull]\ncost_model = 'h200'", r"skrull.cost_model: 'h200' is neither a hardware preset \['h100-assumed'\] nor a profile file"),
        ("[skrull]\ncost_model = 'llama3-debug'",
         r"skrull.cost_model: 'llama3-debug' is a model preset; the shape now comes from the job's \[model\]"),
        ("[dataloader]\nkind = 'hf'", r"dataloader.kind: 'hf' is not one of \['packed'"),
        ("[dataloader]\nglobal_batch_size = 0", r"dataloader.global_batch_size must be >= 1"),
        ("[dataloader]\nkind = 'skrull'\nprefetch_steps = 65", r"dataloader.prefetch_steps: 65 is outside 0\.\.64"),
        ("[job]\ndump_folder = 3", r"job.dump_folder: expected a string, got 3"),
        ("[job]\nskrull = 3", r"unknown key\(s\) \['skrull'\] in \[job\]"),
    ],
)
def test_bad_values_name_the_key(tmp_path, body, message):
    with pytest.raises(JobFileError, match=message):
        load_job(_write(tmp_path, MINIMAL + body))


def test_job_section_flags_set_root_keys():
    """A job file's [job] table holds root keys: the flag may be spelt as the file spells it."""
    for flag in (["--job.dump_folder", "out/a"], ["--job.dump-folder=out/a"], ["--dump_folder", "out/a"]):
        assert JobConfigManager().parse_args(["--config-file", DEBUG, *flag]).dump_folder == "out/a"
    with pytest.raises(JobFileError, match=r"unknown flag --job.dumpfolder: .*did you mean 'dump_folder'\?"):
        JobConfigManager().parse_args(["--config-file", DEBUG, "--job.dumpfolder", "out/a"])


@pytest.mark.parametrize(
    "body, message",
    [
        ('[model]\nname = "gpt2"\nflavor = "x"', r"model.name: 'gpt2' is not one of \['llama3', 'qwen2_5', 'qwen3'\]"),
        ('[model]\nname = "llama3"\nflavor = "9B"', r"model.flavor: '9B' is not a llama3 flavor; one of \['debugmodel'"),
        ('[model]\nname = "llama3"', r"model.flavor: required"),
        ('[model]\nname = "llama3"\nflavor = "debugmodel"\nsize = 1', r"unknown key\(s\) \['size'\] in \[model\]"),
        ("[training\n", r"not valid TOML"),
        ('dump_folder = "x"\n[model]\nname = "llama3"\nflavor = "debugmodel"',
         r"unknown key\(s\) \['dump_folder'\] in the job file"),  # root fields go in [job]
    ],
)
def test_bad_model_or_syntax(tmp_path, body, message):
    with pytest.raises(JobFileError, match=message):
        load_job(_write(tmp_path, body))


def test_cli_overrides_file():
    config = JobConfigManager().parse_args(
        ["--config-file", DEBUG, "--training.steps", "3", "--skrull.policy", "worstfit",
         "--parallelism.context_parallel_degree", "2"]
    )
    assert config.training.steps == 3 and config.skrull.policy == "worstfit"
    assert config.parallelism.context_parallel_degree == 2
    assert config.training.seq_len == 512  # from the file


def test_cli_bad_value_fails_as_in_the_job_file():
    with pytest.raises(JobFileError, match=r"^skrull.policy: 'fifo' is not one of \['skrull', "):
        JobConfigManager().parse_args(["--config-file", DEBUG, "--skrull.policy", "fifo"])


def test_torchtitan_module_config_form():
    from torchtitan.config import ConfigManager

    config = ConfigManager().parse_args(
        ["--module", "skrull_ext.train", "--config", "skrull_llama3_debugmodel", "--skrull.bucket_size", "128"]
    )
    assert isinstance(config, JobConfig) and config.skrull.bucket_size == 128


def test_skrull_off_uses_torchtitan_batching_of_the_same_data():
    config = JobConfigManager().parse_args(["--config-file", DEBUG, "--skrull.no-enable"])
    assert isinstance(config.dataloader, PackedDataLoader.Config)
    assert config.dataloader.length_scale == 32.0 and config.dataloader.seed == 0


PROFILE = os.path.join(os.path.dirname(__file__), "..", "..", "profiles", "cpu-debug-gloo2.toml")


def test_bucket_size_profile_takes_the_profiles_measured_value():
    """The section keeps what the user wrote; the built SchedulerConfig holds the integer."""
    config = JobConfigManager().parse_args(
        ["--config-file", DEBUG, "--skrull.cost_model", PROFILE, "--skrull.bucket_size", "profile"])
    assert config.skrull.bucket_size == "profile"
    assert config.skrull.resolved_bucket_size() == 3696  # profiles/cpu-debug-gloo2.toml [memory] bucket_size
    assert config.skrull.scheduler_config(dp=1, cp=2, lookahead=1).bucket_size == 3696
    written = JobConfigManager().parse_args(["--config-file", DEBUG, "--skrull.bucket_size", "300"])
    assert written.skrull.bucket_size == written.skrull.resolved_bucket_size() == 300


def test_bucket_size_zero_is_refused_in_one_line_naming_profile():
    with pytest.raises(JobFileError) as e:
        JobConfigManager().parse_args(["--config-file", DEBUG, "--skrull.bucket_size", "0"])
    assert str(e.value) == ('skrull.bucket_size must be in [1, 68719476736] or "profile" (the measured profile\'s '
                            'BucketSize), got 0')


def test_bucket_size_profile_needs_a_profile_with_memory(tmp_path):
    from skrull_ext.scheduler.config import SchedulerConfig
    from skrull_ext.train.job.skrull_config import SkrullConfig

    with pytest.raises(ValueError, match="the hardware preset 'h100-assumed'"):
        SkrullConfig(cost_model="h100-assumed", bucket_size="profile")
    import tomli_w
    import tomllib

    no_memory = tmp_path / "p.toml"
    with open(PROFILE, "rb") as f:
        data = tomllib.load(f)
    del data["memory"]["bucket_size"]  # [memory]'s only ([activation_checkpoint]'s tables keep theirs)
    no_memory.write_text(tomli_w.dumps(data))
    section = SkrullConfig(cost_model=str(no_memory), bucket_size="profile")  # plain values: no file read yet
    with pytest.raises(ValueError, match="has no \\[memory\\] bucket_size"):
        section.resolved_bucket_size()
    with pytest.raises(ValueError, match=r"^bucket_size must be in \[1, 68719476736\], got 'profile'$"):
        SchedulerConfig(bucket_size="profile")  # the core's config holds the resolved integer


def _failed_profile(tmp_path) -> str:
    """The shipped CPU profile as the profiler writes one whose BucketSize check failed
    (issue 38: 4997 tokens peaked at 1414 MiB against a 930 MiB budget, used silently)."""
    import tomli_w
    import tomllib

    with open(PROFILE, "rb") as f:
        data = tomllib.load(f)
    data["meta"]["check"].update(tokens=4997, measured_peak=1482874749.0, activation_budget=975122432.0,
                                 predicted_activation=926118788.0, fit_holds=False, fits=False, ok=False)
    failed = tmp_path / "p1.toml"
    failed.write_text(tomli_w.dumps(data))
    return str(failed)


def _refusal(failed: str) -> str:
    return (f"skrull.cost_model: the profile {failed!r} failed its own memory check ([meta.check] ok = "
            "false: a buffer of its BucketSize, 4997 tokens, peaked at 1414.2 MiB against an activation budget of "
            "929.9 MiB (the memory fit predicted 883.2 MiB)), so a job uses none of it; re-measure it with a lower "
            "--memory-limit (or a larger --margin) than it was measured with: python -m skrull_ext.profile "
            "--config-file skrull_ext/jobs/debug_cpu.toml --memory-limit 1GiB --out profiles/cpu-debug-gloo2.toml")


@pytest.mark.parametrize("bucket", [["--skrull.bucket_size", "profile"], []], ids=["profile", "own"])
def test_a_profile_that_failed_its_check_is_refused_in_every_use(tmp_path, bucket):
    """Issue 50: with the job's own bucket_size the failed profile still chose free-running
    from its memory figures and priced the plan; now no use of it passes."""
    failed = _failed_profile(tmp_path)
    config = JobConfigManager().parse_args(["--config-file", DEBUG, "--skrull.cost_model", failed, *bucket])
    with pytest.raises(JobFileError) as e:
        check_job(config, 1, on_cpu=True)  # the profile is read once, here, before any model is built
    assert str(e.value) == _refusal(failed)
    from skrull_ext._core import ModelShape
    from skrull_ext.train.job.skrull_config import SkrullConfig

    skrull = SkrullConfig(cost_model=failed, bucket_size=256)  # each use on its own
    shape = ModelShape(layers=6, hidden=256, kv_width=256, bytes_per_elem=4)
    for use in (skrull.measured_profile, lambda: skrull.build_cost_model(shape), lambda: skrull.check_shape(shape)):
        with pytest.raises(ValueError) as e:
            use()
        assert str(e.value) == _refusal(failed)


def test_a_job_at_another_cp_than_its_profile_is_warned():
    from skrull_ext.train.job.skrull_config import SkrullConfig

    cp1 = SkrullConfig(cost_model=PROFILE, bucket_size="profile")  # profiled at cp 1 ([memory] cp = 1)
    assert cp1.profile_cp_warning(1) is None
    assert "derived its BucketSize for cp 1; this job runs cp 2 (bucket_size 3696)" in cp1.profile_cp_warning(2)
    cp2 = SkrullConfig(cost_model=PROFILE.replace("gloo2.toml", "gloo2-cp2.toml"), bucket_size="profile")
    assert cp2.resolved_bucket_size() == 2645 and cp2.profile_cp_warning(2) is None
    assert "for cp 2; this job runs cp 1" in cp2.profile_cp_warning(1)
    assert SkrullConfig(cost_model="h100-assumed").profile_cp_warning(4) is None  # presets: no profile
    # A BucketSize the job names is not the profile's: the README's CP 2 command gets no warning.
    assert SkrullConfig(cost_model=PROFILE, bucket_size=256).profile_cp_warning(2) is None


def test_skrull_section_and_scheduler_share_one_set_of_knobs():
    """[skrull] and SchedulerConfig inherit the same declarations: same fields, same
    defaults but one (a job's lookahead is "auto", priced on its data; a library user's is 1);
    build(dp, cp) gives the job's Scheduler on its cost model."""
    from dataclasses import fields

    from skrull_ext._core import ModelShape
    from skrull_ext.scheduler.config import SchedulerConfig, SchedulingOptions
    from skrull_ext.train.job.skrull_config import SkrullConfig

    knobs = {f.name for f in fields(SchedulingOptions)}
    section = SkrullConfig(cost_model="h100-assumed")
    assert knobs <= {f.name for f in fields(SkrullConfig)} and knobs <= {f.name for f in fields(SchedulerConfig)}
    assert section.options() == {**SchedulerConfig().options(), "lookahead": "auto"}
    shape = ModelShape(layers=6, hidden=256, kv_width=256, bytes_per_elem=4)
    sched = SkrullConfig(cost_model="h100-assumed", policy="worstfit", bucket_size=512).build(2, 4, shape, lookahead=1)
    assert (sched.job.dp, sched.job.cp, sched.job.policy.name, sched.job.bucket_size) == (2, 4, "worstfit", 512)
    assert sched.cost_model.shape.hidden == 256  # the shape given, priced on the assumed H100


@pytest.mark.parametrize("enable", [True, False])
def test_cuda_graphs_are_off_under_skrull(tmp_path, enable):
    """torchtitan wraps fwd+bwd in a CUDA graph unless training.disable_cuda_graphs;
    a Skrull step calls it per micro-batch with new shapes and a DacpBatchMeta, so the
    resolved config turns graphs off whenever Skrull is on, whatever the device (the CPU
    fix that also turns them off is not applied here: this is the config a GPU gets)."""
    job = tmp_path / "job.toml"
    text = Path(DEBUG).read_text()
    assert "[skrull]\nenable = true" in text
    text = text.replace('"../../profiles/', f'"{os.path.abspath(os.path.join(JOBS, "..", "..", "profiles"))}/')
    job.write_text(text.replace("[skrull]\nenable = true", f"[skrull]\nenable = {str(enable).lower()}"))
    config = JobConfigManager().parse_args(["--config-file", str(job)])
    assert config.skrull.enable is enable and config.training.disable_cuda_graphs is False  # torchtitan's default
    resolve_device_defaults(config)  # what SkrullTrainer.__init__ does before building anything
    assert config.training.disable_cuda_graphs is enable


def test_cli_profile_reaches_the_scheduler():
    """A profile named on the command line is the one the scheduler plans with
    (tyro sets fields on built configs; the section's profile cache must follow)."""
    config = JobConfigManager().parse_args(["--config-file", DEBUG, "--skrull.cost_model", PROFILE,
                                            "--skrull.bucket_size", "profile"])
    assert config.skrull.resolved_bucket_size() == 3696
    from skrull_ext.scheduler.profile_file import Profile

    profile = Profile.load(PROFILE).cost_model()
    assert config.skrull.build(dp=1, cp=2, shape=profile.shape, lookahead=1).cost_model.a_us_per_flop == profile.a_us_per_flop


def test_pool_policy_trains():
    """skrull-pool is a training policy now (the trainer runs pool plans: rank-set DACP
    attention, pool buffers; parity in tests/integration_tests/test_parity_pool.py):
    its config builds a scheduler whose plans are Plans."""
    from skrull_ext._core import ModelShape
    from skrull_ext.scheduler.plan import Plan
    from skrull_ext.train.job.skrull_config import SkrullConfig

    config = SkrullConfig(cost_model="h100-assumed", policy="skrull-pool", bucket_size=64)
    shape = ModelShape(layers=6, hidden=256, kv_width=256, bytes_per_elem=4)
    plan = config.build(2, 2, shape, lookahead=1).schedule([200, 30, 20, 10])  # 200 > 64 x CP 2: over the whole world
    assert isinstance(plan, Plan) and plan.truncated == [] and plan.num_ranks[0] == 4


def test_shipped_jobs_are_seeded_and_keep_a_resumable_last_checkpoint():
    """Same command, same run; a finished run can be continued (docs/training.md)."""
    for name in sorted(os.listdir(JOBS)):
        if not name.endswith(".toml"):
            continue
        text = Path(JOBS, name).read_text()
        assert "[debug]\nseed = 0" in text, f"{name} does not seed its run"
        assert "cpsat = true" not in text, f"{name}: the CP-SAT fallback is off by default (docs/benchmarks.md)"
    config = load_job(DEBUG)
    assert config.debug.seed == 0 and not config.skrull.cpsat
    assert config.checkpoint.last_save_model_only is False  # the full state: a resume needs it


@pytest.mark.parametrize("where", ["file", "flag"])
def test_a_hf_last_save_keeps_the_model_only(tmp_path, where):
    """torchtitan allows a HF last save only model-only; asking for one, in
    the file or on the command line, gets that without a second key."""
    body = MINIMAL + ("[checkpoint]\nlast_save_in_hf = true\n" if where == "file" else "")
    flags = ["--checkpoint.last_save_in_hf"] if where == "flag" else []
    config = JobConfigManager().parse_args(["--config-file", _write(tmp_path, body), *flags])
    assert config.checkpoint.last_save_in_hf and config.checkpoint.last_save_model_only


GPU = os.path.join(JOBS, "qwen2_5_0_5b_gpu.toml")


def _flags(*args, job=DEBUG):
    return JobConfigManager().parse_args(["--config-file", job, *args])


def test_bool_flags_take_every_form():
    """``--x.flag false`` failed in tyro ("Could not create CLI parser")."""
    assert _flags("--metrics.enable_tensorboard", "false").metrics.enable_tensorboard is False
    assert _flags("--metrics.enable-tensorboard=true").metrics.enable_tensorboard is True
    assert _flags("--metrics.enable_tensorboard").metrics.enable_tensorboard is True
    assert _flags("--metrics.no-enable-tensorboard").metrics.enable_tensorboard is False
    assert not _flags("--skrull.enable", "false").skrull.enable
    with pytest.raises(JobFileError, match=r"^metrics.enable_tensorboard: expected true or false, got 'maybe'$"):
        _flags("--metrics.enable_tensorboard", "maybe")


def test_the_job_file_and_flags_are_kept_for_commands_on_the_same_job(monkeypatch):
    """The drift warning and the step-term note suggest a profiler command on this job: with the
    job file's path and the job's flags as given (shell-quoted), not '<this job's file>'
    (torchtitan's config keeps no path of its file)."""
    from skrull_ext.train.job import usage
    from skrull_ext.train.job.job_file import load_config

    monkeypatch.setattr(usage, "_job_argv", None)
    assert usage.job_args() == "--config-file <this job's file>"
    usage.remember_job(["--module", "m", "--config", "c"])  # torchtitan's form names no job file
    assert usage.job_args() == "--config-file <this job's file>"
    load_config(["--config-file", DEBUG, "--parallelism.context_parallel_degree", "2", "--skrull.plan_log"],
                check=False)
    assert usage.job_args() == f"--config-file {DEBUG} --parallelism.context_parallel_degree 2 --skrull.plan_log"
    usage.remember_job(["--config-file=my jobs/a.toml"])
    assert usage.job_args() == "'--config-file=my jobs/a.toml'"


@pytest.mark.parametrize("word", ["1", "0", "yes", "no", "on", "off", "true", "False"])
def test_a_true_false_or_auto_flag_reads_a_word_as_a_plain_bool_flag_does(word):
    """``--skrull.free_running 1`` is true because ``--skrull.defer_grad_sync 1`` is (every bool
    flag takes 1/0, yes/no, on/off); a job file refuses ``= 1`` for both, as TOML has booleans."""
    plain = _flags("--skrull.defer_grad_sync", word).skrull.defer_grad_sync
    assert isinstance(plain, bool) and _flags("--skrull.free_running", word).skrull.free_running is plain
    assert _flags("--skrull.free_running", "auto").skrull.free_running == "auto"


@pytest.mark.parametrize("key, message", [
    ("defer_grad_sync", r"^skrull.defer_grad_sync: expected true or false, got 1$"),
    ("free_running", r"^skrull.free_running: expected true, false or 'auto', got 1$"),
])
def test_a_job_file_refuses_1_for_a_true_false_key_with_or_without_auto(tmp_path, key, message):
    with pytest.raises(JobFileError, match=message):
        load_job(_write(tmp_path, MINIMAL + f"[skrull]\n{key} = 1\n"))


def test_activation_checkpoint_flags_switch_and_set_the_kind():
    """Every ``--activation_checkpoint.*`` flag failed in tyro, whatever the job's kind."""
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

    assert load_job(DEBUG).activation_checkpoint is None
    full = _flags("--activation_checkpoint.kind", "full", "--activation_checkpoint.preserve_rng_state")
    assert isinstance(full.activation_checkpoint, FullAC.Config) and full.activation_checkpoint.preserve_rng_state
    assert _flags("--activation_checkpoint.kind", "none", job=GPU).activation_checkpoint is None
    kept = _flags("--activation_checkpoint.preserve_rng_state", "true", job=GPU).activation_checkpoint
    assert isinstance(kept, SelectiveAC.Config) and kept.preserve_rng_state  # the job's kind, one key changed
    shapes = _flags("--activation_checkpoint.force_recompute_mm_shapes_by_fqns", "a.w,b.w", job=GPU)
    assert shapes.activation_checkpoint.force_recompute_mm_shapes_by_fqns == ["a.w", "b.w"]
    with pytest.raises(JobFileError, match=r"^\[activation_checkpoint\] is off in the base config; set its kind"):
        _flags("--activation_checkpoint.preserve_rng_state", "true")
    with pytest.raises(JobFileError, match=r"^activation_checkpoint.kind: 'half' is not one of \['full', 'none', "):
        _flags("--activation_checkpoint.kind", "half", job=GPU)


@pytest.mark.parametrize("args, message", [
    (["--training.steps"], r"^--training.steps: needs a value \(training.steps is not a true/false key\)$"),
    (["--training.steps", "3", "4"], r"^--training.steps: expected one value, got 2 \(3 4\)$"),
    (["stray"], r"^command line: 'stray' is neither a --section.key flag nor a flag's value$"),
    (["--training.steps=3", "4"], r"^command line: '4' is neither"),
    (["--dump-foldr", "x"], r"^unknown flag --dump-foldr: the top level has no key 'dump_foldr'; did you mean 'dump_folder'\?$"),
    (["--skrull.no-enable", "true"], r"^--skrull.no-enable takes no value \(it sets skrull.enable false\)$"),
    (["--training", "3"], r"^training: expected a \[training\] table, got "),
    (["activation-checkpoint:full"], r"^command line: 'activation-checkpoint:full': write --activation_checkpoint.kind full$"),
])
def test_malformed_flags_are_one_line(args, message):
    with pytest.raises(JobFileError, match=message):
        _flags(*args)


def test_flags_imply_what_job_file_keys_imply(tmp_path):
    """Root fields, ``--lora.*`` (a [lora] table means LoRA) and a HF last save
    (model only) read as the same keys in a job file do."""
    config = _flags("--dump-folder", str(tmp_path), "--checkpoint.last_save_in_hf", "--lora.rank", "4")
    assert config.dump_folder == str(tmp_path)
    assert config.checkpoint.last_save_in_hf and config.checkpoint.last_save_model_only
    assert config.lora.enable and config.lora.rank == 4
    assert not _flags("--lora.no-enable", "--lora.rank", "4").lora.enable


def test_module_config_form_reads_flags_the_same_way():
    config = JobConfigManager().parse_args(
        ["--module", "skrull_ext.train", "--config", "skrull_llama3_debugmodel", "--skrull.bucket_size", "128",
         "--metrics.enable_tensorboard", "false"])
    assert config.skrull.bucket_size == 128 and config.metrics.enable_tensorboard is False


def test_a_job_compiled_otherwise_than_its_profile_is_warned(tmp_path):
    from skrull_ext.train.job.skrull_config import SkrullConfig

    text = re.sub(r"^compile = \w+\n", "", Path(PROFILE).read_text(), flags=re.M)  # as before [meta] compile
    older = tmp_path / "older.toml"
    older.write_text(text)
    eager = tmp_path / "eager.toml"
    eager.write_text(text.replace("[meta]\n", "[meta]\ncompile = false\n", 1))
    warning = SkrullConfig(cost_model=str(eager)).profile_compile_warning(True)
    assert warning == (f"skrull: the profile {str(eager)!r} timed the model eager; this job runs it compiled "
                       "(compile.enable = true): predicted step times and memory will be off. Re-profile with "
                       "the job's compile setting")
    assert SkrullConfig(cost_model=str(eager)).profile_compile_warning(False) is None
    # A profile written before [meta] compile existed says nothing either way; presets are not profiles.
    assert SkrullConfig(cost_model=str(older)).profile_compile_warning(True) is None
    assert SkrullConfig(cost_model="h100-assumed").profile_compile_warning(True) is None


def test_a_job_whose_kernel_computes_otherwise_than_its_profile_prices_is_warned(tmp_path):
    import torch

    from skrull_ext.attention.local_only import computes_whole_buffer
    from skrull_ext.train.job.skrull_config import SkrullConfig

    cpu, f32 = torch.device("cpu"), torch.float32
    # CPU's dense (auto's choice there) attends over each buffer whole; segments per document; a
    # compiled all-local buffer traces dense on CPU whatever the kernel, as the profiler prices it.
    assert computes_whole_buffer("auto", False, cpu, f32) and computes_whole_buffer("dense", False, cpu, f32)
    assert not computes_whole_buffer("segments", False, cpu, f32)
    assert not computes_whole_buffer("auto", False, torch.device("cuda"), torch.bfloat16)
    shipped = SkrullConfig(cost_model=PROFILE, attention_kernel="segments")
    assert shipped.profile_kernel_warning(True) is None  # the shipped CPU profile prices whole buffers
    assert shipped.profile_kernel_warning(False) == (
        f"skrull: the profile {PROFILE!r} prices attention each buffer whole (one masked SDPA); this job's "
        "attention_kernel 'segments' computes it per document: predicted micro-batches will be off. Re-profile "
        "with the job's kernel")
    per_doc = tmp_path / "per_doc.toml"
    per_doc.write_text(re.sub(r"^whole_buffer = true\n", "", Path(PROFILE).read_text(), flags=re.M))
    assert "computes it each buffer whole" in SkrullConfig(cost_model=str(per_doc)).profile_kernel_warning(True)
    assert SkrullConfig(cost_model="h100-assumed").profile_kernel_warning(True) is None


@pytest.mark.parametrize("job", ["debug_cpu.toml", "debug_cpu_lora.toml", "qwen2_5_0_5b_gpu.toml"])
def test_per_job_help_lists_only_what_the_parser_accepts(job, capsys):
    """Issue 50: tyro's listing (911 lines) offered --skrull.policy-spec.* and a skrull._profile
    subcommand, which the parser refuses as unknown. Every flag the help lists is one the
    parser takes (a bool in both forms), and every settable key of [skrull] is listed."""
    from skrull_ext.train.job.job_file import SECTION_KINDS, settable_fields
    from skrull_ext.train.job.job_flags import flag_tables
    from skrull_ext.train.job.skrull_config import SkrullConfig

    path = os.path.join(os.path.dirname(DEBUG), job)
    with pytest.raises(SystemExit) as e:
        JobConfigManager("skrull_ext.train").parse_args(["--config-file", path, "--training.steps", "3", "--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith(f"usage: python -m skrull_ext.train --config-file {path} ")
    assert "policy-spec" not in text and "policy_spec" not in text and "_profile" not in text
    assert "  --training.steps  (3)" in text  # the flags given beside --help are applied
    config = load_job(path)
    flags = re.findall(r"^  (--[\w.]+)(?: / (--[\w.-]+))?", text, flags=re.M)
    assert len(flags) > 100
    for flag, negated in flags:
        if flag.startswith("--model."):
            continue
        for args in ([flag], [negated]) if negated else ([flag, "1"],):
            try:
                flag_tables(config, args, SECTION_KINDS)
            except JobFileError as err:
                assert "unknown flag" not in str(err), (args, err)
    for name in settable_fields(SkrullConfig):
        assert f"  --skrull.{name}" in text, name
