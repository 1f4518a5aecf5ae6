"""Activation checkpointing chosen at start-up (``[skrull] activation_checkpoint``,
train/checkpointing.py) from the profile's per-mode fits (scheduler/checkpointing.py): the
profile section's round trip and checks, the choice on small made-up profiles, the forcing
key, old profiles, the log line and the mode applied to the config before the model."""

from pathlib import Path
from types import SimpleNamespace

import pytest
import tomli_w
import tomllib
from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

from skrull_ext import _core
from skrull_ext.scheduler import checkpointing
from skrull_ext.scheduler.checkpointing import ModeCost
from skrull_ext.scheduler.profile_file import Profile
from skrull_ext.train.checkpointing import ac_config, choose_checkpointing, first_lengths, mode_of, settle_checkpointing
from skrull_ext.train.job.job_file import JobFileError, load_job
from skrull_ext.train.job.skrull_config import SkrullConfig

ROOT = Path(__file__).resolve().parents[2]
CPU_PROFILE = ROOT / "profiles" / "cpu-debug-gloo2.toml"
DEBUG = ROOT / "skrull_ext" / "jobs" / "debug_cpu.toml"
SHAPE = _core.ModelShape(layers=6, hidden=256, kv_width=256, bytes_per_elem=4)  # the profile's [model]

# Made-up modes: each step of checkpointing halves the memory a token and slows the layer.
MODES = {
    "none": ModeCost("none", 1.0e-5, 100.0, 1.0, 100_000.0, 0.0, 0.0, 2000),
    "selective": ModeCost("selective", 1.3e-5, 100.0, 1.0, 50_000.0, 0.0, 0.0, 4000),
    "full": ModeCost("full", 1.6e-5, 100.0, 1.0, 25_000.0, 0.0, 0.0, 8000),
}


def _profile(tmp_path, modes: dict[str, ModeCost] | None = MODES, measured: str = "none",
             micro_batch: dict | None = None) -> str:
    """The shipped CPU profile with ``modes`` as its [activation_checkpoint] (None: none)."""
    data = tomllib.loads(CPU_PROFILE.read_text())
    data.pop(checkpointing.SECTION, None)
    if modes is not None:
        data[checkpointing.SECTION] = checkpointing.section(modes, measured)
        data["memory"]["bucket_size"] = modes[measured].bucket_size
    if micro_batch is not None:
        data["micro_batch"] = micro_batch
    path = tmp_path / f"profile{len(list(tmp_path.iterdir()))}.toml"
    path.write_text(tomli_w.dumps(data))
    return str(path)


def _choose(section: SkrullConfig, steps, job_mode: str | None = "selective", dp: int = 1, cp: int = 1):
    return choose_checkpointing(section, job_mode, dp=dp, cp=cp, dp_shard=dp, dp_replicate=1, shape=SHAPE,
                                model_name="llama3/debugmodel", steps=lambda: steps)


def _auto(path: str, bucket_size="profile") -> SkrullConfig:
    return SkrullConfig(cost_model=path, bucket_size=bucket_size, activation_checkpoint="auto", lookahead=1)


# ---------------------------------------------------------------- the profile's section

def test_section_round_trips_through_a_profile_file(tmp_path):
    with_c = {**MODES, "full": ModeCost("full", 1.6e-5, 90.0, 0.5, 25_000.0, 1e6, 3.5, 8000)}
    p = Profile.load(_profile(tmp_path, with_c, measured="selective"))
    assert p.checkpointing_modes == with_c
    assert p.measured_checkpointing == "selective"
    table = tomllib.loads(Path(p.path).read_text())[checkpointing.SECTION]
    assert table["none"] == {"a_us_per_flop": 1.0e-5, "b_us": 100.0, "a_bytes_per_token": 100_000.0,
                             "b_bytes": 0.0, "bucket_size": 2000}  # defaults left out
    assert table["full"]["attention_weight"] == 0.5 and table["full"]["c_bytes_per_token2"] == 3.5


