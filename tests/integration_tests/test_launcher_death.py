"""A run owns its dump folder and ends with its launcher (issue 38, items 1 and 5),
under torchrun with 2 processes on the debug job at CP 2: a second run on a live
run's folder is refused in one line; ``kill -9`` of torchrun ends its workers
within the watch's bound, each run's last line saying where it stopped; Ctrl-C
(SIGINT to the launcher) ends in that line alone. The in-process halves:
tests/unit_tests/test_run_lock.py and test_stop_line.py."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest

from skrull_ext.train.launcher_watch import POLL_S
from skrull_ext.train.run_lock import LOCK_NAME
from tests.integration_tests.launch import REPO, _env, torchrun
from tests.integration_tests.test_runtime_failures import _error_lines, _worker

JOB = os.path.join(REPO, "skrull_ext", "jobs", "debug_cpu.toml")
BOUND_S = POLL_S + 20
"""The watch's bound (a poll, then the exit) plus slack for a loaded 2-core host."""
ARGS = ["-m", "skrull_ext.train", "--config-file", JOB, "--parallelism.context_parallel_degree", "2",
        "--training.steps", "1000", "--checkpoint.enable", "--checkpoint.interval", "2",
        "--comm.heartbeat_timeout_seconds", "0"]
"""The stopped-rank watch off: the first test stops both workers (SIGSTOP) while the second run is
refused, and on SIGCONT each would find the other's heartbeat stale (test_runtime_failures.py tests the watch)."""

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the workers through /proc")]


def _start(launcher: str, dump: str, log) -> subprocess.Popen:
    """A 1000-step run in its own session (as ``setsid torchrun ... &``)."""
    cmd = [sys.executable, "-m", launcher, "--standalone", "--nproc_per_node=2", *ARGS, "--dump_folder", dump]
    return subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _wait_for(log_path, text: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while text not in log_path.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()[-4000:]
        time.sleep(0.5)


def _running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (a zombie has)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _kill_all(proc: subprocess.Popen, pids) -> None:
    for pid in [proc.pid, *pids]:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, TypeError):
            pass
    proc.wait(timeout=30)


def test_a_live_runs_folder_is_refused_and_its_workers_end_with_torchrun(tmp_path):
    dump, log = str(tmp_path / "crash"), tmp_path / "run1.txt"
    with open(log, "w") as f:
        run1 = _start("torch.distributed.run", dump, f)
    workers = []
    try:
        _wait_for(log, "step:  2", run1)
        workers = [_worker(run1.pid, r) for r in (0, 1)]
        assert None not in workers, workers

        # The same job again, while the first is live: refused before it writes anything. The first
        # run's workers are stopped meanwhile (still live processes, holding the folder), so that they
        # do not train on through the second launch for nothing. The second launch's ranks are forks
        # of the suite's warm process (forked.py): the refusal is theirs, and what skrull_ext.launch
        # makes of a rank's user error (exit status 2, the line alone) is
        # test_runtime_failures.py::test_a_data_error_ends_the_launch_in_its_one_line.
        for w in workers:
            os.kill(w, signal.SIGSTOP)
        before = set(os.listdir(dump))
        second = torchrun(2, ARGS[1], [*ARGS[2:], "--dump_folder", dump], cwd=str(tmp_path), expect_failure=True,
                          real=False)
        out2 = second.stdout + second.stderr
        assert second.returncode == 2, out2[-4000:]
        lines = _error_lines(out2)
        assert len(lines) == 1 and lines[0].startswith(
            f"error: dump_folder = {dump} is in use by a live run (pid {workers[0]}, launcher pid {run1.pid} on "), out2
        assert f"stop it (kill {run1.pid} on " in lines[0] and lines[0].endswith("another --dump_folder"), lines
        assert "Traceback" not in out2 and "Loading the checkpoint" not in out2, out2[-4000:]
        assert set(os.listdir(dump)) <= before | {"checkpoint"}, sorted(os.listdir(dump))
        assert run1.poll() is None and all(_running(w) for w in workers), log.read_text()[-4000:]
        for w in workers:
            os.kill(w, signal.SIGCONT)

        # kill -9 of torchrun: its workers stop within the bound, rank 0 saying where.
        _wait_for(log, "step:  3", run1)
        os.kill(run1.pid, signal.SIGKILL)
        start = time.monotonic()
        while any(_running(w) for w in workers) and time.monotonic() - start < BOUND_S + 60:
            time.sleep(0.1)
        took = time.monotonic() - start
    finally:
        _kill_all(run1, workers)
    out = log.read_text()
    assert took < BOUND_S, f"workers still ran {took:.1f} s after torchrun died (bound {BOUND_S} s):\n{out[-4000:]}"
    died = [line for line in _error_lines(out) if "launcher" in line]
    assert len(died) == 1, out[-4000:]
    m = re.fullmatch(rf"error: the launcher \(torchrun, pid {run1.pid}\) died at step (\d+); stopping "
                     rf"\(last checkpoint: step-(\d+) in {re.escape(dump)}/checkpoint\)", died[0])
    assert m and int(m[1]) >= 3 and int(m[1]) - 2 <= int(m[2]) <= int(m[1]) and int(m[2]) % 2 == 0, died
    tail = out[out.index("step:  3"):]
    assert "Traceback" not in tail and "sendBytes failed" not in tail, tail[-4000:]
    assert not os.path.exists(os.path.join(dump, LOCK_NAME))  # free for the relaunch
    print(f"workers gone {took:.1f} s after kill -9 of torchrun: {died[0]}")


def test_ctrl_c_ends_in_one_line_saying_where(tmp_path):
    """SIGINT to the launcher (a terminal's Ctrl-C reaches only it): each worker exits 130,
    rank 0 names the step and the last checkpoint; no traceback (skrull_ext.launch ends
    torchrun's own SignalException too)."""
    dump, log = str(tmp_path / "int"), tmp_path / "out.txt"
    with open(log, "w") as f:
        proc = _start("skrull_ext.launch", dump, f)
    try:
        _wait_for(log, "step:  3", proc)
        os.kill(proc.pid, signal.SIGINT)
        rc = proc.wait(timeout=120)
    finally:
        _kill_all(proc, [])
    out = log.read_text()
    lines = _error_lines(out)
    assert rc == 130 and len(lines) == 1, out[-4000:]
    assert re.fullmatch(rf"error: interrupted \(SIGINT\) at step \d+; stopping \(last checkpoint: step-\d+ in "
                        rf"{re.escape(dump)}/checkpoint\)", lines[0]), lines
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out[-4000:]
    assert not os.path.exists(os.path.join(dump, LOCK_NAME))
