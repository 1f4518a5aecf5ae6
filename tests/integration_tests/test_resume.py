"""Resume: a run restarted from its step-4 checkpoint (torchtitan's
checkpointer: model, optimizer, LR schedule, train state and the Skrull
dataloader's state_dict) trains step 5 exactly as the uninterrupted run
did: same samples, same plans, same buffers, same losses; across the two
runs every sample of steps 1..5 is used once, none repeated, none lost.

The uninterrupted run is the CP=2 parity run, which saves a full checkpoint
every 2 steps. The restarted run gets a copy of its step-4 checkpoint in its
own checkpoint folder, exactly what a job preempted after step 4 finds there,
and takes torchtitan's fault-tolerance path (resume from the folder's latest
step; the seed path on the command line is then ignored by design). The last
saved step before the end: one step after the resume is what the claim needs,
and each step more was ~1.3 s of CPU in each of the two resumed runs.

Both runs build steps ahead (``dataloader.prefetch_steps`` 2, the default):
when step 4's checkpoint is saved the thread has built (or is building)
step 5, and the checkpoint holds the state after step 4 all the same.
"""

import os
import re
import shutil

import pytest

from skrull_ext.train.plan_log import read_plan_log
from tests.integration_tests.conftest import SKRULL, STEPS, SkrullRuns
from tests.integration_tests.launch import train_from_seed

RESUME_AT = 4


@pytest.mark.slow
def test_resume_replays_the_uninterrupted_run(skrull_runs, workdir, seed):
    full = skrull_runs["cp2"]
    ckpt = os.path.join(full.dump, "checkpoint", f"step-{RESUME_AT}")
    assert os.path.isdir(ckpt), f"the uninterrupted run saved no step-{RESUME_AT} checkpoint"
    resumed_dump = os.path.join(workdir, "cp2_resumed")
    shutil.copytree(ckpt, os.path.join(resumed_dump, "checkpoint", f"step-{RESUME_AT}"))

    nproc, extra = SkrullRuns.SHAPES["cp2"]
    resumed = train_from_seed(workdir, "cp2_resumed", nproc, "skrull_ext.train", SKRULL, seed, STEPS,
                              extra=[*extra, "--skrull.plan_log"])
    assert f"Training starts at step {RESUME_AT + 1}" in resumed.output

    got, want = resumed.losses, full.losses[RESUME_AT:]
    print(f"uninterrupted steps {RESUME_AT + 1}..{STEPS}: {want}\nresumed:              {got}")
    assert len(got) == STEPS - RESUME_AT
    assert max(abs(a - b) for a, b in zip(got, want)) < 1e-6, f"{got} vs {want}"

    for rank in range(nproc):
        name = os.path.join("skrull_plans", f"rank{rank}.jsonl")
        a = read_plan_log(os.path.join(full.dump, name))
        b = read_plan_log(os.path.join(resumed.dump, name))
        assert sorted(b) == list(range(RESUME_AT + 1, STEPS + 1)), sorted(b)
        for step in b:
            assert b[step] == a[step], f"rank {rank} step {step}: resumed {b[step]} vs {a[step]}"
        used = [i for s in range(1, RESUME_AT + 1) for i in a[s]["samples"]]
        used += [i for s in b for i in b[s]["samples"]]
        assert sorted(used) == list(range(len(used))), "samples repeated or lost across the resume"


@pytest.mark.slow
def test_the_trainer_logs_how_long_it_waited_for_data(skrull_runs):
    """The cp2 run (default dataloader.prefetch_steps 2): per step, the time the
    training loop waited for its step (console line and skrull/data_wait_ms)
    and the step's build time (skrull/data_build_ms); the median in the run summary."""
    full = skrull_runs["cp2"]
    waits, builds = full.scalars("skrull/data_wait_ms"), full.scalars("skrull/data_build_ms")
    assert len(waits) == len(builds) == STEPS and all(w >= 0 for w in waits) and all(b > 0 for b in builds)
    for step in range(1, STEPS + 1):
        assert re.search(rf"skrull step {step}: .*, data wait \d+\.\d ms\n", full.output), step
    assert re.search(r"Run summary: .*; data wait per step this launch: median \d+\.\d\d ms, max \d+\.\d\d ms over "
                     rf"{STEPS - 1} steps after the first \(dataloader.prefetch_steps 2; first step", full.output)


@pytest.mark.slow
def test_a_skrull_checkpoint_continues_under_torchtitans_batching(skrull_runs, workdir, seed):
    """The cp2 run's step-4 checkpoint continued with ``--skrull.no-enable``:
    the same samples and nearly the same losses (both batchings train the same
    global batches; the parity tests hold each to the 1-process reference).
    Was: 'Missing key in checkpoint state_dict: dataloader.carry'."""
    full = skrull_runs["cp2"]
    ckpt = os.path.join(full.dump, "checkpoint", f"step-{RESUME_AT}")
    dump = os.path.join(workdir, "cp2_resumed_torchtitan_batching")
    shutil.copytree(ckpt, os.path.join(dump, "checkpoint", f"step-{RESUME_AT}"))
    nproc, extra = SkrullRuns.SHAPES["cp2"]
    resumed = train_from_seed(workdir, "cp2_resumed_torchtitan_batching", nproc, "skrull_ext.train", SKRULL, seed,
                              STEPS, extra=[*extra, "--skrull.no-enable"])
    assert f"Training starts at step {RESUME_AT + 1}" in resumed.output
    got, want = resumed.losses, full.losses[RESUME_AT:]
    print(f"Skrull batching steps {RESUME_AT + 1}..{STEPS}: {want}\ntorchtitan's batching after the resume: {got}")
    assert len(got) == STEPS - RESUME_AT and max(abs(a - b) for a, b in zip(got, want)) < 1e-4, f"{got} vs {want}"
