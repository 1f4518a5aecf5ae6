"""A run owns its dump folder (skrull_ext/train/run_lock.py): the lock is taken,
a live owner refuses a second run in one line naming it, and a dead owner's
lock is taken over. The "other run" is simulated in this process: a second
open file description of the lock file, flocked, with the owner's metadata."""

import fcntl
import json
import os
import socket
import time

import pytest

from skrull_ext.errors import UserError
from skrull_ext.train import run_lock
from skrull_ext.train.run_lock import LOCK_NAME, STALE_S, claim_dump_folder, take


def _ticks(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[19]


def _hold(folder, host=None, pid=None, start_ticks="", launcher_pid=4242, locked=True):
    """Another run's lock file in ``folder``: its metadata, flocked unless ``locked`` is False.
    Returns the descriptor (closing it releases the flock)."""
    os.makedirs(folder, exist_ok=True)
    fd = os.open(os.path.join(folder, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
    if locked:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    owner = {"host": host or socket.gethostname(), "pid": pid or os.getpid(), "launcher_pid": launcher_pid,
             "started": "2026-01-01 00:00:00", "start_ticks": start_ticks}
    os.pwrite(fd, json.dumps(owner).encode(), 0)
    return fd


def _dead_pid() -> int:
    """A pid with no process (the highest free one below pid_max)."""
    pid = 4_000_000
    while os.path.exists(f"/proc/{pid}"):
        pid -= 1
    return pid


@pytest.fixture(autouse=True)
def _no_leftover_locks():
    yield
    run_lock.release_all()


def test_a_free_folder_is_taken_and_released(tmp_path):
    folder = str(tmp_path / "run")
    lock = take(folder)  # creates the folder
    path = os.path.join(folder, LOCK_NAME)
    with open(path) as f:
        owner = json.load(f)
    assert owner["pid"] == os.getpid() and owner["host"] == socket.gethostname()
    assert lock.taken_over is None
    lock.release()
    assert not os.path.exists(path)
    take(folder).release()  # free again


def test_the_same_process_reuses_its_lock(tmp_path):
    first = take(str(tmp_path))
    second = take(str(tmp_path / "."))  # another spelling of the folder
    assert second is first and first.count == 2
    second.release()
    assert os.path.exists(os.path.join(tmp_path, LOCK_NAME))  # still held once
    first.release()
    assert not os.path.exists(os.path.join(tmp_path, LOCK_NAME))


def test_a_live_run_refuses_a_second_in_one_line(tmp_path):
    folder = str(tmp_path)
    fd = _hold(folder, start_ticks=_ticks(os.getpid()))  # alive: this very process
    try:
        with pytest.raises(UserError) as e:
            take(folder)
    finally:
        os.close(fd)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(f"dump_folder = {folder} is in use by a live run (pid {os.getpid()}, launcher pid 4242 "
                          f"on {socket.gethostname()}, started 2026-01-01 00:00:00; "), msg
    assert msg.endswith(f"wait for it to end, stop it (kill 4242 on {socket.gethostname()}), "
                        "or give this run another --dump_folder"), msg


def test_rank_0_alone_takes_it(tmp_path):
    assert claim_dump_folder(str(tmp_path / "r1"), rank=1) is None
    assert not (tmp_path / "r1").exists()  # nothing written by the other ranks
    assert claim_dump_folder(str(tmp_path / "r0"), rank=0) is not None


def test_a_killed_runs_lock_is_taken_over_with_one_line(tmp_path):
    """kill -9 leaves the file (flock released with the process): taken, saying whose it was."""
    fd = _hold(str(tmp_path), pid=_dead_pid(), locked=False)
    os.close(fd)
    lock = take(str(tmp_path))
    assert lock.taken_over is not None and "\n" not in lock.taken_over
    assert lock.taken_over.startswith(f"{tmp_path}: took over the lock of a run that ended without releasing it (pid ")


def test_a_held_lock_of_a_gone_process_on_this_host_is_taken_over(tmp_path):
    """The flock kept by a leftover descriptor (a child of the dead run): its pid decides."""
    fd = _hold(str(tmp_path), pid=_dead_pid())
    try:
        lock = take(str(tmp_path))
    finally:
        os.close(fd)
    assert "its process is gone" in lock.taken_over
    with open(os.path.join(tmp_path, LOCK_NAME)) as f:
        assert json.load(f)["pid"] == os.getpid()


def test_a_reused_pid_is_not_the_owner(tmp_path):
    """The owner's pid now names another process (another start time): gone."""
    fd = _hold(str(tmp_path), pid=os.getpid(), start_ticks="1")
    try:
        lock = take(str(tmp_path))
    finally:
        os.close(fd)
    assert "its process is gone" in lock.taken_over


def test_another_hosts_run_holds_while_its_heartbeat_is_fresh(tmp_path):
    path = os.path.join(tmp_path, LOCK_NAME)
    for locked in (True, False):  # flock held, or not seen across hosts (a network filesystem)
        fd = _hold(str(tmp_path), host="elsewhere", locked=locked)
        try:
            with pytest.raises(UserError, match=r"in use by a live run \(pid \d+, launcher pid 4242 on elsewhere"):
                take(str(tmp_path))
        finally:
            os.close(fd)
    old = time.time() - STALE_S - 5
    fd = _hold(str(tmp_path), host="elsewhere")
    os.utime(path, (old, old))
    try:
        lock = take(str(tmp_path))
    finally:
        os.close(fd)
    assert f"its heartbeat is {STALE_S + 5:.0f} s old (> {STALE_S:g} s)" in lock.taken_over


def test_a_folder_it_cannot_write_is_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(UserError, match=rf"^dump_folder = {blocker}/run: cannot create {blocker}/run/{LOCK_NAME} "
                                        r"\(Not a directory\); give the run a folder it can write$"):
        take(str(blocker / "run"))
