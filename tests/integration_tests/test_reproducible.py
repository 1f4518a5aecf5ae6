"""Reproducible by default, and a finished run continues.

The shipped CPU job seeds everything (``[debug] seed``: the model init and
every RNG; ``[dataloader] seed``: the sample order), so the job launched
twice (CP=2 over gloo, 2 processes, no seed checkpoint) gives the same losses
bit for bit.

A run that finished at step N continues to N+M when launched again in the
same folder with ``--training.steps N+M``: the last checkpoint keeps the
full training state (the product's default, ``last_save_model_only =
false``), and the continued run's losses equal those of a run that trained
N+M steps without stopping, bit for bit. The LR schedule is decoupled from
``training.steps`` with ``lr_scheduler.total_steps`` (torchtitan's option),
otherwise a longer run would have decayed the learning rate differently
from step 2 on (docs/training.md, "Continuing a finished run").
"""

import glob
import os
import shutil

import pytest

from tests.integration_tests.launch import LOSS_TAG, REPO, Run, torchrun

JOB = os.path.join(REPO, "skrull_ext", "jobs", "debug_cpu.toml")
N, M = 2, 1
"""The finished run stops at step N (2: its step 2 is where a schedule decayed over N steps would
differ from one over N + M) and continues M steps (1: one step after the resume)."""


def _train(dump: str, steps: int, *extra: str) -> Run:
    proc = torchrun(2, "skrull_ext.train", [
        "--config-file", JOB, "--dump_folder", dump, "--training.steps", str(steps),
        "--parallelism.context_parallel_degree", "2", "--metrics.enable_tensorboard", *extra,
    ], cwd=os.path.dirname(dump))
    return Run(dump=dump, output=proc.stdout + proc.stderr, grads=None)


def losses_by_step(dump: str) -> dict[int, float]:
    """Every loss logged under ``dump``, by step, over all its TensorBoard runs
    (one folder per launch)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[int, float] = {}
    for folder in sorted(glob.glob(os.path.join(dump, "tb", "*"))):
        acc = EventAccumulator(folder, size_guidance={"scalars": 0})
        acc.Reload()
        for e in acc.Scalars(LOSS_TAG):
            assert e.step not in out, f"step {e.step} logged twice under {dump}"
            out[e.step] = e.value
    return out


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("repro"))


@pytest.fixture(scope="module")
def uninterrupted(work) -> Run:
    """The shipped job as a user launches it, N+M steps."""
    return _train(os.path.join(work, "full"), N + M)


@pytest.fixture(scope="module")
def finished(work) -> tuple[Run, list[float]]:
    """The same job launched again, from scratch, to step N with its checkpoint on and the LR
    schedule of N + M steps (neither changes a step's arithmetic): the finished run that
    test_finished_run_continues_as_if_never_stopped continues, and its losses, read before the
    continuation logs more under the same folder."""
    dump = os.path.join(work, "continued")
    first = _train(dump, N, "--checkpoint.enable", "--lr_scheduler.total_steps", str(N + M))
    return first, first.losses


@pytest.mark.slow
def test_the_job_launched_twice_gives_bitwise_equal_losses(uninterrupted, finished):
    """The second launch is the finished run's (from the job's seeds, to step N): its losses
    equal the first launch's bit for bit. Steps N + 1.. of a second launch are the continued
    run's, bitwise the first's too (test_finished_run_continues_as_if_never_stopped), so the
    N + M steps launched a third time were not needed."""
    a, b = uninterrupted.losses, finished[1]
    print(f"first launch {a}\nsecond launch {b}")
    assert len(a) == N + M and len(b) == N
    assert [x.hex() for x in a[:N]] == [x.hex() for x in b], f"{a[:N]} vs {b}"


@pytest.mark.slow
def test_finished_run_continues_as_if_never_stopped(work, uninterrupted, finished):
    dump = os.path.join(work, "continued")
    first = finished[0]
    assert os.path.isdir(os.path.join(dump, "checkpoint", f"step-{N}")), "the finished run saved no last checkpoint"
    assert "Saving a full checkpoint at last step" in first.output
    assert sorted(losses_by_step(dump)) == list(range(1, N + 1))
    more = _train(dump, N + M, "--checkpoint.enable")
    assert f"Training starts at step {N + 1}" in more.output, more.output[-3000:]
    got = losses_by_step(dump)
    assert sorted(got) == list(range(1, N + M + 1)), sorted(got)
    got = [got[step] for step in sorted(got)]
    want = uninterrupted.losses
    print(f"uninterrupted {want}\nfirst {N} steps, then continued to {N + M}: {got}")
    assert [x.hex() for x in got] == [x.hex() for x in want], f"{got} vs {want}"


STREAM = ("--skrull.no-enable", "--dataloader.packing", "stream", "--training.local_batch_size", "1")


@pytest.mark.slow
def test_stream_packed_run_continues_mid_sample(work):
    """torchtitan's batching with 'stream' packing carries a cut sample into the
    next step; a run continued from a checkpoint saved there equals one that never
    stopped (the carry is in the checkpoint). The uninterrupted run saves that
    checkpoint itself (at step N of N+M): the continued run starts from a copy of
    it in a folder of its own, so two launches check what three did."""
    full = os.path.join(work, "stream-full")
    want = _train(full, N + M, *STREAM, "--checkpoint.enable", "--checkpoint.interval", str(N)).losses
    dump = os.path.join(work, "stream-continued")
    shutil.copytree(os.path.join(full, "checkpoint", f"step-{N}"), os.path.join(dump, "checkpoint", f"step-{N}"))
    more = _train(dump, N + M, *STREAM, "--checkpoint.enable")
    assert f"Training starts at step {N + 1}" in more.output, more.output[-3000:]
    got = losses_by_step(dump)
    assert sorted(got) == list(range(N + 1, N + M + 1)), sorted(got)
    got = [got[step] for step in sorted(got)]
    print(f"stream: uninterrupted {want}\ncontinued from step {N}: {got}")
    assert len(want) == N + M and [x.hex() for x in got] == [x.hex() for x in want[N:]], f"{got} vs {want}"
