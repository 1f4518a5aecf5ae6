"""bench train-report (skrull_ext/bench/train_report.py): the per-mode figures
read back from a run's probe, and a recompile's slow step named, not averaged away."""

import json
import math

from skrull_ext.bench.train_report import summarize_mode, table


def _run(tmp_path, walls, tokens=1000):
    probe = tmp_path / "run_0" / "probe"
    probe.mkdir(parents=True)
    steps = [{"step": i + 1, "wall_s": w, "step_tokens": tokens} for i, w in enumerate(walls)]
    (probe / "rank0.json").write_text(json.dumps(steps))
    return str(tmp_path / "run_0")


def test_slow_step_named_and_left_out_of_the_second_rate(tmp_path):
    # warm-up 2 (left out), then 5 steps of 0.5 s and one of 6 s (a recompile)
    r = summarize_mode(_run(tmp_path, [9.0, 9.0, 0.5, 0.5, 6.0, 0.5, 0.5, 0.5]), warmup=2)
    assert r["measured_steps"] == 6
    assert math.isclose(r["real_tokens_per_s"], 6000 / 8.5)
    assert r["slow_steps"] == [5] and r["slow_steps_ms"] == [6000.0]
    assert math.isclose(r["real_tokens_per_s_without_slow"], 5000 / 2.5)
    assert math.isclose(r["median_step_ms"], 500.0)
    row = table({"skrull": r}).splitlines()[2]
    assert "| 5 (6,000 ms): 2,000 without |" in row


def test_no_slow_step_leaves_the_rate_alone(tmp_path):
    r = summarize_mode(_run(tmp_path, [0.4, 0.5, 0.6, 0.5]), warmup=0)
    assert r["slow_steps"] == [] and r["real_tokens_per_s_without_slow"] == r["real_tokens_per_s"]
    assert "| - |" in table({"m": r}).splitlines()[2]


def test_memory_prediction_adds_what_free_running_holds(tmp_path):
    """Predicted = static + activation fit at the step's largest micro-batch + the
    unsharded parameters and gradients the trainer logs (skrull/free_running_bytes)."""
    from torch.utils.tensorboard import SummaryWriter

    from skrull_ext.scheduler.profile_file import ProfileMemory

    run = _run(tmp_path, [0.5] * 4)
    gib = 2**30
    memory = ProfileMemory(bucket_size=1000, a=gib / 1000, b=0.0, c=0.0, usable=100 * gib, static=2 * gib, margin=0.0)
    with SummaryWriter(f"{run}/tb/20261127") as w:
        for step, (tokens, active, held) in enumerate([(1000, 3.0, 0), (500, 2.5, 0), (1000, 4.0, gib),
                                                       (500, 3.5, gib)], start=1):
            w.add_scalar("skrull/max_rank_tokens", tokens, step)
            w.add_scalar("memory/max_active(GiB)", active, step)
            w.add_scalar("skrull/free_running_bytes", held, step)
    r = summarize_mode(run, warmup=0, memory=memory)
    # predicted GiB: 3, 2.5, 4, 3.5: every step measured as predicted
    assert math.isclose(r["memory_over_predicted"], 1.0) and math.isclose(r["memory_over_predicted_max"], 1.0)
