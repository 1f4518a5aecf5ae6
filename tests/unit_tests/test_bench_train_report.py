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


def test_steps_after_until_are_not_read(tmp_path):
    """Steps traced after the timed ones (tools/gpu_checks.sh's TRACE: 2 kept steps of 0.5 s, then a
    profiler warm-up step and two traced ones, slower) are left out of every figure, run totals too."""
    from torch.utils.tensorboard import SummaryWriter

    run = _run(tmp_path, [9.0, 0.5, 0.5, 0.9, 1.5, 1.5])
    with SummaryWriter(f"{run}/tb/20261129") as w:
        for step in range(1, 7):
            w.add_scalar("compile/graphs", 1 if step <= 3 else 2, step)  # a graph compiled at step 4
            w.add_scalar("documents/cut_documents", step, step)
    r = summarize_mode(run, warmup=1, until=3)
    assert r["steps"] == 3 and r["measured_steps"] == 2 and math.isclose(r["real_tokens_per_s"], 2000 / 1.0)
    assert r["recompiles_after_warmup"] == 0 and r["cut_documents"] == 3
    everything = summarize_mode(run, warmup=1)
    assert everything["measured_steps"] == 5 and everything["recompiles_after_warmup"] == 1


def test_memory_prediction_adds_what_free_running_holds(tmp_path):
    """Predicted = static + activation fit at the step's largest micro-batch + the
    unsharded parameters and gradients the trainer logs (skrull/free_running_bytes)."""
    from torch.utils.tensorboard import SummaryWriter

    from skrull_ext.scheduler.profile_memory import ProfileMemory

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


def test_document_figures_recompiles_and_ratios(tmp_path):
    """The document-aware TFLOP/s and MFU (medians after the warm-up), the run's cut
    documents, the graphs compiled after the warm-up, and each mode against the baselines."""
    from torch.utils.tensorboard import SummaryWriter

    from skrull_ext.bench.train_report import ratios

    results = {}
    for mode, tflops, graphs, cuts in (("skrull", [1.0, 9.0, 10.0, 12.0], [2, 4, 4, 5], 0),
                                       ("torchtitan-documents", [1.0, 8.0, 8.0, 8.0], [1, 2, 2, 2], 0),
                                       ("torchtitan-stream", [2.0, 11.0, 12.0, 13.0], [1, 1, 1, 1], 7)):
        run = _run(tmp_path / mode, [0.5] * 4, tokens=1000 if mode != "skrull" else 1500)
        with SummaryWriter(f"{run}/tb/20261128") as w:
            for step, (t, g) in enumerate(zip(tflops, graphs), start=1):
                w.add_scalar("documents/tflops", t, step)
                w.add_scalar("documents/mfu(%)", 10 * t, step)
                w.add_scalar("compile/graphs", g, step)
                w.add_scalar("documents/cut_documents", cuts * step, step)
                w.add_scalar("documents/context_lost_tokens", 100 * cuts * step, step)
        results[mode] = summarize_mode(run, warmup=2)
    s, d, st = results["skrull"], results["torchtitan-documents"], results["torchtitan-stream"]
    assert s["document_tflops"] == 11.0 and s["document_mfu_pct"] == 110.0  # median of steps 3-4
    assert s["recompiles_after_warmup"] == 1 and d["recompiles_after_warmup"] == 0  # graphs at step 4 - at step 2
    assert st["cut_documents"] == 28 and st["context_lost_tokens"] == 2800 and s["cut_documents"] == 0
    assert ratios(results) == [
        "skrull / torchtitan-documents: real tokens/s x1.50, document-aware TFLOP/s x1.38",
        "torchtitan-stream / torchtitan-documents: real tokens/s x1.00, document-aware TFLOP/s x1.56",
        "skrull / torchtitan-stream: real tokens/s x1.50, document-aware TFLOP/s x0.88",
        "torchtitan-documents / torchtitan-stream: real tokens/s x1.00, document-aware TFLOP/s x0.64",
    ]
    header, _, row = table(results).splitlines()[:3]
    cells = dict(zip([c.strip() for c in header.split("|")], [c.strip() for c in row.split("|")]))
    assert cells["document-aware TFLOP/s a device"] == "11" and cells["recompiles after warm-up"] == "1"


