"""The profiler under torchrun with 2 processes over gloo (tiny ladders): the
collectives are timed across the group and land in [comm] as a table the
scheduler reads; compute and memory are measured on both ranks."""

import pytest
import tomllib

from skrull_ext.scheduler import cost_model
from skrull_ext.scheduler.profile_file import Profile
from tests.integration_tests.launch import REPO, torchrun


@pytest.mark.slow
def test_profile_two_processes_over_gloo(tmp_path):
    out = tmp_path / "gloo2.toml"
    proc = torchrun(2, "skrull_ext.profile", [
        "--config-file", f"{REPO}/skrull_ext/jobs/debug_cpu.toml", "--out", str(out),
        "--lengths", "32,64,128", "--held-out", "96", "--packed", "",
        "--memory-lengths", "64,128,256,512", "--repeats", "1", "--layers", "1",
        "--comm-sizes", "4KiB:256KiB", "--comm-repeats", "3",
        "--memory-limit", "128MiB", "--max-held-out-error", "10",
        # One timed round after the warm-up (the micro-batch steps and the step's phases, FSDP over both
        # ranks): what this run checks is that each is measured over the group and lands in the file; the
        # median over rounds is the GPU profile's (11 by default). Three rounds took ~1/3 of this test's CPU.
        "--micro-batch-repeats", "1", "--max-micro-batch-error", "10",  # timing noise is not the point here
        # Steps of 1 and 2 micro-batches: the per-micro-batch slope over both ranks; the default three counts'
        # fit (1, 2, 4) is test_profile_run.py's, in one process. The 4-micro-batch step was the ladder's longest.
        "--micro-batch-counts", "1,2",
        "--no-plot",  # the PNG is test_profile_run.py's; matplotlib's import and render cost rank 0 seconds
        # One mode besides the job's (none): a mode's model rebuilt and measured over both ranks. Selective,
        # the third, takes the same path; it is measured in one process by test_profile_run.py (all three)
        # and tests/integration_tests/test_gpu_checks_dry_run.py (the script's --ac-modes selective).
        "--ac-modes", "full",
    ], cwd=str(tmp_path))
    assert "gloo x2" in proc.stdout, proc.stdout
    d = tomllib.loads(out.read_text())
    comm = d["comm"]
    assert comm["backend"] == "gloo" and comm["world_size"] == 2
    # [skrull] kv_exchange = "auto": on gloo the attention sends K/V point to point, so that is what is timed.
    assert comm["collective"] == "p2p_gather+p2p_reduce_scatter" and comm["collectives_per_layer"] == 2.0
    raw = d["meta"]["comm"]
    assert raw["sizes"] == [4096 * 2**k for k in range(7)]
    assert all(v > 0 for v in raw["p2p_gather_us"] + raw["p2p_reduce_scatter_us"])
    cm = cost_model.load(out)
    assert cm.comm_is_monotone() and cm.collective_us(2**20) > 0
    assert d["meta"]["check"]["ok"]
    # The per-micro-batch fixed cost: FSDP over both ranks, steps of 1 and 2 micro-batches.
    mb = d["micro_batch"]
    assert mb["counts"] == [1, 2] and mb["method"].startswith("step time over micro-batch counts, FSDP x2")
    assert mb["fixed_us"] == max(0.0, mb["slope_us"] - mb["calls_us"]) >= 0.0
    assert mb["calls_us"] == 6 * d["compute"]["b_us"]  # debugmodel: 6 layers
    assert len(d["meta"]["micro_batch"]["step_us"]) == 2 and all(v > 0 for v in d["meta"]["micro_batch"]["step_us"])
    # The device-bound steps, lockstep on both ranks (no host floor on CPU: the short figure is kept).
    raw_mb = d["meta"]["micro_batch"]
    assert raw_mb["device_bound_docs"] == [32, 32] and all(v > 0 for v in raw_mb["device_bound_step_us"])
    assert raw_mb["fixed_from"] == "short" and raw_mb["short_fixed_us"] == mb["fixed_us"]
    assert cm.micro_batch_fixed_us == mb["fixed_us"]
    # The head's per-token cost, timed on each rank before FSDP wraps the model (mean over both).
    assert cm.token_us == mb["token_us"] >= 0.0 and len(d["meta"]["head"]["us"]) == mb["token_points"] >= 2
    # The step outside its micro-batches on the FSDP x2 model: the norm's and the loss's all-reduces over
    # both ranks, the optimizer; the cost model's per-step term (free-running adds its own share).
    step = d["step"]
    assert step["fixed_us"] == step["checks_us"] + step["clip_us"] + step["opt_us"] and step["repeats"] == 1
    assert all(step[k] > 0 for k in ("checks_us", "clip_us", "opt_us"))
    assert cm.step_fixed_us == step["fixed_us"]
    free = Profile.load(out).cost_model(free_running=True)
    assert free.step_fixed_us == step["fixed_us"] + mb["free_running_step_us"]
    # The job's activation-checkpointing mode and the one --ac-modes names, each measured on both ranks.
    ac = d["activation_checkpoint"]
    assert list(ac) == ["measured", "none", "full"] and ac["measured"] == "none"
    assert ac["full"]["bucket_size"] > ac["none"]["bucket_size"] == d["memory"]["bucket_size"]
