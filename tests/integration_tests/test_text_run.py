"""The real-text job end to end: skrull_ext/jobs/debug_cpu_text.toml (the
shipped JSONL fixture, the shipped tiny BPE tokenizer) at CP=2, 2 processes,
with TensorBoard and torchtitan's profiler on. One launch, three checks:
it trains on local and distributed sequences; every per-step Skrull scalar
is in the event file; the profiler trace holds the DACP attention's parts."""

import gzip
import json
import math
import os

import pytest

from tests.integration_tests.conftest import PLAN_PROFILE
from tests.integration_tests.launch import REPO, Run, torchrun

JOB = os.path.join(REPO, "skrull_ext", "jobs", "debug_cpu_text.toml")
STEPS = 4

PHASES = [f"skrull/phase_{k}_ms" for k in ("data", "checks", "mb", "clip", "opt", "log", "rest")]
"""The step's phases (train/step_phases.py) this job runs every step: no chunked sample, every step logged."""


PER_STEP = [
    # time: predicted vs measured, scheduler latency
    "skrull/predicted_us", "skrull/measured_us", "skrull/measured_over_predicted",
    "skrull/scheduler_us", "skrull/fallback_us", "skrull/schedule_wall_us",
    # the plan
    "skrull/micro_batches", "skrull/max_micro_batches", "skrull/rank_micro_batches",
    "skrull/local_seq_share", "skrull/local_token_share",
    "skrull/rollbacks", "skrull/refine_moves", "skrull/cpsat_used",
    "skrull/rank_token_imbalance", "skrull/rank_flop_imbalance", "skrull/dp_imbalance",
    "skrull/truncated", "skrull/dropped", "skrull/truncated_total", "skrull/dropped_total",
    # samples read = trained whole + trained cut + skipped (data/steps/accounting.py)
    *(f"skrull/samples_{k}{t}" for k in ("read", "whole", "cut", "skipped", "skipped_no_loss") for t in ("", "_total")),
    # what the DACP attention ran on rank 0
    "skrull/dacp_local_seqs", "skrull/dacp_local_tokens", "skrull/dacp_dist_seqs",
    "skrull/dacp_dist_tokens", "skrull/dacp_fwd_bytes", "skrull/dacp_bwd_bytes",
    # the step by phase, read at the next logged step (the last at close)
    *PHASES, "skrull/step_outside_ms",
]


@pytest.fixture(scope="module")
def text_run(tmp_path_factory) -> Run:
    work = str(tmp_path_factory.mktemp("text"))
    dump = os.path.join(work, "run")
    proc = torchrun(2, "skrull_ext.train", [
        "--config-file", JOB, "--dump_folder", dump, "--training.steps", str(STEPS),
        "--parallelism.context_parallel_degree", "2", "--metrics.enable_tensorboard",
        # the plans the trace check rests on (step 4 runs both DACP parts on rank 0): conftest.py
        "--skrull.cost_model", PLAN_PROFILE,
        "--profiler.enable_profiling", "--profiler.profile_freq", str(STEPS),
        "--profiler.profiler_warmup", "1", "--profiler.profiler_active", "1",
    ], cwd=work)
    return Run(dump=dump, output=proc.stdout + proc.stderr, grads=None)


@pytest.mark.slow
def test_text_job_trains_on_local_and_distributed_sequences(text_run):
    losses = text_run.losses
    print(f"real-text losses {losses}")
    assert len(losses) == STEPS and losses[-1] < losses[0]
    assert "Loading tokenizer from tokenizer.json" in text_run.output
    assert sum(text_run.scalars("skrull/dacp_local_seqs")) > 0
    assert sum(text_run.scalars("skrull/dacp_dist_seqs")) > 0