def test_under_mode_replaces_compute_and_memory_only(tmp_path):
    p = Profile.load(_profile(tmp_path))
    assert p.under_mode("none").cost_model(SHAPE).a_us_per_flop == 1.0e-5  # the mode's table, measured or not
    full = p.under_mode("full")
    assert full.bucket_size == 8000 and full.measured_checkpointing == "full"
    mem = full.memory()
    assert (mem.a, mem.b, mem.c, mem.bucket_size) == (25_000.0, 0.0, 0.0, 8000)
    assert (mem.usable, mem.static, mem.margin) == (p.memory().usable, p.memory().static, p.memory().margin)
    cm, base = full.cost_model(SHAPE), p.cost_model(SHAPE)
    assert (cm.a_us_per_flop, cm.b_us) == (1.6e-5, 100.0)
    assert cm.micro_batch_fixed_us == base.micro_batch_fixed_us and list(cm.comm.us) == list(base.comm.us)
    assert full.under_mode("selective").bucket_size == 4000  # a view reads every mode too


def test_an_old_profile_loads_and_prices_its_one_mode(tmp_path):
    p = Profile.load(_profile(tmp_path, modes=None))
    assert p.checkpointing_modes == {} and p.measured_checkpointing is None
    assert p.under_mode("full") is p


@pytest.mark.parametrize("body, message", [
    ({"measured": "half"}, r"activation_checkpoint.measured: 'half' is not one of \['none', 'selective', 'full'\]"),
    ({"partial": {}}, r"unknown field activation_checkpoint.partial; allowed: measured and the modes"),
    ({"full": {"a_us_per_flop": 1.0, "b_us": 1.0, "a_bytes_per_token": 1.0, "b_bytes": 0.0}},
     r"missing field activation_checkpoint.full.bucket_size$"),
    ({"full": {"a_us_per_flop": 1.0, "b_us": 1.0, "a_bytes_per_token": 1.0, "b_bytes": 0.0, "bucket_size": 0}},
     r"activation_checkpoint.full.bucket_size must be a positive integer, got 0$"),
    ({"full": {"a_us_per_flop": "x", "b_us": 1.0, "a_bytes_per_token": 1.0, "b_bytes": 0.0, "bucket_size": 9}},
     r"activation_checkpoint.full.a_us_per_flop must be a number >= 0, got 'x'$"),
    ({"none": {"a_us_per_flop": 1.0, "b_us": 1.0, "a_bytes_per_token": 1.0, "b_bytes": 0.0, "bucket_size": 9,
               "speed": 2}}, r"unknown field activation_checkpoint.none.speed; allowed"),
])
def test_a_bad_section_is_named_in_one_line(tmp_path, body, message):
    data = tomllib.loads(CPU_PROFILE.read_text())
    data[checkpointing.SECTION] = body
    path = tmp_path / "bad.toml"
    path.write_text(tomli_w.dumps(data))
    with pytest.raises(ValueError, match=message) as info:
        Profile.load(path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)


# ---------------------------------------------------------------- the choice

def test_a_job_that_fits_without_checkpointing_runs_without_it(tmp_path):
    """Every sequence fits at none's BucketSize: the plans are the same in every mode, and
    none has no recompute."""
    steps = [[500, 400, 300, 200], [900, 100]]
    choice = _choose(_auto(_profile(tmp_path)), steps)
    assert choice.mode == "none"
    assert choice.bucket_sizes == {"none": 2000, "selective": 4000, "full": 8000}
    t = choice.predicted_us
    assert t["none"] < t["selective"] < t["full"]
    line = choice.line()
    assert line.startswith("Skrull activation checkpointing: none (skrull.activation_checkpoint = 'auto': the best "
                           "predicted step time on the first 2 global batches")
    for mode in ("none", "selective", "full"):
        assert f"{mode} {t[mode] / 1e3:.2f} ms at bucket_size {choice.bucket_sizes[mode]}" in line
    assert line.endswith("; the job's kind 'selective' is its fallback only (skrull.activation_checkpoint = 'job' "
                         "runs it); lockstep or free-running is chosen next, at this mode's BucketSize and with its "
                         "memory (free-running's unsharded copy on top): the 'Skrull execution' line)")
    assert "(mean; each mode at its own BucketSize, priced lockstep by the profile's per-mode fits)" in line
    assert "\n" not in line
    assert "fallback" not in _choose(_auto(_profile(tmp_path)), steps, job_mode="none").line()


