"""``bench latency``'s look-ahead rows (skrull_ext/bench/lookahead_latency.py): the windows are
drawn limited as training limits them, the core and the full-pricing reference regroup the same
windows, and the table prints both gains and the planning share."""

import json

import pytest

from skrull_ext import _core
from skrull_ext.bench import latency, lookahead_latency


def test_windows_are_drawn_limited_and_reproducible():
    shape = lookahead_latency.Shape("t", dp=2, cp=2, per_dp=3)
    pool = [10, 100, 10**6]
    a = lookahead_latency.draw_windows(pool, shape, 64, width=3, windows=2, seed=7)
    assert a == lookahead_latency.draw_windows(pool, shape, 64, width=3, windows=2, seed=7)
    assert [len(w) for w in a] == [3, 3] and all(len(b) == 6 for w in a for b in w)
    assert max(s for w in a for b in w for s in b) <= _core.max_sequence_length(64, 2)


def test_lookahead_rows_side_by_side(tmp_path, capsys):
    out = tmp_path / "latency.json"
    rc = latency.main(["--settings", "--lookahead-settings", "paper", "--lookahead-width", "2",
                       "--lookahead-windows", "1", "--lookahead-reference", "--json", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "Look-ahead: windows of 2 global batches, lockstep" in printed
    assert "| 4 x 8 | mix_sharegpt_conv95+longbench_en5 | 1 |" in printed
    (row,) = json.loads(out.read_text())["lookahead"]
    # Never predicted slower than arrival order, on either side; both priced by the same planner.
    assert row["gain"] >= 1.0 and row["reference"]["gain"] >= 1.0
    assert row["share_cpu"] > 0 and row["planned_steps"] >= 2 and row["reference"]["plans"] >= 2
    assert row["shape"] == {"name": "paper", "dp": 4, "cp": 8, "per_dp": 64}


def test_latency_rows_with_chunked_documents(capsys):
    assert latency.main(["--settings", "paper", "--chunked", "0", "2", "--timelines", "free", "--policies", "skrull",
                         "--reps", "3", "--python-reps", "0", "--facade-reps", "1", "--cpsat-batches", "0",
                         "--lookahead-settings"]) == 0
    out = capsys.readouterr().out
    assert "| paper | 256 | skrull (free) | " in out
    assert "| paper | 256 | skrull (free) +2 chunked (2." in out and "the same samples without them) |" in out


def test_latency_times_the_python_references_of_slot_gds_and_chunked_documents(tmp_path):
    """Lockstep rows (slot GDS) and chunked rows time their plain-Python references too
    (bench/reference_slots.py, reference_chunked.py); only skrull-pool has none."""
    out = tmp_path / "latency.json"
    assert latency.main(["--settings", "paper", "--chunked", "0", "2", "--timelines", "lockstep", "free",
                         "--policies", "skrull", "skrull-pool", "--reps", "1", "--python-reps", "1",
                         "--facade-reps", "1", "--cpsat-batches", "0", "--lookahead-settings",
                         "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["results"][0]["policies"]
    timed = {label for label, row in rows.items() if row["python_ref_us"]["n"] == 1}
    assert timed == {"skrull (lockstep)", "skrull (lockstep) +2 chunked", "skrull (free)", "skrull (free) +2 chunked"}
    assert all(row["python_ref_us"]["n"] == 0 for label, row in rows.items() if label.startswith("skrull-pool"))


def test_latency_cpsat_rows_run(capsys):
    """The CP-SAT block solves the planned batches' micro-batches (it called a removed plan method:
    every default ``bench latency`` run stopped there with an AttributeError)."""
    assert latency.main(["--settings", "paper", "--timelines", "free", "--policies", "skrull", "--reps", "1",
                         "--python-reps", "0", "--facade-reps", "1", "--cpsat-batches", "1", "--cpsat-max-mb", "1",
                         "--cpsat-time", "0.01", "--lookahead-settings", "--json", "/dev/null"]) == 0
    assert "| paper | 256 | skrull (free) | " in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--profile", "/nonexistent.toml"], "argument --profile: profile '/nonexistent.toml' is not a file"),
    (["--facade-reps", "0"], "argument --facade-reps: must be >= 1, got 0"),
    (["--cpsat-batches", "-1"], "argument --cpsat-batches: must be >= 0, got -1"),
    (["--cpsat-time", "0"], "--cpsat-time must be > 0 (deterministic seconds), got 0.0"),
])
def test_latency_bad_flags_are_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        latency.main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err
