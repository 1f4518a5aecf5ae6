"""Skrull-scheduled training matches torchtitan's own 1-process training.

From one seed checkpoint, float32, on the same global batches (the debug
job's synthetic data): torchtitan's Trainer in one process (rows packed as
torchtitan does) vs SkrullTrainer at CP=2 (2 processes) and DP=2 x CP=2
(4 processes), gloo. The Skrull runs split each global batch into planned
micro-batches with local and distributed sequences and DACP attention; the
loss is normalised by the global batch's loss tokens, so the 5 losses must
agree to float reassociation (|diff| < 1e-4) and go down, and so must every
parameter's gradient at the check step.

Activation checkpointing (torchtitan's full and selective AC, CP=2; full AC
with FSDP at DP=2 x CP=2: the dp2cp2 run itself) keeps that parity, and its
recomputation reuses the forward's K/V exchange: rank 0's DACP counters show
per step as many all-gathers and bytes as the plan asks (one per layer per
micro-batch with distributed sequences), as the CP=2 run without AC does
(replay.py).

The varlen segment plan (``attention_kernel = "segments"``, its CPU
executor) and its query tiles (``"tiles"``) keep the parity at CP=2. The
CP=2 AC runs are these: segments under full AC, tiles under selective AC
(the replay keeps the K/V whichever kernel takes them; the dense kernel
under AC: dp2cp2, and test_compile.py's compiled full-AC run).

The CP=2 kernel and AC runs train 2 steps, not 5 (conftest.SHORT): step 2 is
their check step, the first that mixes local and distributed sequences,
after one optimizer step; the reference saves its gradients too.

The DP=2 x CP=2 run computes its head and loss in chunks of 48 tokens
(train/head_loss.py; test_head_loss_run.py checks them), the one run
serving both files. It runs lockstep: every rank runs the plan's micro-batch
count (probe.py counts the forward passes), the counterpart of
test_free_running.py's free-running runs, checked here where the run is
launched anyway.

Schedule invariance (docs/design/method.md, "Loss"): the 'skrull' and 'worstfit'
policies schedule step 2's global batch differently (different plan digests,
same samples), and give the same gradients. The worstfit schedule is the tiles
run's (conftest): a run of its own cost as much as the tiles run.
"""

import json
import os

import pytest

from skrull_ext.train.plan_log import read_plan_log
from tests.integration_tests.conftest import CHECK_STEP, POOL_SUB_STEP, STEPS
from tests.integration_tests.launch import assert_same_grads

# float32 sums in another order. Observed on this machine: max |diff| ~4e-8
# on gradients up to ~9e-3, ||diff|| / ||grad|| ~1.2e-6.
GRAD = dict(rtol=1e-4, atol=1e-6, max_rel_norm=1e-5)


def _plans(run, rank: int = 0):
    return read_plan_log(os.path.join(run.dump, "skrull_plans", f"rank{rank}.jsonl"))


def own_counts(record: dict) -> dict[int, int]:
    """Micro-batches of each DP rank in one step's plan (plan_log record)."""
    counts: dict[int, set[int]] = {}
    for d, m in zip(record["plan_dp_rank"], record["plan_micro_batch"]):
        if d >= 0:  # a dropped sequence has no DP rank
            counts.setdefault(d, set()).add(m)
    return {d: len(ms) for d, ms in counts.items()}


def forward_passes(folder: str, world: int) -> dict[int, dict[int, int]]:
    """Forward passes per world rank per step, as probe.py counts them into ``folder``
    (SKRULL_PROBE_PASSES; a shared run's: ``skrull_runs.passes_folder(name)``)."""
    out = {}
    for rank in range(world):
        with open(os.path.join(folder, f"passes.rank{rank}.jsonl")) as f:
            out[rank] = {r["step"]: r["passes"] for r in map(json.loads, f)}
    return out