def test_one_that_does_not_fit_picks_selective_or_full_by_time(tmp_path):
    path = _profile(tmp_path)
    # 3000 tokens: over none's 2000 (cp 1: a sequence is held whole by one rank); selective holds it.
    choice = _choose(_auto(path), [[3000, 500], [1000]])
    assert choice.mode == "selective" and choice.predicted_us["none"] is None
    assert "none out: bucket_size 2000 cannot hold the longest sequence" in choice.line()
    # 5000 tokens: only full holds it.
    assert _choose(_auto(path), [[5000]]).mode == "full"
    # Both hold 3000-token sequences; selective needs a micro-batch each, full one for four.
    # A dear micro-batch makes full's larger BucketSize the faster step despite its recompute. Dear
    # enough under a whole-buffer price too ([compute] whole_buffer, the CPU profile's once
    # re-measured): one buffer of 7200 tokens costs 4x the attention of two of 3600, which 1 s a
    # micro-batch did not outweigh there.
    dear = _profile(tmp_path, micro_batch={"fixed_us": 1e7})
    choice = _choose(_auto(dear), [[3000, 600, 3000, 600]])
    assert choice.predicted_us["none"] is None and choice.mode == "full"
    assert choice.predicted_us["full"] < choice.predicted_us["selective"]


def test_no_mode_holds_the_longest_sequence_takes_the_largest_bucket(tmp_path):
    choice = _choose(_auto(_profile(tmp_path)), [[9000]])
    assert choice.mode == "full" and set(choice.predicted_us.values()) == {None}
    assert "no mode's BucketSize holds the longest sequence" in choice.reason


def test_a_named_bucket_size_allows_the_modes_that_hold_it(tmp_path):
    path = _profile(tmp_path)
    choice = _choose(_auto(path, bucket_size=3000), [[1000, 800]])
    assert choice.mode == "selective" and choice.bucket_sizes == {"selective": 3000, "full": 3000}
    assert "none out: bucket_size 3000 over its 2000" in choice.reason
    with pytest.raises(ValueError, match=r"^skrull.activation_checkpoint = 'auto': no mode the profile .* fits "
                                         r"skrull.bucket_size 9000: none out: bucket_size 9000 over its 2000; "
                                         r"selective out: .*; lower skrull.bucket_size or set it to 'profile'$"):
        _choose(_auto(path, bucket_size=9000), [[100]])


def test_the_job_key_forces_its_mode(tmp_path):
    path = _profile(tmp_path)
    read = []
    forced = choose_checkpointing(SkrullConfig(cost_model=path, bucket_size="profile", lookahead=1), "full", dp=1,
                                  cp=1, dp_shard=1, dp_replicate=1, shape=SHAPE, model_name="m",
                                  steps=lambda: read.append(1) or [[100]])
    assert forced.mode == "full" and not read  # no data read
    assert forced.line() == ("Skrull activation checkpointing: full (skrull.activation_checkpoint = 'job': the "
                             "job's [activation_checkpoint] kind 'full', priced by the profile's fits for full)")
    assert SkrullConfig(cost_model="h100-assumed").activation_checkpoint == "job"  # the default


def test_old_profiles_and_presets_keep_the_jobs_mode_and_say_how_to_measure(tmp_path):
    old = _choose(_auto(_profile(tmp_path, modes=None)), [[100]], job_mode="selective")
    assert old.mode == "selective" and old.predicted_us == {}
    assert "measured one mode (unrecorded): assumed the job's [activation_checkpoint] kind 'selective'" in old.reason
    assert old.reason.endswith("--ac-modes none,selective,full")
    # The shipped profile was measured by 2 processes: the command says torchrun.
    assert "torchrun --standalone --nproc_per_node 2 -m skrull_ext.profile --config-file" in old.reason
    preset = _choose(SkrullConfig(cost_model="h100-assumed", activation_checkpoint="auto"), [[100]], "none")
    assert preset.mode == "none" and "hardware preset that measured no mode: assumed" in preset.reason


