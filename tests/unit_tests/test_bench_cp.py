"""The training side-by-side benchmark's own arithmetic (bench cp): variant
parsing and per-run summaries. The runs themselves are a script, not a test."""

import pytest

from skrull_ext.bench import cp_train


def _step(wall, kv, blocked=0.0, overlapped=0.0, local=0, dist=0):
    return {"step": 0, "wall_s": wall, "kv_bytes": kv, "blocked_s": blocked,
            "overlapped_s": overlapped, "local_tokens": local, "dist_tokens": dist}


def test_summary_takes_the_slowest_rank_and_sums_bytes_after_warmup():
    rank0 = [_step(None, 100), _step(9.0, 100), _step(1.0, 10, 0.2, 0.1, 3, 1), _step(3.0, 30, 0.4, 0.3, 3, 1),
             _step(8.0, 0)]
    rank1 = [_step(None, 100), _step(9.0, 100), _step(2.0, 20, 0.1, 0.5, 1, 3), _step(1.0, 10, 0.1, 0.1, 1, 3),
             _step(1.0, 0)]
    s = cp_train.summarize_run([rank0, rank1], warmup=1)
    assert s["step_s_all"] == [2.0, 3.0, 8.0]  # slowest rank per step, steps 0-1 left out
    assert s["step_s"] == pytest.approx(13.0 / 3)  # the mean (time per step), not the median
    assert s["kv_bytes"] == pytest.approx((30 + 40 + 0) / 3)  # summed over ranks, mean over steps
    assert s["blocked_s"] == pytest.approx((0.2 + 0.4) / 3)
    assert s["overlapped_s"] == pytest.approx((0.5 + 0.3) / 3)
    assert s["local_token_share"] == 0.5


def test_variants_parse_and_the_baseline_comes_first():
    a = cp_train.parse_args(["--variant", "torchtitan=--skrull.no-enable", "--variant", "fast=--a 1 --b"])
    assert a.modes == {"torchtitan": ["--skrull.no-enable"], "fast": ["--a", "1", "--b"]}
    default = cp_train.parse_args([]).modes
    assert list(default) == ["torchtitan", "torchtitan-stream", "skrull"]
    assert default["torchtitan-stream"] == ["--skrull.no-enable", "--dataloader.packing", "stream"]
    assert cp_train.baselines(default) == ["torchtitan", "torchtitan-stream"]
    with pytest.raises(SystemExit):
        cp_train.parse_args(["--variant", "skrull="])
    with pytest.raises(SystemExit):
        cp_train.parse_args(["--variant", "torchtitan=", "--variant", "torchtitan=--x"])
    with pytest.raises(SystemExit):
        cp_train.parse_args(["--nproc", "3", "--cp", "2"])


def test_a_probe_count_that_disagrees_with_the_attention_counters_fails():
    rec = dict(_step(1.0, 10), dacp_stats_bytes=12)
    with pytest.raises(SystemExit, match="10 K/V bytes.*counters 12"):
        cp_train.summarize_run([[rec, rec]], warmup=0)


def test_the_table_gives_a_paired_ratio_against_each_baseline():
    def run(step_s, mib):
        return {"step_s": step_s, "kv_bytes": mib * 2**20, "blocked_s": 0.0, "overlapped_s": 0.0,
                "local_token_share": 0.5}

    results = {"torchtitan": [run(1.0, 48), run(1.2, 48)], "torchtitan-stream": [run(0.5, 24), run(0.8, 24)],
               "skrull": [run(0.25, 6), run(0.4, 6)]}
    rows = cp_train.table(results, ["torchtitan", "torchtitan-stream"]).splitlines()
    assert "step-time ratio torchtitan/mode" in rows[0] and "step-time ratio torchtitan-stream/mode" in rows[0]
    skrull = [c.strip() for c in rows[-1].split("|")]
    # per repeat: 1.0/0.25 = 4, 1.2/0.4 = 3; 0.5/0.25 = 2, 0.8/0.4 = 2
    assert skrull[1:6] == ["skrull", "6.00", "0.12x", "325.0 (250.0-400.0)", "3.50 (3.00-4.00)"]
    assert skrull[6] == "2.00 (2.00-2.00)"
