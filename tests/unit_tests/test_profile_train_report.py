"""The training-run memory verdict (profile/train_report.py) and the profile's
[memory] reader it rests on, without a process group: the budget formula,
a step over its own budget fails its rank, a missing field is named."""

import pytest

from skrull_ext.profile.train_report import StepMemory, format_report, report
from skrull_ext.scheduler.profile_memory import ProfileMemory

MIB = 2**20
PROFILE = {"memory": {"bucket_size": 1000, "a_bytes_per_token": 1000.0, "b_bytes": 0.0, "c_bytes_per_token2": 1.0,
                      "usable_bytes": 6.0 * MIB, "static_bytes": 1.0 * MIB, "margin": 0.5}}


def _step(rank, step, tokens, peak, static=0.5 * MIB):
    return StepMemory(rank=rank, step=step, micro_batches=1, plan_tokens=tokens, buffer_tokens=tokens,
                      start=0.0, peak=peak, static=static)


def test_budget_is_static_plus_fit_over_margin():
    pm = ProfileMemory.of(PROFILE)
    assert pm.activation(1000) == 1000 * 1000 + 1000**2
    assert pm.budget(1000) == 1.0 * MIB + 2e6 / 0.5
    assert pm.budget(pm.bucket_size) <= pm.usable


def test_each_step_is_judged_by_its_own_tokens():
    pm = ProfileMemory.of(PROFILE)
    # rank 1's small step is over the budget for 100 tokens, though under the one for 1000
    records = [_step(0, 1, 1000, 4.0e6), _step(0, 2, 100, 0.1e6),
               _step(1, 1, 1000, 3.0e6), _step(1, 2, 100, 1.5e6)]
    v0, v1 = report(records, pm)
    assert v0.ok and not v1.ok
    assert (v0.buffer_tokens, v0.bucket_size) == (1000, 1000)
    assert v0.measured == 0.5 * MIB + 4.0e6 and v0.predicted == pm.budget(1000)
    text = format_report([v0, v1], records, pm)
    assert "OVER" in text and "BucketSize 1000 in training: FAILED" in text


def test_missing_memory_field_is_named():
    bad = {"memory": {k: v for k, v in PROFILE["memory"].items() if k != "static_bytes"}}
    with pytest.raises(ValueError, match="missing field memory.static_bytes"):
        ProfileMemory.of(bad)
    with pytest.raises(ValueError, match=r"missing section \[memory\]"):
        ProfileMemory.of({})


@pytest.mark.parametrize("name", ["cpu-debug-gloo2.toml", "cpu-debug-gloo2-cp2.toml", "h200-qwen2.5-0.5b.toml"])
def test_memory_section_round_trips_through_the_one_key_list(name):
    """MEMORY_KEYS is what reads and writes [memory]: a shipped profile's section, fit keys aside,
    comes back key for key and in order from ProfileMemory.section()."""
    import os

    from skrull_ext.scheduler.profile_file import Profile

    from skrull_ext.scheduler.profile_memory import MEMORY_KEYS

    p = Profile.load(os.path.join(os.path.dirname(__file__), "..", "..", "profiles", name))
    written = p.memory().section()
    assert written == {k: v for k, v in p.data["memory"].items() if k not in ("r2", "max_rel_error", "points")}
    assert list(written) == [k.key for k in MEMORY_KEYS if k.key in written]
    assert (p.bucket_size, p.cp) == (written["bucket_size"], written["cp"])
    assert "free_running_bytes" not in written  # left out at its default, 0: measured for lockstep
    assert ProfileMemory.of({"memory": written}) == p.memory()


@pytest.mark.parametrize("key, value, msg", [
    ("bucket_size", 3644.0, "memory.bucket_size must be a positive integer, got 3644.0"),
    ("cp", 0, "memory.cp must be a positive integer, got 0"),
    ("margin", "5%", "memory.margin must be a number, got '5%'"),
    ("static_bytes", True, "memory.static_bytes must be a number, got True"),
])
def test_a_bad_memory_value_is_named_by_every_reader(tmp_path, key, value, msg):
    """One check per key, wherever [memory] is read: loading the file, and ProfileMemory.of on a dict."""
    import tomli_w

    from skrull_ext.scheduler.profile_file import Profile

    section = {**PROFILE["memory"], key: value}
    data = {"compute": {"a_us_per_flop": 1e-6, "b_us": 0.0}, "comm": {"bytes": [1.0], "us": [1.0]}, "memory": section}
    path = tmp_path / "p.toml"
    path.write_text(tomli_w.dumps(data))
    with pytest.raises(ValueError, match=f"^{path}: {msg}$"):
        Profile.load(path)
    with pytest.raises(ValueError, match=f"^profile: {msg}$"):
        ProfileMemory.of(data)


def test_the_profile_plans_a_job_with_its_own_flags():
    """The profile's cost model and BucketSize reach a job whose flags switch its
    activation checkpointing on."""
    import os

    from skrull_ext.profile.train_check import job_argv
    from skrull_ext.train.job.job_file import JobConfigManager

    repo = os.path.join(os.path.dirname(__file__), "..", "..")
    profile = os.path.join(repo, "profiles", "cpu-debug-gloo2-cp2.toml")
    job = ["--config-file", os.path.join(repo, "skrull_ext", "jobs", "debug_cpu.toml"), "--activation_checkpoint.kind", "full"]
    config = JobConfigManager().parse_args(job_argv(profile, job))
    assert config.skrull.cost_model == profile and config.skrull.bucket_size == "profile"
    assert config.skrull.scheduler_config(dp=1, cp=2, lookahead=1).bucket_size == 2645
    assert type(config.activation_checkpoint).__qualname__ == "FullAC.Config"


def test_chunked_samples_are_judged_by_chunk_cost():
    """A step's chunked samples (overlength = "chunk"): time = their chunk_cost summed; bytes =
    static account + (A(chunk / cp) + the worst sample's peak_bytes_beyond_chunk) / (1 - margin);
    measured = static + what was held at their start + their peak."""
    from skrull_ext.profile.train_report import ChunkedMemory, chunked_predicted, format_chunked
    from skrull_ext.scheduler import cost_model
    from skrull_ext.scheduler.chunk_cost import chunk_cost

    pm, cm = ProfileMemory.of(PROFILE), cost_model.preset("llama3-debug")
    us, predicted = chunked_predicted(cm, pm, [300, 1000], 128, 1, gradient_bytes=5e5)
    costs = [chunk_cost(cm, n, 128, mask_bytes_per_token2=1.0, gradient_bytes=5e5) for n in (300, 1000)]
    assert us == sum(c.us for c in costs)
    assert predicted == 1.0 * MIB + (pm.activation(128) + costs[1].peak_bytes_beyond_chunk) / 0.5

    def rec(peak):
        return ChunkedMemory(rank=0, step=3, lengths=[300, 1000], chunk=128, cp=1, above_step_start=0.25 * MIB,
                             peak=peak, static=0.5 * MIB, us=2 * us, cpu_us=us, predicted_us=us, predicted=predicted)

    under, over = rec(predicted - 0.75 * MIB - 1), rec(predicted - 0.75 * MIB + 1)
    assert under.ok and not over.ok and under.measured == predicted - 1
    text = format_chunked([under, over])
    assert "300+1000 (128 over 1)" in text and "OVER" in text and "chunked samples in training: FAILED" in text
    assert "  2.00      1.00  " in text  # wall and CPU time against chunk_cost