def test_bad_value_is_one_line():
    with pytest.raises(ValueError, match=r"^skrull.activation_checkpoint must be 'job' or 'auto', got 'sometimes' "
                                         r"\(the mode itself is \[activation_checkpoint\] kind\)$"):
        SkrullConfig(cost_model="h100-assumed", activation_checkpoint="sometimes")


def test_bad_value_in_a_job_file_names_the_key(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text(DEBUG.read_text().replace('activation_checkpoint = "auto"', 'activation_checkpoint = "selective"'))
    with pytest.raises(JobFileError, match=r"^skrull.activation_checkpoint: 'selective' is not one of "
                                           r"\['job', 'auto'\]; a mode \(none, selective, full\) is forced "
                                           r"with activation_checkpoint.kind and this key left 'job'$"):
        load_job(str(job))


def test_the_profile_is_read_under_the_chosen_mode(tmp_path):
    section = _auto(_profile(tmp_path))
    assert section.resolved_bucket_size() == 2000
    section.use_checkpointing("full")
    assert section.resolved_bucket_size() == 8000
    assert section.build_cost_model(SHAPE).a_us_per_flop == 1.6e-5


def test_free_running_is_checked_against_the_chosen_modes_memory(tmp_path):
    """The mode is priced lockstep; the execution chosen after it (train/execution.py) checks
    free-running's unsharded copy on top of that mode's activations, and its line names the mode:
    with the same unsharded bytes, "auto" runs free under full and lockstep under none, and
    true is refused under none, so the mode holds under the execution that runs."""
    from skrull_ext.train.execution import choose_execution

    path = _profile(tmp_path)

    def section(mode: str, free_running="auto") -> SkrullConfig:
        s = SkrullConfig(cost_model=path, bucket_size=1000, free_running=free_running)
        s.use_checkpointing(mode)
        assert s.checkpointing_mode == mode
        return s

    need = {m: section(m).measured_memory()[0].free_running_need(0.0, 1000) for m in ("none", "full")}
    usable = section("none").measured_memory()[0].usable
    unsharded = usable - (need["none"] + need["full"]) / 2  # fits beside full's activations, not none's
    assert need["full"] + unsharded <= usable < need["none"] + unsharded

    def run(s: SkrullConfig):
        return choose_execution(s, unsharded=unsharded, dp=2, cp=1, dp_shard=2, dp_replicate=1, shape=SHAPE,
                                model_name="llama3/debugmodel")

    full = run(section("full"))
    assert full.free_running and full.reason.startswith("skrull.free_running = 'auto': free-running, because it fits")
    assert f"needs {(need['full'] + unsharded) / 2**20:.1f} MiB per rank" in full.reason
    assert "static and activations of bucket_size 1000 under activation checkpointing full)" in full.reason
    none = run(section("none"))
    assert not none.free_running and "lockstep, because free-running needs" in none.reason
    assert "under activation checkpointing none)" in none.reason
    with pytest.raises(ValueError, match=r"^skrull.free_running = true needs .* under activation checkpointing none\)"):
        run(section("none", True))
    assert "under activation" not in run(SkrullConfig(cost_model=path, bucket_size=1000)).reason  # no mode set


def test_modes_and_configs():
    assert mode_of(None) == "none" and mode_of(SelectiveAC.Config()) == "selective"
    assert mode_of(FullAC.Config()) == "full" and mode_of(object()) is None
    own = SelectiveAC.Config(preserve_rng_state=False)
    assert ac_config("selective", own) is own  # the job's options kept
    assert ac_config("none", own) is None and isinstance(ac_config("full", own), FullAC.Config)


def test_start_up_puts_the_mode_in_the_config_before_the_model(tmp_path):
    """settle_checkpointing (SkrullTrainer.init_distributed runs it, before torchtitan builds
    and parallelises the model) sets config.activation_checkpoint and reads the profile under it."""
    job = tmp_path / "job.toml"
    path = _profile(tmp_path)
    assert load_job(str(DEBUG)).skrull.activation_checkpoint == "auto"  # the README's job chooses
    job.write_text(DEBUG.read_text().replace("bucket_size = 256", 'bucket_size = "profile"')
                   .replace('cost_model = "../../profiles/cpu-debug-gloo2.toml"', f'cost_model = "{path}"'))
    config = load_job(str(job))
    config.activation_checkpoint = SelectiveAC.Config()
    dims = SimpleNamespace(dp_enabled=False, cp=1, dp_shard=1, dp_replicate=1)
    choice = settle_checkpointing(config, dims, SHAPE, "llama3/debugmodel", lambda c, dp: [[1500, 300]] * 3)
    assert choice.mode == "none" and config.activation_checkpoint is None  # every sequence fits at its 2000
    assert config.skrull.resolved_bucket_size() == 2000
    choice = settle_checkpointing(config, dims, SHAPE, "m", lambda c, dp: [[3000]])
    assert choice.mode == "selective" and isinstance(config.activation_checkpoint, SelectiveAC.Config)
    assert config.skrull.resolved_bucket_size() == 4000


def test_a_checkpointing_choice_torch_cannot_compile_is_refused(tmp_path, monkeypatch):
    """Under TP 2 and compile, 'auto' choosing a checkpointing mode on torch 2.13 is refused in one
    line naming the choice (torchtitan_patches/compat.py check_checkpointed_compile); 'none' runs."""
    from torchtitan_patches import compat

    monkeypatch.setattr(compat, "_checkpointed_local_map_saves_its_mesh", lambda: True)
    job = tmp_path / "job.toml"
    path = _profile(tmp_path)
    job.write_text(DEBUG.read_text().replace("bucket_size = 256", 'bucket_size = "profile"')
                   .replace('cost_model = "../../profiles/cpu-debug-gloo2.toml"', f'cost_model = "{path}"'))
    config = load_job(str(job))
    config.parallelism.tensor_parallel_degree, config.compile.enable = 2, True
    config.parallelism.spmd_backend = "partial_dtensor"  # what the CPU fixes set (torchtitan_patches)
    dims = SimpleNamespace(dp_enabled=False, cp=1, dp_shard=1, dp_replicate=1)
    assert settle_checkpointing(config, dims, SHAPE, "m", lambda c, dp: [[1500, 300]] * 3).mode == "none"
    with pytest.raises(ValueError, match=r"^skrull.activation_checkpoint = 'auto' chose 'selective' with "
                                         r"compile.enable and parallelism.tensor_parallel_degree = 2 stops in torch "):
        settle_checkpointing(config, dims, SHAPE, "m", lambda c, dp: [[3000]])


@pytest.mark.slow
def test_first_lengths_are_the_jobs_first_global_batches():
    """The lengths start-up prices are the global batches the job's own loader draws."""
    config = load_job(str(DEBUG))
    lengths = first_lengths(config, 1)
    assert len(lengths) == min(64, config.training.steps)
    tokenizer = config.tokenizer.build(tokenizer_path=config.hf_assets_path)
    source = config.dataloader.build(dp_world_size=1, dp_rank=0, tokenizer=tokenizer).source
    gbs = config.dataloader.global_batch_size
    assert lengths == [[source.length(i) for i in source.global_batch(k, gbs)] for k in range(1, len(lengths) + 1)]


def test_a_bad_profiler_mode_is_one_line():
    from skrull_ext.profile.options import ProfileOptions

    assert ProfileOptions().ac_modes == ("none", "selective", "full") and ProfileOptions(ac_modes=()).ac_modes == ()
    with pytest.raises(ValueError, match=r"^--ac-modes: \['half'\] not among \['none', 'selective', 'full'\]$"):
        ProfileOptions(ac_modes=("none", "half"))