def _check_exact_and_mixed(run, check_step: int = CHECK_STEP) -> None:
    """Nothing was cut, and the check step ran local and distributed sequences
    (rank 0's DACP counters, summed over layers and micro-batches)."""
    assert sum(run.scalars("skrull/truncated")) == 0
    assert sum(run.scalars("skrull/dropped")) == 0
    k = check_step - 1
    assert run.scalars("skrull/dacp_local_seqs")[k] > 0, run.scalars("skrull/dacp_local_seqs")
    assert run.scalars("skrull/dacp_dist_seqs")[k] > 0, run.scalars("skrull/dacp_dist_seqs")
    share = run.scalars("skrull/local_seq_share")
    assert all(s > 0 for s in share) and 0 < share[k] < 1, share


def _matches_reference_losses_and_grads(run, reference, short: bool = False) -> None:
    """The parity standard: the 5 losses within 1e-4, the check step's gradients within GRAD
    (``short``: a conftest.SHORT run's POOL_SUB_STEP losses, and its last step's gradients)."""
    steps, check = (POOL_SUB_STEP, POOL_SUB_STEP) if short else (STEPS, CHECK_STEP)
    ref, got = reference.losses[:steps], run.losses
    print(f"torchtitan 1-proc {ref}\nskrull            {got}")
    assert len(got) == steps
    assert max(abs(a - b) for a, b in zip(ref, got)) < 1e-4, f"{ref} vs {got}"
    worst, rel = assert_same_grads(run.grads, reference.step_grads[check] if short else reference.grads, **GRAD)
    print(f"step {check} gradients vs torchtitan: max |diff| {worst:.3g}, relative norm {rel:.3g}")


def _matches_reference(run, reference, short: bool = False) -> None:
    _matches_reference_losses_and_grads(run, reference, short)
    _check_exact_and_mixed(run, POOL_SUB_STEP if short else CHECK_STEP)


@pytest.mark.slow
def test_parity_skrull_cp2(skrull_runs, reference):
    run = skrull_runs["cp2"]
    assert "attention kernel auto (dense)" in run.output
    _matches_reference(run, reference)


@pytest.mark.slow
def test_parity_skrull_dp2_cp2(skrull_runs, reference):
    _matches_reference(skrull_runs["dp2cp2"], reference)


@pytest.mark.slow
def test_parity_skrull_cp2_segments_kernel(skrull_runs, reference):
    """``[skrull] attention_kernel = "segments"`` reaches every layer's DACP
    attention, and the segment plan trains like the dense masks."""
    run = skrull_runs["cp2_segments_ac_full"]
    assert "attention kernel segments" in run.output
    _matches_reference(run, reference, short=True)


@pytest.mark.slow
def test_parity_skrull_cp2_tiles_kernel(skrull_runs, reference):
    """``[skrull] attention_kernel = "tiles"`` trains like the dense masks (the worstfit policy's
    schedule: test_parity_two_schedules_same_gradients)."""
    run = skrull_runs["cp2_tiles_ac_selective"]
    assert "attention kernel tiles" in run.output
    _matches_reference(run, reference, short=True)


def _exchange_counts(run) -> dict[str, list[float]]:
    """Rank 0's DACP counters per step, and what the plan says they must be:
    one all-gather per layer per micro-batch that has distributed sequences."""
    names = ("calls", "recomputes", "all_gathers", "replays", "reduce_scatters", "fwd_bytes", "bwd_bytes")
    got = {n: run.scalars(f"skrull/dacp_{n}") for n in names}
    mbs = run.scalars("skrull/rank_micro_batches")
    plans = _plans(run)
    got["expected_all_gathers"] = []
    for k in range(len(mbs)):
        p = plans[k + 1]
        with_dist = {m for d, m, c in zip(p["plan_dp_rank"], p["plan_micro_batch"], p["plan_cp_rank"])
                     if d == p["dp_rank"] and c == -1}
        layers = got["calls"][k] / mbs[k]
        got["expected_all_gathers"].append(layers * len(with_dist))
    return got


def _exchanged_once(run, plain, label: str) -> None:
    """``run`` (under AC) exchanged exactly what ``plain`` (same job, no AC) did:
    its recomputations replayed the forward's K/V instead of gathering again,
    and every dK/dV reduce-scatter was still issued."""
    plain, got = _exchange_counts(plain), _exchange_counts(run)
    print(f"per step, rank 0, without AC: {plain}\n{label}: {got}")
    for c in (plain, got):
        assert c["all_gathers"] == c["expected_all_gathers"] == c["reduce_scatters"], c
        assert c["fwd_bytes"] == c["bwd_bytes"], c
        assert sum(c["all_gathers"]) > 0, c
    assert plain["recomputes"] == plain["replays"] == [0] * len(plain["calls"])
    assert got["recomputes"] == got["calls"], "AC re-runs every layer's attention once"
    assert got["replays"] == got["all_gathers"], "a recomputation gathered again"


