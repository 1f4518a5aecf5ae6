"""Weighted mixtures in a run (issue 27, ``test_mixture_*``), 2 processes (DP 2).

The shipped text job with ``dataset = "mixture"``: tiny_sft.jsonl ("chat",
weight 3) and tests/fixtures/accounting.jsonl ("notes", weight 1, 8
records, so 1.25 epochs of it, the second begun at step 5), from the session's
seed checkpoint. 5 steps of 8 samples, a full checkpoint at step 3; a second run
continues from a copy of it.

- per-source counts: the run's totals are 30 chat and 10 notes samples, the
  weights' 3:1 within TOLERANCE, and what the mixture's draw says in-process;
- per-source accounting adds up: read = whole + cut + skipped per source, the
  sources' reads sum to the run's, in the summary and in TensorBoard per step;
- the continued run logs bitwise the uninterrupted run's losses of steps 4..5
  and ends with the same per-source summary;
- the head in chunks at DP 2 and at DP 2 x TP 2 (each continuing from another
  copy of the step-3 checkpoint) runs free where step 5's plan gives the DP
  ranks 1 and 2 micro-batches, with the uninterrupted run's losses of steps
  4..5 (the head in one chunk). A LoRA head in chunks at
  DP 2, free-running beside a rank with no micro-batch:
  tests/integration_tests/test_chunk_dp_run.py.
"""

import os
import re
import shutil

import pytest

from skrull_ext.data.steps.base import DATASETS
from skrull_ext.train.job.job_file import load_job
from skrull_ext.train.plan_log import read_plan_log
from tests.integration_tests.launch import REPO, Run, torchrun

TEXT = os.path.join(REPO, "skrull_ext", "jobs", "debug_cpu_text.toml")
NOTES = os.path.join(REPO, "tests", "fixtures", "accounting.jsonl")
STEPS, SAVE_AT, BATCH = 5, 3, 8
UNEQUAL_STEP = STEPS
"""The step whose plan gives the DP ranks 1 and 2 micro-batches, free-running: the last (a run of other
steps would change the learning rate's schedule, and the losses after its first steps)."""
WEIGHTS = {"chat": 3, "notes": 1}
TOLERANCE = 1
"""Samples a source's run total may be from ``read * weight`` (the draw's bound, test_mixture.py)."""
SOURCES = f"""
[[dataloader.sources]]
name = "chat"
path = "tiny_sft"
weight = {WEIGHTS["chat"]}

[[dataloader.sources]]
name = "notes"
path = "{NOTES}"
weight = {WEIGHTS["notes"]}
"""


def _job(workdir: str) -> str:
    with open(TEXT) as f:
        text = f.read()
    text = re.sub(r'dataset = "jsonl"\ndataset_path = [^\n]*\n', 'dataset = "mixture"\n', text)
    text = text.replace('cost_model = "../../profiles/', f'cost_model = "{REPO}/profiles/')
    path = os.path.join(workdir, "mixture.toml")
    with open(path, "w") as f:
        f.write(text + SOURCES)
    return path


def _launch(workdir: str, job: str, name: str, seed: str) -> Run:
    dump = os.path.join(workdir, name)
    proc = torchrun(2, "skrull_ext.train", [
        "--config-file", job, "--dump_folder", dump, "--training.steps", str(STEPS), "--metrics.enable_tensorboard",
        "--checkpoint.enable", "--checkpoint.interval", str(SAVE_AT), "--checkpoint.initial_load_path", seed],
        cwd=workdir)
    return Run(dump=dump, output=proc.stdout + proc.stderr, grads=None)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, seed) -> dict:
    """The uninterrupted run and its continuation, from the session's seed checkpoint (the same debug
    llama3), so that runs of other layouts (TP) start from its weights too and compare with its losses."""
    workdir = str(tmp_path_factory.mktemp("mixture"))
    job = _job(workdir)
    full = _launch(workdir, job, "full", seed)
    ckpt = os.path.join(full.dump, "checkpoint", f"step-{SAVE_AT}")
    shutil.copytree(ckpt, os.path.join(workdir, "resumed", "checkpoint", f"step-{SAVE_AT}"))
    return {"job": job, "seed": seed, "full": full, "resumed": _launch(workdir, job, "resumed", seed)}


