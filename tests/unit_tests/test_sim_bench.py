"""`python -m skrull_ext.bench simulate` on a small run: table, JSON and plots are produced."""

import json

import pytest

from skrull_ext.bench import __main__ as bench
from skrull_ext.bench import simulate
from skrull_ext.scheduler import cost_model


def test_simulate_writes_table_json_and_plots(tmp_path, capsys):
    out = tmp_path / "sim"
    rc = simulate.main(["--datasets", "wikipedia,chatqa2", "--models", "qwen2.5-0.5b", "--iterations", "2",
                        "--policies", "skrull-paper,skrull,sorted", "--out", str(out), "--quiet"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "| policy | job can run | vs baseline avg |" in printed and "| chatqa2 / qwen2.5-0.5b |" in printed
    md = (out / "results.md").read_text()
    assert "Command: `python -m skrull_ext.bench simulate --datasets wikipedia,chatqa2" in md
    assert "assumed: h100_assumed.toml" in md and "## Every cell and policy" in md
    data = json.loads((out / "results.json").read_text())
    assert data["meta"]["policies"] == ["baseline", "skrull-paper", "skrull", "sorted", "bound"]
    assert {c["policy"] for c in data["cells"]} == {"baseline", "skrull-paper", "skrull", "sorted", "bound"}
    assert len(data["iterations"][0]["per_policy"]["skrull"]) == 2
    assert data["summary"]["skrull_vs_paper_min"] >= 1.0
    for png in ("speedup.png", "iteration_time.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_lengths_run_names_the_fastest_job_policy_and_explains_the_rows(tmp_path, capsys):
    """Issue 38 item 6: a --lengths run says which policy a job should pick, why a faster row
    (sorted) is not one, and what the rows and columns are; its gaps read with its speed-ups
    (every policy against the bound of the job's batches: sorted, faster, has the lower gap)."""
    from pathlib import Path

    import skrull_ext.lengths

    file = Path(skrull_ext.lengths.__file__).parent / "sharegpt_v3_conversations.qwen.lengths.txt"
    out = tmp_path / "sim"
    rc = simulate.main(["--lengths", str(file), "--models",
                        "qwen2.5-0.5b", "--iterations", "20", "--policies", "sorted,skrull,skrull-paper", "--out",
                        str(out), "--no-plots", "--quiet"])
    assert rc == 0
    printed = capsys.readouterr().out
    (winner,) = [line for line in printed.splitlines() if line.startswith("fastest policy a job can run")]
    assert winner.startswith('fastest policy a job can run, on equal work: skrull, ')
    assert '[skrull] policy = "skrull"' in winner
    assert "not a policy a job can pick: sorted (" in winner and "regroups samples across steps" in winner
    assert "Rows:" in printed and "- sorted: LongAlign" in printed and "Columns:" in printed
    assert "gap to classic bound" in printed and "gap to lockstep-aware bound" in printed
    data = json.loads((out / "results.json").read_text())
    cells = {c["policy"]: c for c in data["cells"]}
    assert cells["sorted"]["speedup_vs_baseline"] > cells["skrull"]["speedup_vs_baseline"]
    assert cells["sorted"]["gap_to_bound"] < cells["skrull"]["gap_to_bound"]
    assert cells["sorted"]["gap_to_classic_bound"] < cells["skrull"]["gap_to_classic_bound"]
    assert winner in (out / "results.md").read_text()


def test_shape_options_override_the_paper_settings(tmp_path):
    out = tmp_path / "sim"
    simulate.main(["--datasets", "chatqa2", "--models", "qwen2.5-7b", "--dp", "1", "--cp", "4", "--batch-size", "8",
                   "--bucket-size", "8192", "--iterations", "1", "--out", str(out), "--no-plots", "--quiet"])
    data = json.loads((out / "results.json").read_text())
    assert {c["shape"] for c in data["cells"]} == {"1x4x8, C=8192"}
    assert not (out / "speedup.png").exists()


def test_profile_bucket_size_is_the_default(tmp_path):
    prof = tmp_path / "measured.toml"
    text = (cost_model.HARDWARE_PRESETS["h100-assumed"].read_text().replace('source = "assumed"', 'source = "measured"')
            + "\n[memory]\nbucket_size = 8192\n")
    prof.write_text(text)
    out = tmp_path / "sim"
    simulate.main(["--datasets", "wikipedia", "--models", "qwen2.5-0.5b", "--iterations", "1", "--profile", str(prof),
                   "--policies", "skrull", "--out", str(out), "--no-plots", "--quiet"])
    data = json.loads((out / "results.json").read_text())
    assert {c["shape"] for c in data["cells"]} == {"4x8x64, C=8192"}
    assert data["meta"]["profile"] == "measured: measured.toml, planned at 1.5x the exchange"  # the copied table's


def test_command_registry(capsys):
    assert {name: target for name, (target, _) in bench.COMMANDS.items()} == {
        "simulate": "skrull_ext.bench.simulate:main", "latency": "skrull_ext.bench.latency:main",
        "adversarial": "skrull_ext.bench.adversarial:main", "cp": "skrull_ext.bench.cp_train:main",
        "overlap": "skrull_ext.bench.overlap:main", "train-report": "skrull_ext.bench.train_report:main",
        "trace-report": "skrull_ext.bench.trace_report:main", "cpsat": "skrull_ext.bench.cpsat_gain:main",
        "datawait": "skrull_ext.bench.datawait:main", "data": "skrull_ext.bench.data:main"}
    for name, (target, _) in bench.COMMANDS.items():  # every target resolves
        module, func = target.split(":")
        assert callable(getattr(__import__(module, fromlist=[func]), func)), name
    assert bench.main(["nope"]) == 2
    assert "unknown command 'nope'" in capsys.readouterr().err
    assert bench.main([]) == 2
    with pytest.raises(SystemExit):
        bench.main(["simulate", "--policies", "fifo", "--quiet"])


def test_the_recommendation_is_on_equal_work_and_every_figure_is_in_the_legend(tmp_path, capsys):
    """Issue 50: on ShareGPT (24 sequences longer than C x CP) it named skrull-pool the fastest
    policy a job can run, though the pool trains whole what the others cut: more work, not the
    same. The line now compares equal work only and says why the pool is left out; and every
    column of every table printed is in the legend."""
    import re
    from pathlib import Path

    import skrull_ext.lengths

    file = Path(skrull_ext.lengths.__file__).parent / "sharegpt_v3_conversations.qwen.lengths.txt"
    rc = simulate.main(["--lengths", str(file), "--models", "qwen2.5-7b", "--iterations", "20", "--policies",
                        "skrull-paper,skrull,skrull-pool,skrull-pool-capped", "--out", str(tmp_path / "sim"), "--no-plots",
                        "--quiet"])
    assert rc == 0
    printed = capsys.readouterr().out
    (winner,) = [line for line in printed.splitlines() if line.startswith("fastest policy a job can run")]
    assert winner.startswith("fastest policy a job can run, on equal work: skrull, "), winner
    assert "not compared: skrull-pool (" in winner and "sequences the others cut at C x CP" in winner
    legend = printed[printed.index("Rows:"):]
    heads = [line for line in printed.splitlines() if line.startswith("| cell |") or line.startswith("| policy |")]
    assert len(heads) == 4
    for line in heads:
        for cell in (c.strip() for c in line.strip("|").split("|")):
            words = [w for w in re.split(r"[\s()/]+", cell) if w]
            missing = [w for w in words if w not in legend]
            assert not missing, (cell, missing)
    assert "(N s)" in legend and "C = BucketSize" in legend and "planned at Mx the exchange" in legend


def test_a_profile_that_failed_its_check_gives_no_bucket_size(tmp_path, capsys):
    """Issue 50: a failed [meta.check] is refused wherever its BucketSize would be used."""
    from tests.unit_tests.test_job_file import _failed_profile

    failed = _failed_profile(tmp_path)
    with pytest.raises(SystemExit) as e:
        simulate.main(["--profile", failed, "--datasets", "chatqa2", "--models", "llama3-debug", "--iterations", "1",
                       "--out", str(tmp_path / "sim"), "--no-plots", "--quiet"])
    assert e.value.code == 2
    assert (f"--profile {failed}: [meta.check] ok = false: a buffer of its BucketSize, 4997 tokens, peaked at "
            "1414.2 MiB") in capsys.readouterr().err


def test_lookahead_rows_are_runnable_and_drawn_apart():
    """A look-ahead row is a setting a job runs (policy skrull, lookahead = W), and its plot
    colour is never another row's (tab10 gave skrull+lookahead8, the eleventh row, sorted's)."""
    from skrull_ext.bench import plots, report
    from skrull_ext.sim.policies import SIM_POLICIES

    assert report.runnable("skrull+lookahead8")
    assert report.job_setting("skrull+lookahead8") == '[skrull] policy = "skrull", lookahead = 8'
    assert report.job_setting("skrull") == '[skrull] policy = "skrull"' and not report.runnable("sorted")
    rows = list(dict.fromkeys([*SIM_POLICIES, "bound", *(f"skrull+lookahead{w}" for w in (2, 4, 8, 16))]))
    styles = plots._styles(rows)
    assert len(set(styles.values())) == len(rows)
    plain = {styles[p][0] for p in rows if "lookahead" not in p}
    assert len(plain) == len(rows) - 4 and not plain & {styles[f"skrull+lookahead{w}"][0] for w in (2, 4, 8, 16)}


def test_overlength_chunk_puts_skrull_chunk_beside_chunkflow_on_whole_sequences(tmp_path, capsys):
    from skrull_ext.sim import simulator
    from skrull_ext.sim.packing import Shape

    out = tmp_path / "chunk"
    rc = simulate.main(["--datasets", "mix_sharegpt_conv95+longbench_en5", "--models", "qwen2.5-0.5b", "--dp", "2",
                        "--cp", "2", "--bucket-size", "4096", "--timeline", "free", "--overlength", "chunk",
                        "--iterations", "2", "--policies", "skrull", "--out", str(out), "--quiet"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "| skrull+chunk ms | chunkflow+whole ms | skrull+chunk speedup over chunkflow+whole |" in printed
    assert '- skrull+chunk: skrull with overlength = "chunk"' in printed
    assert (out / "chunked.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The whole rows plan every sequence, the others the cut ones; each plan validated by the simulator.
    shape = Shape(dp=2, cp=2, batch_size=64, bucket_size=4096, timeline="free")
    res = simulator.simulate(simulator.Scenario("mix_sharegpt_conv95+longbench_en5", "qwen2.5-0.5b", shape),
                             ["skrull", "skrull+chunk", "chunkflow+whole", "bound"], iterations=2, seed=0)
    assert res.over_limit == res.truncated > 0
    assert res.truncated_by_policy["skrull+chunk"] == res.truncated_by_policy["chunkflow+whole"] == 0
    assert all(m.time_us >= m.bound_us for p in ("skrull+chunk", "chunkflow+whole") for m in res.per_policy[p])
    assert res.mean_time_us("skrull+chunk") > res.mean_time_us("skrull")  # more work than the cut batches


def test_progress_names_each_policy_before_it_plans():
    """``on_policy`` (the bar's postfix at large shapes) hears every policy of every iteration, in
    order, before its plan; ``on_iteration`` once an iteration."""
    from skrull_ext.sim import simulator
    from skrull_ext.sim.packing import Shape

    heard, done = [], []
    shape = Shape(dp=2, cp=2, batch_size=8, bucket_size=4096, timeline="free")
    simulator.simulate(simulator.Scenario("chatqa2", "qwen2.5-0.5b", shape), ["baseline", "skrull", "bound"],
                       iterations=2, seed=0, on_policy=heard.append, on_iteration=lambda: done.append(len(heard)))
    assert heard == ["baseline", "skrull", "bound"] * 2 and done == [3, 6]
