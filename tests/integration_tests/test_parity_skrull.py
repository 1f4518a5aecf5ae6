"""Skrull-scheduled training matches torchtitan's own 1-process training.

From one seed checkpoint, float32, on the same global batches (the debug
job's synthetic data): torchtitan's Trainer in one process (rows packed as
torchtitan does) vs SkrullTrainer at CP=2 (2 processes) and DP=2 x CP=2
(4 processes), gloo. The Skrull runs split each global batch into planned
micro-batches with local and distributed sequences and DACP attention; the
loss is normalised by the global batch's loss tokens, so the 5 losses must
agree to float reassociation (|diff| < 1e-4) and go down.
"""

import os

import pytest

from tests.integration_tests.launch import scalars, seed_checkpoint, train_from_seed

TORCHTITAN = ["--module", "skrull_ext", "--config", "llama3_debugmodel_cpu"]
SKRULL = ["--config-file", os.path.join("skrull_ext", "jobs", "debug_cpu.toml")]
STEPS = 5


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    work = str(tmp_path_factory.mktemp("parity"))
    seed = seed_checkpoint(work, TORCHTITAN)
    ref = train_from_seed(work, "ref", 1, "torchtitan.train", TORCHTITAN, seed, STEPS)
    assert len(ref) == STEPS and ref[-1] < ref[0], f"reference loss did not decrease: {ref}"
    return work, seed, ref


def _skrull_run(reference, name, nproc, parallelism):
    work, seed, ref = reference
    from tests.integration_tests.launch import REPO

    config = [a if not a.endswith(".toml") else os.path.join(REPO, a) for a in SKRULL]
    got = train_from_seed(work, name, nproc, "skrull_ext.train", config, seed, STEPS, parallelism)
    dump = os.path.join(work, name)
    print(f"torchtitan 1-proc {ref}\nskrull {name:9s} {got}")
    assert len(got) == STEPS
    assert max(abs(a - b) for a, b in zip(ref, got)) < 1e-4, f"{ref} vs {got}"
    # The comparison is only meaningful if nothing was cut and both kinds of
    # sequences ran: some local, some distributed over the CP group.
    assert sum(scalars(dump, "skrull/truncated")) == 0
    assert sum(scalars(dump, "skrull/dropped")) == 0
    share = scalars(dump, "skrull/local_seq_share")
    assert all(s > 0 for s in share) and any(s < 1 for s in share), share
    assert sum(scalars(dump, "skrull/dacp_dist_seqs")) > 0
    assert sum(scalars(dump, "skrull/dacp_local_seqs")) > 0


@pytest.mark.slow
def test_parity_skrull_cp2(reference):
    _skrull_run(reference, "cp2", 2, ["--parallelism.context_parallel_degree", "2"])


@pytest.mark.slow
def test_parity_skrull_dp2_cp2(reference):
    _skrull_run(reference, "dp2cp2", 4, [
        "--parallelism.context_parallel_degree", "2",
        "--parallelism.data_parallel_shard_degree", "2",
    ])
