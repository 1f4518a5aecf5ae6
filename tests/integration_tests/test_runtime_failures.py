"""Runtime failures under torchrun (2 processes, gloo) end in one line (issue 24):
a data error prints no traceback of the job's, and a stopped rank ends the job
within a bound, by name. The in-process halves are in
tests/unit_tests/test_runtime_failures.py."""

import glob
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.integration_tests.launch import _env, REPO

JOB = os.path.join(REPO, "skrull_ext", "jobs", "debug_cpu.toml")
TEXT_JOB = os.path.join(REPO, "skrull_ext", "jobs", "debug_cpu_text.toml")


def _error_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("error:")]


@pytest.mark.slow
def test_a_data_error_ends_the_launch_in_its_one_line(tmp_path):
    """A JSONL file with a bad record, 2 processes at CP 2 through ``python -m
    skrull_ext.launch`` (torchrun's arguments): rank 0 prints the one line, exit status 2,
    no traceback at all (no rank's, nor torchrun's launcher's ``ChildFailedError``).

    Each worker's torchelastic error file (kept by ``--log-dir``) holds the line, not the
    traceback torchelastic's @record wrote there: read by torchrun's own ``ProcessFailure``,
    its message is what plain ``torchrun``'s failure summary prints (``traceback : <line>``).
    Plain torchrun ran the same failing job a second time for that summary; its workers do
    what these do (the launcher only reads their exit), and the rest of the summary is
    torchrun's own text."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    data = tmp_path / "bad.jsonl"
    data.write_text('{"text": "a good record, long enough to train on"}\n{"text": oops\n')
    logs = tmp_path / "logs"
    cmd = [sys.executable, "-m", "skrull_ext.launch", "--standalone", "--nproc_per_node=2", "--log-dir", str(logs),
           "-m", "skrull_ext.train", "--config-file", TEXT_JOB, "--dump_folder", str(tmp_path / "run"),
           "--parallelism.context_parallel_degree", "2", "--dataloader.dataset_path", str(data)]
    proc = subprocess.run(cmd, cwd=str(tmp_path), env=_env(), capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    line = (f"{data}:2: not valid JSON: Expecting value: line 1 column 10 (char 9) "
            "(dataloader.on_bad_record = 'skip' skips and counts such records)")
    assert proc.returncode == 2 and _error_lines(out) == [f"error: {line}"], out[-4000:]
    assert "Traceback" not in out and "ChildFailedError" not in out, out[-4000:]
    files = sorted(glob.glob(str(logs / "*" / "attempt_0" / "*" / "error.json")))
    assert files, f"no worker error file under {logs}: {out[-4000:]}"
    messages = [ProcessFailure(local_rank=int(os.path.basename(os.path.dirname(f))), pid=0, exitcode=2,
                               error_file=f).message for f in files]
    assert all(isinstance(m, str) and "Traceback" not in m and "DataError" not in m for m in messages), messages
    assert line in messages, messages


def _worker(parent: int, rank: int) -> int | None:
    """The pid of torchrun ``parent``'s worker of global ``rank`` (Linux /proc)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != parent:
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        except (OSError, ValueError, IndexError):
            continue
        if env.get(b"RANK") == str(rank).encode():
            return int(pid)
    return None


HEARTBEAT_S = 5
BOUND_S = HEARTBEAT_S + 20
"""The heartbeat timeout plus slack for a loaded 2-core host (the watch beats every half second
at this timeout; the reporter kills the stopped rank, so torchrun's 30 s SIGTERM-to-SIGKILL wait is
not in it: without that kill the job ends at about HEARTBEAT_S + 30 s, past the bound). 5 s: a live
rank's beat is a thread's store write every 0.5 s, ten beats missed before it counts as stopped
(the default timeout is 30 s; the smallest allowed is 1)."""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the worker through /proc")
def test_a_stopped_rank_ends_the_job_by_name_within_the_bound(tmp_path):
    """kill -STOP rank 1 mid-run: rank 0 names it within heartbeat_timeout_seconds and
    the job ends within the bound (it ran 132 s into gloo's unnamed timeout)."""
    log = tmp_path / "out.txt"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "skrull_ext.train", "--config-file", JOB,
           "--dump_folder", str(tmp_path / "run"), "--parallelism.context_parallel_degree", "2",
           "--training.steps", "1000", "--comm.heartbeat_timeout_seconds", str(HEARTBEAT_S)]
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=str(tmp_path), env=_env(), stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
    stopped = None
    try:
        deadline = time.monotonic() + 300
        while "step:  2" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(0.5)
        stopped = _worker(proc.pid, 1)
        assert stopped is not None, "rank 1's process not found"
        os.kill(stopped, signal.SIGSTOP)
        start = time.monotonic()
        rc = proc.wait(timeout=BOUND_S + 60)
        took = time.monotonic() - start
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        if stopped is not None:
            try:
                os.kill(stopped, signal.SIGKILL)
            except ProcessLookupError:
                pass
    out = log.read_text()
    lines = [line for line in _error_lines(out) if "stopped answering" in line]
    assert rc != 0 and len(lines) == 1, out[-4000:]
    assert lines[0].startswith("error: rank 1 stopped answering at step "), lines
    assert f"comm.heartbeat_timeout_seconds = {HEARTBEAT_S}" in lines[0]
    assert took < BOUND_S, f"the job took {took:.1f} s to end after rank 1 stopped (bound {BOUND_S} s)"
    print(f"rank 1 stopped; job over in {took:.1f} s: {lines[0]}")