def _from_step(runs: dict, dump: str) -> list[str]:
    """The flags of a run that continues from a copy of the full run's step-SAVE_AT checkpoint (the resumed run's
    start: test_mixture_resume_is_bitwise holds it to the uninterrupted run), saving nothing (load_only): it
    trains steps SAVE_AT + 1..STEPS, the last of them UNEQUAL_STEP, where the full run's schedule has them."""
    shutil.copytree(os.path.join(runs["full"].dump, "checkpoint", f"step-{SAVE_AT}"),
                    os.path.join(dump, "checkpoint", f"step-{SAVE_AT}"))
    return ["--checkpoint.enable", "--checkpoint.load_only"]


def _per_source(output: str) -> dict[str, tuple[int, int, int, int]]:
    """(read, whole, cut, skipped) per source from the run summary."""
    line = re.findall(r"Run summary: .*", output)[-1]
    return {m[0]: tuple(map(int, m[1:])) for m in
            re.findall(r"(\w+) read (\d+) = (\d+) whole \+ (\d+) cut \+ (\d+) skipped", line)}


@pytest.mark.slow
def test_mixture_counts_follow_the_weights(runs):
    full = runs["full"]
    got = {name: int(full.scalars(f"skrull/source/{name}/samples_read_total")[-1]) for name in WEIGHTS}
    read = STEPS * BATCH
    print(f"per-source samples over {read}: {got} (weights {WEIGHTS})")
    assert sum(got.values()) == read
    for name, w in WEIGHTS.items():
        assert abs(got[name] - read * w / sum(WEIGHTS.values())) <= TOLERANCE, (name, got)
    config = load_job(runs["job"]).dataloader
    mixture = DATASETS["mixture"](config, load_job(runs["job"]).tokenizer.build(tokenizer_path=""))
    drawn = [mixture.source_name(i) for i in range(read)]
    assert got == {name: drawn.count(name) for name in WEIGHTS}


@pytest.mark.slow
def test_mixture_accounting_adds_up(runs):
    full = runs["full"]
    summary = _per_source(full.output)
    assert set(summary) == set(WEIGHTS)
    for name, (read, whole, cut, skipped) in summary.items():
        assert read == whole + cut + skipped, (name, summary[name])
        assert read == full.scalars(f"skrull/source/{name}/samples_read_total")[-1]
    total = re.findall(r"Run summary: samples read (\d+) = trained whole (\d+) \+ trained cut (\d+)", full.output)[-1]
    assert sum(s[0] for s in summary.values()) == int(total[0]) == STEPS * BATCH
    assert sum(s[1] for s in summary.values()) == int(total[1])
    assert sum(s[2] for s in summary.values()) == int(total[2])
    per_step = [sum(v) for v in zip(*(full.scalars(f"skrull/source/{n}/samples_read") for n in WEIGHTS))]
    assert per_step == full.scalars("skrull/samples_read") == [float(BATCH)] * STEPS


@pytest.mark.slow
def test_mixture_resume_is_bitwise(runs):
    full, resumed = runs["full"], runs["resumed"]
    assert f"Training starts at step {SAVE_AT + 1}" in resumed.output
    want, got = full.losses[SAVE_AT:], resumed.losses
    print(f"uninterrupted steps {SAVE_AT + 1}..{STEPS}: {want}\nresumed: {got}")
    assert got == want
    assert _per_source(resumed.output) == _per_source(full.output)


@pytest.mark.slow
def test_head_in_chunks_runs_free_at_dp2_with_the_same_losses(runs, tmp_path):
    """The head in 4 chunks a micro-batch (``--loss.chunk_tokens 64``) at DP 2, free-running, where
    step 5 gives the ranks 1 and 2 micro-batches (checked in the plan log; the run stops there): the
    head module runs in the model's forward and its weight per chunk (head_loss.py ``pass_head_through``);
    called from the loss instead, its FSDP unit's hooks ran out of step and gloo aborted on mismatched
    reduce-scatters at step 5. The losses of steps 4..5 are the uninterrupted run's (the head in one chunk)
    to float rounding; the run continues from its step-3 checkpoint (steps 1..3 train no step the check needs)."""
    run = _run(tmp_path, "chunks", ["--config-file", runs["job"], "--loss.chunk_tokens", "64", "--skrull.plan_log"],
               runs)
    assert "4 chunks for the largest micro-batch (256 tokens: the job's BucketSize)" in run.output
    assert "the head module runs in the model's forward, its weight applied per chunk" in run.output
    assert "head backward: in_forward (loss.head_backward auto" in run.output  # train/head_grad.py's chunks
    assert "Skrull execution: skrull.free_running = 'auto': free-running" in run.output
    _uneven_at_the_last_step(run)
    _same_losses(run, runs["full"].losses)