def test_document_rate_is_the_kept_steps_work_over_their_time(tmp_path):
    """10 TFLOP/s for 1 s and 2 TFLOP/s for 3 s did 16 TFLOP in 4 s: 4 TFLOP/s, not the median (6)."""
    from torch.utils.tensorboard import SummaryWriter

    run = _run(tmp_path, [1.0, 1.0, 1.0, 3.0])
    with SummaryWriter(f"{run}/tb/20261128") as w:
        for step, t in enumerate([50.0, 50.0, 10.0, 2.0], start=1):
            w.add_scalar("documents/tflops", t, step)
    assert summarize_mode(run, warmup=2)["document_tflops"] == 4.0


def test_a_training_dump_folder_is_a_mode(tmp_path, capsys):
    """A dump folder (tb/, no probe) is read from rank 0's scalars: each step of a logging
    interval gets the interval's mean time and tokens; a folder with neither is named."""
    import pytest
    from torch.utils.tensorboard import SummaryWriter

    from skrull_ext.bench import train_report

    dump = tmp_path / "my_run"
    with SummaryWriter(f"{dump}/tb/20261129") as w:  # log_freq 2 after step 1, as torchtitan logs
        for step, e2e, seen in ((1, 4.0, 100), (3, 0.5, 500), (5, 1.0, 1300)):
            w.add_scalar("time_metrics/end_to_end(s)", e2e, step)
            w.add_scalar("n_tokens_seen", seen, step)
    assert train_report.dump_steps(train_report.scalars(str(dump))) == [
        {"step": 1, "wall_s": 4.0, "step_tokens": 100.0},
        {"step": 2, "wall_s": 0.5, "step_tokens": 200.0}, {"step": 3, "wall_s": 0.5, "step_tokens": 200.0},
        {"step": 4, "wall_s": 1.0, "step_tokens": 400.0}, {"step": 5, "wall_s": 1.0, "step_tokens": 400.0}]
    assert train_report.main([str(dump), "--warmup", "1"]) == 0
    row = capsys.readouterr().out.splitlines()[2]
    assert row.startswith("| my_run | - | - | - | 400 | 750.0 |")  # no settings logged; 1,200 tokens over 3 s; steps 2-5
    assert (dump / "train_report.md").exists()
    with pytest.raises(SystemExit, match=r"empty: no runs under .*empty/runs .* no TensorBoard events under"):
        train_report.main([str(tmp_path / "empty")])


def test_a_skrull_runs_phases_are_its_medians_after_the_warm_up(tmp_path):
    """skrull/phase_<key>_ms (train/step_phases.py): each phase's median over the kept steps, in the
    registry's order, and the median share of the step as run outside the micro-batches."""
    from torch.utils.tensorboard import SummaryWriter

    run = _run(tmp_path, [1.0, 1.0, 1.0, 1.0])
    with SummaryWriter(f"{run}/tb/20261129") as w:
        for step, (mb, opt) in enumerate([(900.0, 90.0), (100.0, 10.0), (110.0, 30.0), (120.0, 20.0)], start=1):
            w.add_scalar("skrull/phase_opt_ms", opt, step)  # written out of order: the report orders them
            w.add_scalar("skrull/phase_mb_ms", mb, step)
            w.add_scalar("skrull/phase_rest_ms", 1.0, step)
            w.add_scalar("skrull/step_outside_ms", opt, step)
            w.add_scalar("skrull/measured_us", (mb + opt + 1.0) * 1e3, step)
            w.add_scalar("skrull/predicted_us", 100e3, step)
    r = summarize_mode(run, warmup=1)
    assert r["phases_ms"] == {"mb": 110.0, "opt": 20.0, "rest": 1.0}
    assert r["outside_share"] == 20.0 / 141.0  # the median of 10/111, 30/141, 20/141
    header, _, row = table({"skrull": r}).splitlines()[:3]
    cells = dict(zip([c.strip() for c in header.split("|")], [c.strip() for c in row.split("|")]))
    assert cells["step phases ms, median (outside the micro-batches)"] == "mb 110 opt 20 rest 1 (14%)"