@pytest.mark.slow
@pytest.mark.parametrize("ac", ["full", "selective"])
def test_parity_skrull_cp2_activation_checkpointing(skrull_runs, reference, ac):
    """The recomputed forward re-runs the DACP attention inside backward;
    losses and gradients stay those of the reference. The recomputation
    reuses the forward's gathered K/V instead of gathering again: per step
    as many all-gathers and K/V bytes as without AC (one all-gather per layer
    per micro-batch with distributed sequences). Full AC runs the segments
    kernel, selective AC the tiles (conftest)."""
    run = skrull_runs["cp2_segments_ac_full" if ac == "full" else "cp2_tiles_ac_selective"]
    assert f"Applied {'FullAC' if ac == 'full' else 'SelectiveAC'} activation checkpointing" in run.output
    _matches_reference(run, reference, short=True)
    _exchanged_once(run, skrull_runs["cp2"], f"{ac} AC")


@pytest.mark.slow
def test_parity_skrull_dp2_cp2_fsdp_activation_checkpointing(skrull_runs, reference):
    """FSDP (its parameter all-gathers re-issued in the recomputation) with
    full AC and the DACP exchange replayed: same losses and gradients
    (test_parity_skrull_dp2_cp2), the exchange counts the plan asks for, as
    without AC (the cp2 run's)."""
    run = skrull_runs["dp2cp2"]
    assert "Applied FullAC activation checkpointing" in run.output
    _exchanged_once(run, skrull_runs["cp2"], "FSDP + full AC")


@pytest.mark.slow
def test_lockstep_runs_the_plans_count_on_every_rank(skrull_runs):
    """Without free_running (the ``dp2cp2`` job, FSDP over DP x CP: lockstep) every rank
    runs the plan's micro-batch count, a DP rank with fewer running pad passes (the
    loader's side of it, with plans that give the ranks unequal counts, is
    tests/unit_tests/test_free_running.py; the lockstep planner may equalise the counts
    of this data, so pads need not occur here). Free-running: test_free_running.py."""
    run, world = skrull_runs["dp2cp2"], 4
    assert "timeline lockstep" in run.output
    assert run.scalars("skrull/free_running_bytes") == [0.0] * STEPS
    passes = forward_passes(skrull_runs.passes_folder("dp2cp2"), world)
    padded = 0
    for rank in range(world):
        plans = _plans(run, rank)
        for s in range(1, STEPS + 1):
            record = plans[s]
            assert passes[rank][s] == record["micro_batches"], (rank, s, passes[rank][s], record["micro_batches"])
            padded += record["micro_batches"] - own_counts(record).get(record["dp_rank"], 0)
    print(f"forward passes per world rank: {passes}; pad passes in all: {padded}")


@pytest.mark.slow
def test_parity_two_schedules_same_gradients(skrull_runs, reference):
    """cp2 (skrull) against the tiles run (worstfit, conftest) at step 2, the tiles run's last."""
    a, b = skrull_runs["cp2"], skrull_runs["cp2_tiles_ac_selective"]
    assert "policy worstfit," in b.output
    pa, pb = _plans(a)[POOL_SUB_STEP], _plans(b)[POOL_SUB_STEP]
    assert pa["samples"] == pb["samples"] and pa["lengths"] == pb["lengths"]
    assert pa["plan_digest"] != pb["plan_digest"], "the two policies scheduled step 2 identically"
    _check_exact_and_mixed(b, POOL_SUB_STEP)
    worst, rel = assert_same_grads(b.grads, a.step_grads[POOL_SUB_STEP], **GRAD)
    print(f"skrull vs worstfit, step {POOL_SUB_STEP} gradients: max |diff| {worst:.3g}, relative norm {rel:.3g}")
    _matches_reference(b, reference, short=True)
