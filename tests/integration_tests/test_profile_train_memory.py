"""The CPU profiles' BucketSize in real training runs (torchrun x2, gloo):
``skrull_ext.profile.train_check`` trains the debug job with a profile's
cost model and ``bucket_size = "profile"`` on data whose plans fill ranks to
BucketSize, meters every step on every rank, and exits 1 if a rank's peak
exceeds what the profile predicts for the tokens it held.

- The job as profiled at CP 1 (FSDP over 2 ranks, every sequence whole):
  within the prediction.
- CP 2 with the profile made at CP 2, one sequence sharded over both ranks
  so each holds BucketSize tokens of shards: within the prediction. (The
  CP 1 profile's BucketSize, 3268, measured ~1.1 GiB there against 1 GiB
  usable: a shard keeps the K/V gathered from the other rank and its dense
  CPU mask spans twice the keys; profile_memory.derive_bucket_size derives
  BucketSize for the job's CP degree.)
- The LoRA job (frozen base) with its own one-process profile, whose
  BucketSize is larger than full fine-tuning's: one sequence of exactly that
  many tokens on its one rank, the world the profile was made for, within the
  prediction (issue 15). (It ran on two ranks, one such sequence each: twice
  the CPU for the same per-rank claim; FSDP over two ranks and its sharded
  static account are the first two cases'.)
"""

import json
import os
import tomllib

import pytest
from tests.integration_tests.launch import REPO, torchrun

PROFILE = os.path.join(REPO, "profiles", "cpu-debug-gloo2.toml")
PROFILE_CP2 = os.path.join(REPO, "profiles", "cpu-debug-gloo2-cp2.toml")
JOB = ["--config-file", os.path.join(REPO, "skrull_ext", "jobs", "debug_cpu.toml")]
PROFILE_LORA = os.path.join(REPO, "profiles", "cpu-debug-lora-1proc.toml")
PROFILE_FULL_1PROC = os.path.join(REPO, "profiles", "cpu-debug-1proc.toml")
JOB_LORA = ["--config-file", os.path.join(REPO, "skrull_ext", "jobs", "debug_cpu_lora.toml")]


# A step at BucketSize measures most of its prediction (the fit is of these very tensors; the margin
# is 5%, 25% at CP 2): under half says the meter missed the peak. (torchtitan's metrics log reset
# it inside the step, and the verdicts read ~100 MiB of a ~900 MiB step until 2026-11-30.)


def _bucket(profile: str = PROFILE) -> int:
    with open(profile, "rb") as f:
        return tomllib.load(f)["memory"]["bucket_size"]


def _check(tmp_path, extra: list[str], profile: str = PROFILE, job: list[str] = JOB,
           nproc: int = 2) -> tuple[dict, str]:
    """Run the check on ``nproc`` ranks; return its JSON and console output (a run over budget exits 1)."""
    out = tmp_path / "memory_check.json"
    args = ["--profile", profile, *job, "--dump_folder", str(tmp_path / "dump"), "--out", str(out), *extra]
    try:
        proc = torchrun(nproc, "skrull_ext.profile.train_check", args, cwd=str(tmp_path))
        text = proc.stdout
    except AssertionError as e:  # exit 1: the JSON says which rank; no JSON: a real crash
        text = str(e)
    return json.loads(out.read_text()), text


@pytest.mark.slow
def test_bucket_size_holds_in_training(tmp_path):
    bucket = _bucket()
    # ShareGPT lengths / 3, cut at BucketSize, 4 per step, seed 17: at the shipped profile's
    # BucketSize (3696) step 1 fills both ranks to 3696 tokens. (Seeds 12 and 84 filled them at
    # the earlier BucketSizes, 3268 and 3644; a re-profile that moves BucketSize moves the seed.)
    # One step: step 1 is the filled one, and every assertion below reads it (step 2 held 2571
    # and 2870 tokens, its peak below its start: ~10 s of CI time for no check).
    d, text = _check(tmp_path, [
        "--training.steps", "1", "--training.seq_len", str(bucket),
        "--dataloader.length_scale", "3", "--dataloader.max_len", str(bucket),
        "--dataloader.global_batch_size", "4", "--dataloader.seed", "17",
        "--skrull.lookahead", "1",  # step 1 as drawn: a window would regroup the documents that fill it
    ])
    assert d["bucket_size"] == bucket and len(d["ranks"]) == 2
    for v in d["ranks"]:
        assert 0.95 * bucket <= v["buffer_tokens"] <= bucket, text  # the plans did fill the ranks
        assert 0.5 * v["predicted"] <= v["measured"] <= v["predicted"] <= v["usable"], text
    assert d["ok"] and f"BucketSize {bucket} in training: OK" in text, text


@pytest.mark.slow
def test_bucket_size_with_a_sharded_sequence(tmp_path):
    bucket = _bucket(PROFILE_CP2)
    assert bucket < _bucket()  # shards cost more than whole tokens
    # One sequence per step, as long as a shard can be: a sharded sequence is padded to a
    # multiple of 2 x CP, so the longest that fits is 2 x BucketSize rounded down to one.
    # DACP shards it, each rank holds half of it (BucketSize, or one token less).
    n = 2 * bucket - (2 * bucket) % 4
    d, text = _check(tmp_path, [
        "--parallelism.context_parallel_degree", "2", "--training.steps", "1",
        "--training.seq_len", str(n), "--dataloader.min_len", str(n),
        "--dataloader.max_len", str(n), "--dataloader.global_batch_size", "1",
    ], PROFILE_CP2)
    assert bucket - 1 <= n // 2 <= bucket
    assert all(v["buffer_tokens"] == n // 2 for v in d["ranks"]), text
    for v in d["ranks"]:
        assert 0.5 * v["predicted"] <= v["measured"] <= v["predicted"] <= v["usable"], text
    assert d["ok"], text


@pytest.mark.slow
def test_lora_bucket_size_holds_in_training(tmp_path):
    bucket = _bucket(PROFILE_LORA)
    assert bucket > _bucket(PROFILE_FULL_1PROC)  # same model and budget, full fine-tuning
    # One sequence of exactly BucketSize tokens, whole on the one rank the profile was made at.
    d, text = _check(tmp_path, [
        "--training.steps", "1", "--training.seq_len", str(bucket), "--dataloader.min_len", str(bucket),
        "--dataloader.max_len", str(bucket), "--dataloader.global_batch_size", "1",
    ], PROFILE_LORA, JOB_LORA, nproc=1)
    assert d["bucket_size"] == bucket and len(d["ranks"]) == 1
    assert all(v["buffer_tokens"] == bucket for v in d["ranks"]), text
    for v in d["ranks"]:
        assert 0.5 * v["predicted"] <= v["measured"] <= v["predicted"] <= v["usable"], text
    assert d["ok"], text
