"""Look-ahead in training (``[skrull] lookahead``): DP 2 x CP 1 over gloo, W = 4.

A run killed inside a window and resumed trains exactly what the
uninterrupted run trains: the run saves a checkpoint at step 2 (inside window
0, steps 1..4); a second run resumes from a copy of it and must train steps
3..5 with the same samples, plans, buffers and losses, bitwise on CPU.
Across windows every sample of the window's global batches is trained once,
and the log says what each window did. The run's 5 steps stop inside window 1
(steps 5..8): it warns at start-up, and every launch's summary counts exactly
what the plan logs show trained (exactly_once.py), resumed with the same width
and with another. Resumed with another ``dataloader.seed`` it stops at load in
one line (data/steps/data_order.py).
"""

import os
import pickle
import re
import shutil

import pytest

from skrull_ext.train.plan_log import read_plan_log
from tests.integration_tests.conftest import SKRULL
from tests.integration_tests.exactly_once import check_exactly_once, trained
from tests.integration_tests.launch import torchrun, train_from_seed

W, STEPS, RESUME_AT, GBS = 4, 5, 2, 8
EXTRA = ["--skrull.lookahead", str(W), "--skrull.plan_log"]


@pytest.mark.slow
def test_resume_inside_a_window_replays_the_uninterrupted_run(workdir, seed):
    full = train_from_seed(workdir, "dp2_lookahead", 2, "skrull_ext.train", SKRULL, seed, STEPS, extra=EXTRA,
                           save_every=RESUME_AT)
    assert len(full.losses) == STEPS
    ckpt = os.path.join(full.dump, "checkpoint", f"step-{RESUME_AT}")
    assert os.path.isdir(ckpt), f"the uninterrupted run saved no step-{RESUME_AT} checkpoint"
    shutil.copytree(ckpt, os.path.join(workdir, "dp2_lookahead_resumed", "checkpoint", f"step-{RESUME_AT}"))
    resumed = train_from_seed(workdir, "dp2_lookahead_resumed", 2, "skrull_ext.train", SKRULL, seed, STEPS,
                              extra=EXTRA)
    assert f"Training starts at step {RESUME_AT + 1}" in resumed.output
    assert "records no data order" not in resumed.output  # the checkpoint says what data it read: checked
    assert resumed.losses == full.losses[RESUME_AT:], f"{resumed.losses} vs {full.losses[RESUME_AT:]}"

    for rank in range(2):
        name = os.path.join("skrull_plans", f"rank{rank}.jsonl")
        a, b = read_plan_log(os.path.join(full.dump, name)), read_plan_log(os.path.join(resumed.dump, name))
        assert sorted(b) == list(range(RESUME_AT + 1, STEPS + 1))
        for step in b:
            assert b[step] == a[step], f"rank {rank} step {step}: resumed {b[step]} vs {a[step]}"
    # Window 0 (steps 1..4) trains the samples of global batches 1..4 (8 each, in read order), each
    # once, every step 8 of them; with look-ahead some are trained at another step than they arrived in.
    plans = read_plan_log(os.path.join(full.dump, "skrull_plans", "rank0.jsonl"))
    window = [plans[s]["samples"] for s in range(1, W + 1)]
    assert [len(s) for s in window] == [GBS] * W
    assert sorted(i for s in window for i in s) == list(range(W * GBS))
    moved = full.scalars("skrull/lookahead_moved")
    assert len(moved) == STEPS and len(set(moved[:W])) == 1
    assert moved[0] == sum(i // GBS != s for s, samples in enumerate(window) for i in samples)
    assert "look-ahead window 0: " in full.output and "look-ahead window 1: " in full.output
    # 5 steps stop inside window 1 (steps 5..8): said once at start-up, naming the 24 samples of steps
    # 6..8 it leaves, and again in the summary; the counts are what the plan log shows trained.
    assert full.output.count("training.steps 5 ends inside look-ahead window 1 (steps 5..8, skrull.lookahead 4): "
                             "the 24 samples the window regroups onto steps 6..8 will not be trained: ") == 1
    assert "training.steps 5 ended inside look-ahead window 1 (steps 5..8): 24 samples" in full.output
    check_exactly_once(trained(full.dump, range(1, STEPS + 1)), full.output, read_to=8, left=24)
    # Resumed at step 2 with the same width: the summary (every launch) counts steps 1..2 and 3..5 once.
    before = trained(full.dump, range(1, RESUME_AT + 1))
    check_exactly_once(before + trained(resumed.dump, range(RESUME_AT + 1, STEPS + 1)), resumed.output,
                       read_to=8, left=24)

    # The same checkpoint continued with another dataloader.seed (it orders the samples: window 0's steps 3..4
    # would train other samples, some a second time, and never some it read): refused at load, in one line
    # (data/steps/data_order.py; before, it trained on without a word).
    dump = os.path.join(workdir, "dp2_lookahead_seed")
    shutil.copytree(ckpt, os.path.join(dump, "checkpoint", f"step-{RESUME_AT}"))
    proc = torchrun(2, "skrull_ext.train", [*SKRULL, *EXTRA, "--dump_folder", dump, "--training.steps", str(STEPS),
                                            "--checkpoint.enable", "--checkpoint.load_only", "--dataloader.seed", "1"],
                    cwd=workdir, expect_failure=True, real=False)
    out = proc.stdout + proc.stderr
    assert ("error: dataloader.seed = 1: the checkpoint of step 2 was written with dataloader.seed = 0, and a loader's "
            "state (the samples read, look-ahead windows, epoch order) only fits the data order it was written with, so "
            "continuing would train some samples twice and others never; continue with --dataloader.seed 0, or train "
            "on from its weights in a new run (another dump_folder) with --checkpoint.initial_load_path "
            f"{os.path.join(dump, 'checkpoint', 'step-2')} --checkpoint.initial_load_model_only\n") in out, out[-3000:]
    assert "Training starts" not in out

    # The same checkpoint continued with lookahead = "auto": it prices the run's first global batches
    # in windows of the widths within the run (2 and 4 of its 5 steps),
    # says what it chose, finishes window 0 (steps 3..4) as begun and trains windows of its choice after.
    # Its copy is made as a checkpoint written before dataloader.data_order existed: it loads, and says once
    # that its data could not be checked (DCP had failed on the key the loader asked for).
    copy = os.path.join(workdir, "dp2_lookahead_auto", "checkpoint", f"step-{RESUME_AT}")
    shutil.copytree(ckpt, copy)
    _without_data_order(copy)
    auto = train_from_seed(workdir, "dp2_lookahead_auto", 2, "skrull_ext.train", SKRULL, seed, STEPS,
                           extra=["--skrull.lookahead", "auto", "--skrull.plan_log"])
    assert auto.output.count(f"dataloader: the checkpoint of step {RESUME_AT} records no data order (written before "
                             "dataloader.data_order was saved), so this run cannot check") == 1, auto.output[-3000:]
    chosen = re.search(r"skrull\.lookahead auto: (\d+) \(.*\)\. Predicted over no look-ahead on the samples of "
                       r"steps 1\.\.8 by the job's cost model: W 2 x[\d.]+, W 4 x[\d.]+ \(best", auto.output)
    assert chosen, auto.output[-3000:]
    width = int(chosen.group(1))
    if width != W:
        assert (f"skrull.lookahead {width}: the checkpoint of step {RESUME_AT} has look-ahead windows of {W} steps "
                f"from step 1; this run goes on with windows of {W} steps from step 1, of {width} from step {W + 1}"
                in auto.output)
    got = read_plan_log(os.path.join(auto.dump, "skrull_plans", "rank0.jsonl"))
    assert [got[s] for s in range(RESUME_AT + 1, W + 1)] == [plans[s] for s in range(RESUME_AT + 1, W + 1)]
    # Step 5 opens a window of the chosen width: its samples come from global batches 5..4+width.
    assert len(got[W + 1]["samples"]) == GBS
    assert all(W * GBS <= i < (W + width) * GBS for i in got[W + 1]["samples"])
    # Resumed with another width: still every sample once, the summary what the plan logs trained.
    check_exactly_once(before + trained(auto.dump, range(RESUME_AT + 1, STEPS + 1)), auto.output,
                       read_to=W + width, left=(width - 1) * GBS)


def _without_data_order(folder: str) -> None:
    """The DCP checkpoint at ``folder`` as a version before ``dataloader.data_order`` wrote it: its
    metadata without the key (the value's bytes stay in the shard file, unread)."""
    path = os.path.join(folder, ".metadata")
    with open(path, "rb") as f:
        meta = pickle.load(f)
    del meta.state_dict_metadata["dataloader.data_order"]
    meta.storage_data = {k: v for k, v in meta.storage_data.items() if k.fqn != "dataloader.data_order"}
    with open(path, "wb") as f:
        pickle.dump(meta, f)