def test_a_packed_runs_phases_stand_beside_skrulls(tmp_path):
    """torchtitan's batching (PackedTrainer) writes the same phase scalars and skrull/measured_us, and
    no prediction: its phases and share outside the micro-batches are read the same way, its
    measured / predicted is '-'; a dump folder of each, side by side."""
    from torch.utils.tensorboard import SummaryWriter

    from skrull_ext.bench import train_report

    walls = {"torchtitan-stream": [(1, 2.0), (2, 0.25), (3, 0.5), (4, 0.5)],
             "skrull": [(1, 2.0), (2, 0.25), (3, 0.25), (4, 0.25)]}
    for mode, steps in walls.items():
        with SummaryWriter(str(tmp_path / mode / "tb" / "20261129")) as w:
            for step, wall in steps:
                w.add_scalar("time_metrics/end_to_end(s)", wall, step)
                w.add_scalar("n_tokens_seen", 1000.0 * step, step)
                phases = {"data": 2.0, "mb": 1000 * wall - 30.0, "clip": 10.0, "opt": 15.0, "log": 4.0, "rest": 5.0}
                if mode == "torchtitan-stream" and step == 4:
                    phases["checks"] = 1.0  # a phase one step lacks: its median over the steps that ran it
                for key, ms in phases.items():
                    w.add_scalar(f"skrull/phase_{key}_ms", ms, step)
                w.add_scalar("skrull/step_outside_ms", 25.0, step)
                w.add_scalar("skrull/measured_us", 1e6 * wall, step)
                if mode == "skrull":
                    w.add_scalar("skrull/predicted_us", 200e3, step)
    assert train_report.main([str(tmp_path / "torchtitan-stream"), str(tmp_path / "skrull"), "--warmup", "1"]) == 0
    results = json.loads((tmp_path / "torchtitan-stream" / "train_report.json").read_text())
    packed = results["torchtitan-stream"]
    assert packed["phases_ms"] == {"data": 2.0, "checks": 1.0, "mb": 470.0, "clip": 10.0, "opt": 15.0, "log": 4.0,
                                   "rest": 5.0}
    assert packed["outside_share"] == 25.0 / 500.0  # the median of 25/250, 25/500, 25/500
    assert "measured_over_predicted" not in packed and results["skrull"]["measured_over_predicted"] == 1.25
    header, _, packed_row, skrull_row = (tmp_path / "torchtitan-stream" / "train_report.md").read_text().splitlines()[:4]
    cells = [dict(zip([c.strip() for c in header.split("|")], [c.strip() for c in row.split("|")]))
             for row in (packed_row, skrull_row)]
    said = "step phases ms, median (outside the micro-batches)"
    assert cells[0][said] == "data 2 checks 1 mb 470 clip 10 opt 15 log 4 rest 5 (5%)"
    assert cells[1][said] == "data 2 mb 220 clip 10 opt 15 log 4 rest 5 (10%)"
    assert cells[0]["measured / predicted step"] == "-" and cells[1]["measured / predicted step"] == "x1.25"


def _profile(path: str, bucket: int, modes: dict[str, tuple[float, int]] | None = None):
    """A measured profile's file as the report reads it: [memory] (a MiB a token, 1 GiB static) and,
    per checkpointing mode, its own bytes a token and BucketSize ([activation_checkpoint])."""
    from skrull_ext.scheduler.profile_file import Profile

    data = {"compute": {"a_us_per_flop": 1e-6, "b_us": 0.0}, "comm": {"bytes": [1], "us": [1.0]},
            "memory": {"bucket_size": bucket, "a_bytes_per_token": float(2**20), "b_bytes": 0.0,
                       "usable_bytes": float(2**40), "static_bytes": float(2**30), "margin": 0.0}}
    if modes:
        data["activation_checkpoint"] = {"measured": "selective", **{
            m: {"a_us_per_flop": 1e-6, "b_us": 0.0, "a_bytes_per_token": a, "b_bytes": 0.0, "bucket_size": b}
            for m, (a, b) in modes.items()}}
    return Profile(data, path)


