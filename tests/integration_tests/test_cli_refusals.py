"""A refused run, as a user types it: ``python -m skrull_ext.train`` exits 2 with one
``error:`` line, no traceback, and writes no file where it would have run (issue 38's
replays; the messages themselves are pinned by the unit tests).

A refusal before the dump folder is claimed runs the module as ``__main__`` in a fork of
the suite's warm process (forked.py, one rank: torchrun's environment), not a fresh
interpreter: each comes after torch and torchtitan are imported, about 10 s of CPU a
process. The one refused after the claim runs a real process: the claim
(train/run_lock.py) is released at interpreter exit (``atexit``), which a fork skips. The
real process also holds the interpreter's part: the exit status of ``python -m`` and the
``error:`` line on stderr, not stdout (as tests/unit_tests/test_job_checks.py does for a
config error)."""

import os
import subprocess
import sys

import pytest

from tests.integration_tests import forked
from tests.integration_tests.launch import REPO, _env

DEBUG = os.path.join(REPO, "skrull_ext", "jobs", "debug_cpu.toml")


def train(*args: str, cwd) -> subprocess.CompletedProcess:
    """``python -m skrull_ext.train ARGS`` in ``cwd``, a process of its own."""
    return subprocess.run([sys.executable, "-m", "skrull_ext.train", *args], cwd=cwd, env=_env(),
                          capture_output=True, text=True, timeout=600)


def forked_train(*args: str, cwd) -> subprocess.CompletedProcess:
    """The same in one forked rank; its stdout and stderr together in both fields."""
    rc, out = forked.launch(1, "skrull_ext.train", list(args), str(cwd), _env(), timeout=600)
    return subprocess.CompletedProcess(["forked x1", "-m", "skrull_ext.train", *args], rc, out, out)


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    """The single ``error:`` line of a refused run (exit status 2, no traceback), on stderr."""
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr[-3000:]
    return errors[0]


def files_under(folder) -> list[str]:
    """Every file under ``folder`` (empty folders are not files: torchtitan's process
    group set-up makes ``comm_traces/`` before any model is built)."""
    return [os.path.join(d, f) for d, _, names in os.walk(folder) for f in names]


@pytest.mark.slow
def test_a_bucket_size_that_cuts_most_samples_is_refused(tmp_path):
    dump = tmp_path / "out"
    proc = train("--config-file", DEBUG, "--skrull.bucket_size", "10", "--training.steps", "2",
                 "--dump_folder", str(dump), cwd=tmp_path)
    error = one_line_error(proc)
    assert error.startswith("error: skrull.bucket_size = 10 would cut 16 of the 16 sequences of steps 1..2"), error
    assert "keeps at least half whole" in error
    assert "step:  1" not in proc.stdout + proc.stderr
    assert files_under(dump) == []


@pytest.mark.slow
@pytest.mark.parametrize("bucket", [["--skrull.bucket_size", "profile"], []], ids=["profile", "own"])
def test_a_profile_that_failed_its_check_is_refused(tmp_path, bucket):
    """Issue 38 (BucketSize from it) and 50 (the job's own bucket_size: it still chose
    free-running from the failed profile's memory and trained, rc 0)."""
    from tests.unit_tests.test_job_file import _failed_profile

    failed = _failed_profile(tmp_path)
    dump = tmp_path / "out"
    proc = forked_train("--config-file", DEBUG, "--skrull.cost_model", failed, *bucket, "--training.steps", "1",
                        "--dump_folder", str(dump), cwd=tmp_path)
    assert proc.returncode == 2
    assert one_line_error(proc).startswith(
        f"error: skrull.cost_model: the profile {failed!r} failed its own memory check ([meta.check] "
        "ok = false: a buffer of its BucketSize, 4997 tokens, peaked at 1414.2 MiB against an activation budget")
    assert "free-running" not in proc.stdout + proc.stderr
    assert not dump.exists()


@pytest.mark.slow
def test_a_shipped_cpu_job_on_a_hf_folder_names_the_cost_model(tmp_path):
    from tests.integration_tests.hf_folders import save_tiny_model

    folder = save_tiny_model(str(tmp_path / "qwen"), "qwen2_5")
    dump = tmp_path / "out"
    proc = forked_train("--config-file", os.path.join(REPO, "skrull_ext", "jobs", "debug_cpu_text.toml"),
                        "--model.hf_path", folder, "--checkpoint.enable", "--training.steps", "1",
                        "--dump_folder", str(dump), cwd=tmp_path)
    error = one_line_error(proc)
    assert "cpu-debug-gloo2.toml: its [model] {'layers': 6, 'hidden': 256, 'kv_width': 256, " in error, error
    assert error.endswith("set --skrull.cost_model to a hardware preset ['h100-assumed'] or a profile of this model "
                          "(python -m skrull_ext.profile --config-file JOB.toml [--model.hf_path DIR] --out P.toml)")
    assert not dump.exists()
