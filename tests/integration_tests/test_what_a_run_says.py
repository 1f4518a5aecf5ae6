"""What a one-process debug run says about itself, as a user types it (issue 50):
warnings only for the steps that train, a resumed run's summary telling this
launch's counts from the run's, and a finished run launched again saying that
nothing is left to train (exit status 0) instead of 'Training starts'.

Every launch is one forked rank of the suite's warm process (launch.torchrun,
forked.py: the trainer's output without ~6 s of imports per launch), the
finished run launched again too: its exit status is the rank's, and its line is
the last of the rank's output. That the line goes to stdout and nothing to
stderr is run_cli's (tests/unit_tests/test_runtime_failures.py::
test_nothing_to_train_exits_0_with_its_line); the entry point in fresh
interpreters is tests/unit_tests/test_job_checks.py's (its usage) and this
folder's test_runtime_failures.py's (a user error)."""

import re

import pytest

from tests.integration_tests.launch import torchrun
from tests.integration_tests.test_cli_refusals import DEBUG, forked_train


def _steps_warned(output: str) -> list[int]:
    return [int(n) for n in re.findall(r"Skrull step (\d+): \d+ cut", output)]


@pytest.mark.slow
def test_one_step_warns_about_no_later_step(tmp_path):
    """It warned 'Skrull step 2: 3 cut' and 'Skrull step 3: 1 cut' (steps built ahead).
    One forked rank (forked.py): its output goes to a file, not a terminal, as when captured."""
    proc = torchrun(1, "skrull_ext.train", ["--config-file", DEBUG, "--training.steps", "1",
                                            "--dump_folder", str(tmp_path / "out")], cwd=str(tmp_path))
    out = proc.stdout
    assert "skrull step 1:" in out
    warnings = [line for line in out.splitlines() if " - WARNING - " in line]
    assert not [w for w in warnings if re.search(r"\b[Ss]teps? ([2-9]|\d\d)", w)], warnings
    assert "samples read 8 = trained whole 8 + trained cut 0 + skipped 0" in out
    assert "step:  1  loss:" in out and "\x1b[" not in out  # captured, not a terminal: no colour codes


@pytest.mark.slow
def test_a_resumed_then_finished_run(tmp_path):
    """Each launch one forked rank of the suite's warm process (forked.py: ~6 s of imports
    each spared; the summary is the trainer's, not the launcher's); the finished run
    launched again reads the checkpoint folder the two wrote, and its last line and exit
    status are the claim (a fresh interpreter for it took ~10 s of CPU)."""
    dump = str(tmp_path / "out")
    common = ("--config-file", DEBUG, "--checkpoint.enable", "--dump_folder", dump)
    first = torchrun(1, "skrull_ext.train", [*common, "--training.steps", "2"], cwd=str(tmp_path))
    out = first.stdout
    assert _steps_warned(out) == [2]  # step 1 cuts nothing; step 3 was built ahead, never trained
    assert ("samples read 16 = trained whole 13 + trained cut 3 + skipped 0 (0 over-length, 0 with no loss "
            "tokens) over the run, steps 1..2, all in this launch") in out

    resumed = torchrun(1, "skrull_ext.train", [*common, "--training.steps", "3"], cwd=str(tmp_path))
    out = resumed.stdout
    assert _steps_warned(out) == [3]
    assert ("samples read 24 = trained whole 20 + trained cut 4 + skipped 0 (0 over-length, 0 with no loss "
            "tokens) over the run, steps 1..3 (every launch); this launch, steps 3..3: samples read 8 = "
            "trained whole 7 + trained cut 1 + skipped 0") in out
    assert "data wait per step this launch: " in out

    again = forked_train(*common, "--training.steps", "3", cwd=tmp_path)
    out = again.stdout  # the rank's stdout and stderr, in the order written
    assert again.returncode == 0, out[-3000:]
    assert out.strip().splitlines()[-1] == (
        f"nothing left to train: {dump}/checkpoint/step-3 is at step 3 of 3 (training.steps); raise "
        "training.steps (e.g. --training.steps 6) to train on from it")
    assert "Training starts" not in out and "Training completed" not in out and "error" not in out


@pytest.mark.slow
def test_the_hf_folder_at_the_end_holds_one_copy_of_the_weights(tmp_path):
    """It kept torchtitan's per-rank shards (step-N/sharded/) beside the consolidated weights.
    One forked rank (forked.py): the folder is the claim, not the launcher."""
    import os

    text_job = DEBUG.replace("debug_cpu.toml", "debug_cpu_text.toml")
    dump = tmp_path / "out"
    torchrun(1, "skrull_ext.train", ["--config-file", text_job, "--training.steps", "1", "--checkpoint.enable",
                                     "--checkpoint.last_save_in_hf", "--dump_folder", str(dump)], cwd=str(tmp_path))
    folder = dump / "checkpoint" / "step-1"
    assert sorted(os.listdir(folder)) == ["chat_template.jinja", "config.json", "model-00001-of-00001.safetensors",
                                          "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json"]