def _run(tmp_path, name: str, args: list[str], runs: dict, nproc: int = 2) -> Run:
    """A run of ``args`` continuing from the full run's step-SAVE_AT checkpoint (``_from_step``)."""
    dump = str(tmp_path / name)
    proc = torchrun(nproc, "skrull_ext.train", [*args, *_from_step(runs, dump), "--dump_folder", dump,
                                                "--training.steps", str(STEPS), "--metrics.enable_tensorboard"],
                    cwd=str(tmp_path))
    assert f"Training starts at step {SAVE_AT + 1}" in proc.stdout, proc.stdout[-3000:]
    return Run(dump=dump, output=proc.stdout + proc.stderr, grads=None)


def _uneven_at_the_last_step(run: Run) -> None:
    """The run's plan log gives the DP ranks 1 and 2 micro-batches at UNEQUAL_STEP, where it stopped."""
    plan = read_plan_log(os.path.join(run.dump, "skrull_plans", "rank0.jsonl"))[UNEQUAL_STEP]
    counts = sorted(len({m for m, d in zip(plan["plan_micro_batch"], plan["plan_dp_rank"]) if d == rank})
                    for rank in (0, 1))
    assert counts == [1, 2], f"step {UNEQUAL_STEP}'s plan no longer gives the DP ranks 1 and 2 micro-batches: {counts}"


def _same_losses(run: Run, full: list[float]) -> None:
    """The run's losses (steps SAVE_AT + 1..STEPS) are the full run's of those steps to float rounding."""
    got, want = run.losses, full[SAVE_AT:]
    print(f"losses {got}\nwant   {want}")
    assert len(full) == STEPS and len(got) == len(want) == STEPS - SAVE_AT
    assert all(abs(a - b) <= 1e-4 * abs(b) for a, b in zip(got, want)), (got, want)


@pytest.mark.slow
def test_tp_head_in_chunks_runs_free_at_dp2_tp2_with_the_same_losses(runs, tmp_path):
    """The head in 4 chunks a micro-batch at DP 2 x TP 2 (4 processes), free-running, step 5 again giving
    the DP ranks 1 and 2 micro-batches (the plan log's plan_dp_rank / plan_micro_batch, checked; the run
    stops there): under TP the head module passes the Replicate hidden states through too, and each
    chunk's linear of them and the Shard(0) weight gives the Shard(-1) logits loss_parallel takes
    (head_loss.py pass_head_through).
    The losses of steps 4..5 are those of the uninterrupted DP 2 run (no TP, the head in one chunk, in the
    model's forward), to float rounding, continuing from its step-3 checkpoint (DP 2's shards read into
    DP 2 x TP 2's). (TP's head in one chunk, in the model's
    forward: test_parity_tp.py's dp2tp2 run, held to the 1-process reference.)"""
    tp = ["--config-file", runs["job"], "--parallelism.data_parallel_shard_degree", "2",
          "--parallelism.tensor_parallel_degree", "2", "--skrull.plan_log"]
    assert "one chunk holds a micro-batch, so the head runs in the model's forward" in runs["full"].output
    run = _run(tmp_path, "tp_head_chunks", [*tp, "--loss.chunk_tokens", "64"], runs, nproc=4)
    assert "DP 2 x CP 1 x TP 2" in run.output
    assert "the head module runs in the model's forward, its weight applied per chunk" in run.output
    assert "Skrull execution: skrull.free_running = 'auto': free-running" in run.output
    _uneven_at_the_last_step(run)
    _same_losses(run, runs["full"].losses)