@pytest.mark.slow
def test_skrull_scalars_are_written_every_step(text_run):
    m = {tag: text_run.scalars(tag) for tag in PER_STEP}
    for tag, values in m.items():
        assert len(values) == STEPS and all(math.isfinite(v) for v in values), (tag, values)
    for k in range(STEPS):
        assert m["skrull/measured_us"][k] > 0 and m["skrull/predicted_us"][k] > 0
        ratio = m["skrull/measured_us"][k] / m["skrull/predicted_us"][k]
        assert math.isclose(m["skrull/measured_over_predicted"][k], ratio, rel_tol=1e-5)
        # a step may place every sequence distributed (the measured CPU profile makes the exchange
        # cheap); that both kinds train over the run is test_text_job_trains_on_local_and_distributed_sequences
        assert 0 <= m["skrull/local_token_share"][k] <= 1 and 0 <= m["skrull/local_seq_share"][k] <= 1
        assert m["skrull/rank_token_imbalance"][k] >= 1 and m["skrull/rank_flop_imbalance"][k] >= 1
        assert m["skrull/schedule_wall_us"][k] >= m["skrull/scheduler_us"][k] > 0
        assert f"skrull step {k + 1}: " in text_run.output
        assert m["skrull/samples_read"][k] == 8 == (m["skrull/samples_whole"][k] + m["skrull/samples_cut"][k]
                                                     + m["skrull/samples_skipped"][k])
        assert m["skrull/samples_cut"][k] == m["skrull/truncated"][k]  # the policy's share, one count
    assert m["skrull/samples_read_total"] == [8.0 * (k + 1) for k in range(STEPS)]
    assert any(v > 0 for v in m["skrull/dacp_fwd_bytes"])  # K/V moved when sequences were distributed


@pytest.mark.slow
def test_what_the_run_settled_is_logged_with_every_step(text_run):
    """The checkpointing mode, BucketSize and head chunk (train/run_settings.py) at every step, the
    values the start-up lines say."""
    import re

    from skrull_ext.train.run_settings import AC_TAG, BUCKET_TAG, CHUNK_TAG, mode_named

    m = {tag: text_run.scalars(tag) for tag in (AC_TAG, BUCKET_TAG, CHUNK_TAG)}
    assert all(len(v) == STEPS and len(set(v)) == 1 for v in m.values()), m
    assert f"Skrull activation checkpointing: {mode_named(m[AC_TAG][0])} (" in text_run.output
    assert f"bucket_size {int(m[BUCKET_TAG][0])} (" in text_run.output
    chunk = int(re.search(r"head and loss in chunks of up to (\d+) tokens", text_run.output).group(1))
    unchunked = "one chunk holds a micro-batch, so the head runs in the model's forward" in text_run.output
    assert m[CHUNK_TAG][0] == (0 if unchunked else chunk)


@pytest.mark.slow
def test_profiler_trace_shows_the_dacp_parts(text_run):
    trace = os.path.join(text_run.dump, "profiling", "traces", f"iteration_{STEPS}", "rank0_trace.json.gz")
    assert os.path.isfile(trace), os.listdir(os.path.join(text_run.dump, "profiling", "traces"))
    with gzip.open(trace, "rt") as f:
        names = {e.get("name", "") for e in json.load(f)["traceEvents"]}  # Chrome trace: Perfetto opens it
    assert "skrull/micro_batch_0" in names
    assert {"dacp/local", "dacp/kv_wait", "dacp/distributed"} <= names, sorted(n for n in names if "dacp" in n)


@pytest.mark.slow
def test_each_step_is_timed_by_phase(text_run):
    """Every step's phases in TensorBoard and on the step line, the step as run their sum with the
    untimed rest (the data wait and the logging left out), the per-step term's share named."""
    m = {tag: text_run.scalars(tag) for tag in [*PHASES, "skrull/step_outside_ms", "skrull/measured_us"]}
    for k in range(STEPS):
        assert all(m[tag][k] >= 0 for tag in PHASES if tag != "skrull/phase_rest_ms")
        assert m["skrull/phase_rest_ms"][k] >= -1e-6
        outside = sum(m[f"skrull/phase_{p}_ms"][k] for p in ("checks", "clip", "opt"))
        assert math.isclose(m["skrull/step_outside_ms"][k], outside, rel_tol=1e-5)
        as_run = outside + m["skrull/phase_mb_ms"][k] + m["skrull/phase_rest_ms"][k]
        assert math.isclose(m["skrull/measured_us"][k], as_run * 1e3, rel_tol=1e-4)
    out = text_run.output
    for k in range(1, STEPS):
        assert f"skrull step {k + 1}: " in out and f"; step {k} phases ms: data " in out
    assert f"Skrull: step {STEPS} (the last): phases ms: data " in out
    assert f"Skrull: step phases, median ms over {STEPS - 1} steps after the first: data " in out
    assert "outside the micro-batches (checks, clip, opt)" in out
    assert "has no [step] fixed_us" in out  # the plans' 2026-11-22 profile predates the per-step term