def test_a_skrull_runs_settings_priced_under_its_mode_and_bucket_sizes_before_and_after(tmp_path):
    """What the run settled at start-up (train/run_settings.py's scalars: checkpointing mode 0 = none,
    BucketSize, head chunk tokens) read back exactly; the memory predicted with the profile's fit for
    that mode (none: 2 MiB a token, not [memory]'s 1 MiB); BucketSizes against the earlier profile's."""
    from torch.utils.tensorboard import SummaryWriter

    from skrull_ext.bench.train_report import bucket_line
    from skrull_ext.train.run_settings import run_settings

    run = _run(tmp_path, [0.5] * 3)
    logged = run_settings("none", 150_000, type("Loss", (), {"chunk_tokens": 880, "head_in_model": False,
                                                             "head_backward": "in_forward"})())
    with SummaryWriter(f"{run}/tb/20261129") as w:
        for step in (1, 2, 3):
            for tag, value in logged.items():
                w.add_scalar(tag, value, step)
            w.add_scalar("skrull/max_rank_tokens", 1024, step)
            w.add_scalar("memory/max_active(GiB)", 3.0, step)  # 1 GiB static + 1,024 tokens x 2 MiB
            w.add_scalar("memory/max_reserved(GiB)", 3.75, step)
    profile = _profile("new.toml", 100_000, {"none": (float(2**21), 150_000), "selective": (float(2**20), 200_000)})
    r = summarize_mode(run, warmup=1, profile=profile)
    assert (r["activation_checkpoint"], r["bucket_size"], r["head_chunk_tokens"]) == ("none", 150_000, 880)
    assert r["memory_over_predicted"] == 1.0 and r["reserved_over_predicted"] == 1.25
    header, _, row = table({"skrull": r}).splitlines()[:3]
    cells = dict(zip([c.strip() for c in header.split("|")], [c.strip() for c in row.split("|")]))
    assert (cells["activation checkpointing"], cells["BucketSize"], cells["head chunk tokens"]) == \
        ("none", "150,000", "880, in forward")  # loss.head_backward's mode as run (skrull/head_in_forward)
    assert bucket_line({"skrull": r, "torchtitan-documents": {}}, _profile("old.toml", 120_000), profile) == (
        "BucketSize before: 120,000 (old.toml); the profile's (new.toml): none 150,000 (x1.25), "
        "selective 200,000 (x1.67); skrull as run: 150,000 (x1.25), none")
    assert bucket_line({"skrull": r}, None, profile) is None  # no earlier profile named: no line


def test_a_run_without_settings_or_an_unchunked_head():
    """A run that logged no settings (torchtitan's batching, an older run) reads as such; 0 chunk
    tokens is the head unchunked in the model's forward; an unmeasured kind is no mode."""
    from skrull_ext.bench.train_report import settings
    from skrull_ext.train.run_settings import AC_TAG, mode_named, run_settings

    assert settings({}) == {}
    loss = type("Loss", (), {"chunk_tokens": 880, "head_in_model": True})()
    logged = run_settings(None, 4096, loss)
    assert math.isnan(logged[AC_TAG]) and mode_named(logged[AC_TAG]) is None
    assert settings({tag: {1: v} for tag, v in logged.items()}) == {
        "activation_checkpoint": None, "bucket_size": 4096, "head_chunk_tokens": 0, "head_in_forward": False}
    assert [mode_named(v) for v in (0.0, 1.0, 2.0, 3.0, 0.5)] == ["none", "selective", "full", None, None]


def test_each_variant_against_the_run_it_varies():
    """--against: the median step and document-aware TFLOP/s as ratios, and the phases that moved (ms)."""
    import pytest

    from skrull_ext.bench.train_report import against

    results = {
        "skrull-bucket-profile": {"median_step_ms": 300.0, "document_tflops": 280.0,
                                  "phases_ms": {"data": 0.0, "mb": 275.0, "opt": 14.0, "rest": 11.0}},
        "skrull-head-recompute": {"median_step_ms": 315.0, "document_tflops": 266.0,
                                  "phases_ms": {"data": 0.0, "mb": 290.5, "opt": 13.5, "rest": 11.0}},
        "torchtitan-documents": {"median_step_ms": 280.0, "document_tflops": 220.0},
    }
    assert against(results, "skrull-bucket-profile") == [
        "skrull-head-recompute / skrull-bucket-profile: median step x1.050, document-aware TFLOP/s x0.950; "
        "phases ms: data +0.0, mb +15.5, opt -0.5, rest +0.0",
        "torchtitan-documents / skrull-bucket-profile: median step x0.933, document-aware TFLOP/s x0.786",
    ]
    with pytest.raises(SystemExit, match="--against skrull: no such mode"):
        against(results, "skrull")
