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
    assert s["tokens"] is None  # no loader count recorded
    for i, rec in enumerate(rank0):
        rec["step_tokens"] = 100 * i
    assert cp_train.summarize_run([rank0, rank1], warmup=1)["tokens"] == pytest.approx(300)  # rank 0's, measured steps


def test_variants_parse_and_versus_names_a_mode():
    a = cp_train.parse_args(["--variant", "torchtitan=--skrull.no-enable", "--variant", "fast=--a 1 --b"])
    assert a.modes == {"torchtitan": ["--skrull.no-enable"], "fast": ["--a", "1", "--b"]}
    default = cp_train.parse_args([]).modes
    assert list(default) == ["torchtitan", "torchtitan-stream", "torchtitan-documents", "skrull", "skrull-lockstep"]
    assert default["skrull"] == [] and default["skrull-lockstep"] == ["--skrull.no-free_running"]
    assert default["torchtitan-stream"] == ["--skrull.no-enable", "--dataloader.packing", "stream",
                                            "--training.local_batch_size", "1"]
    assert default["torchtitan-documents"] == ["--skrull.no-enable", "--dataloader.packing", "documents",
                                               "--training.local_batch_size", "1"]
    assert cp_train.baselines(default) == ["torchtitan", "torchtitan-stream", "torchtitan-documents"]
    # Any mode may come first (the K/V ratio's reference); --versus adds a ratio column for a mode.
    la = cp_train.parse_args(["--variant", "skrull=", "--variant", "skrull-lookahead8=--skrull.lookahead 8",
                              "--versus", "skrull"])
    assert list(la.modes) == ["skrull", "skrull-lookahead8"]
    assert cp_train.baselines(la.modes, la.versus) == ["skrull"]
    assert cp_train.baselines(default, ["skrull", "torchtitan"]) == ["torchtitan", "torchtitan-stream",
                                                                     "torchtitan-documents", "skrull"]
    with pytest.raises(SystemExit):
        cp_train.parse_args(["--variant", "skrull=", "--versus", "nosuch"])
    with pytest.raises(SystemExit):
        cp_train.parse_args(["--variant", "torchtitan=", "--variant", "torchtitan=--x"])
    with pytest.raises(SystemExit):
        cp_train.parse_args(["--nproc", "3", "--cp", "2"])


def test_a_probe_count_that_disagrees_with_the_attention_counters_fails():
    rec = dict(_step(1.0, 10), dacp_stats_bytes=12)
    with pytest.raises(SystemExit, match="10 K/V bytes.*counters 12"):
        cp_train.summarize_run([[rec, rec]], warmup=0)


def test_the_table_gives_a_paired_per_token_ratio_against_each_baseline():
    def run(step_s, mib, tokens):
        return {"step_s": step_s, "kv_bytes": mib * 2**20, "blocked_s": 0.0, "overlapped_s": 0.0,
                "local_token_share": 0.5, "tokens": tokens}

    results = {"torchtitan": [run(1.0, 48, 600), run(1.2, 48, 600)],
               "torchtitan-stream": [run(0.25, 24, 300), run(0.4, 24, 300)],
               "skrull": [run(0.25, 6, 600), run(0.4, 6, 600)]}
    rows = cp_train.table(results, ["torchtitan", "torchtitan-stream"]).splitlines()
    assert "speed-up over torchtitan per token" in rows[0] and "speed-up over torchtitan-stream per token" in rows[0]
    skrull = [c.strip() for c in rows[-1].split("|")]
    # per token and repeat: torchtitan 1.0/600 and 1.2/600 against 0.25/600 and 0.4/600: 4 and 3;
    # torchtitan-stream 0.25/300 and 0.4/300 against the same: 2 and 2
    assert skrull[1:9] == ["skrull", "600", "6.00", "0.12x", "325.0 (250.0-400.0)", "541.7 (416.7-666.7)",
                           "3.50 (3.00-4.00)", "2.00 (2.00-2.00)"]


def test_the_table_holds_a_run_without_a_kv_exchange():
    # DP 2 x CP 1: no CP group, no K/V moved by any mode; the ratio column reads '-'.
    run = lambda s: {"step_s": s, "kv_bytes": 0.0, "blocked_s": 0.0, "overlapped_s": 0.0,  # noqa: E731
                     "local_token_share": 1.0, "tokens": 600}
    rows = cp_train.table({"torchtitan": [run(1.0)], "skrull": [run(0.5)]}, ["torchtitan"]).splitlines()
    skrull = [c.strip() for c in rows[-1].split("|")]
    assert skrull[1:8] == ["skrull", "600", "0.00", "-", "500.0 (500.0-500.0)", "833.3 (833.3-833.3)",
                           "2.00 (2.00-2.00)"]
