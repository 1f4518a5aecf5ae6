"""A run stopped from outside ends in one line saying where (stop_line.py): the
launcher's death (launcher_watch.py, driven here by a fake parent pid) and
Ctrl-C (interrupt.py). The processes themselves: tests/integration_tests/test_launcher_death.py."""

import os
import signal
import threading
from types import SimpleNamespace

import pytest

from skrull_ext.train import interrupt, launcher_watch, stop_line
from skrull_ext.train.launcher_watch import LauncherWatch


class _Trainer:
    """What stop_line reads of a trainer: its step (absent before torchtitan sets it)."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


def _config(tmp_path, enable=True):
    return SimpleNamespace(dump_folder=str(tmp_path), checkpoint=SimpleNamespace(enable=enable, folder="checkpoint"))


def _save(tmp_path, step, complete=True):
    folder = tmp_path / "checkpoint" / f"step-{step}"
    folder.mkdir(parents=True)
    if complete:
        (folder / ".metadata").write_bytes(b"")


@pytest.fixture
def exits(monkeypatch):
    """os._exit recorded instead of taken."""
    codes = []
    monkeypatch.setattr(os, "_exit", codes.append)
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    return codes


def test_the_line_names_the_step_and_the_last_complete_checkpoint(tmp_path):
    trainer = _Trainer(step=3)
    stop_line.track(trainer, _config(tmp_path))
    _save(tmp_path, 2)
    _save(tmp_path, 4, complete=False)  # being written when the run stopped: not counted
    assert stop_line.stop_message("interrupted (SIGINT)") == (
        f"interrupted (SIGINT) at step 3; stopping (last checkpoint: step-2 in {tmp_path}/checkpoint)")
    trainer.step = 0
    assert stop_line.stop_message("x") == (
        f"x before its first step; stopping (last checkpoint: step-2 in {tmp_path}/checkpoint)")
    starting = _Trainer()
    stop_line.track(starting, _config(tmp_path, enable=False))
    assert stop_line.stop_message("x") == "x while starting; stopping (no checkpoint: checkpoint.enable is off)"


def test_no_checkpoint_saved_is_said(tmp_path):
    trainer = _Trainer(step=1)  # held: stop_line keeps a weak reference
    stop_line.track(trainer, _config(tmp_path))
    assert stop_line.stop_message("x") == f"x at step 1; stopping (no checkpoint saved in {tmp_path}/checkpoint)"


def test_end_prints_from_the_first_local_rank_only(tmp_path, capfd, exits, monkeypatch):
    stop_line.end("the launcher (torchrun, pid 7) died at step 3; stopping (no checkpoint)", 1)
    monkeypatch.setenv("LOCAL_RANK", "1")
    stop_line.end("the same, from rank 1", 1)
    err = capfd.readouterr().err
    assert err == "error: the launcher (torchrun, pid 7) died at step 3; stopping (no checkpoint)\n"
    assert exits == [1, 1]


def test_two_threads_ending_at_once_print_one_line(capfd, monkeypatch):
    """The launcher watch's thread and the main thread (its collective failed as the
    peer left) both call end: the first prints and exits; the second, arriving while
    the first is exiting, prints nothing and exits after its wait (the CI run of
    test_launcher_death that printed the launcher's line twice)."""
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    monkeypatch.setattr(stop_line, "SECOND_CALLER_WAIT_S", 0.05, raising=False)
    exiting, second_done, codes = threading.Event(), threading.Event(), []

    def fake_exit(code):  # the first caller stays inside os._exit until the second has finished
        codes.append(code)
        if len(codes) == 1:
            exiting.set()
            assert second_done.wait(10)

    monkeypatch.setattr(os, "_exit", fake_exit)
    first = threading.Thread(target=stop_line.end, args=("the launcher (torchrun, pid 7) died at step 3; "
                                                         "stopping (no checkpoint)", 1))
    first.start()
    assert exiting.wait(10)
    stop_line.end("the same line, from the main thread", 1)
    second_done.set()
    first.join(10)
    assert capfd.readouterr().err == "error: the launcher (torchrun, pid 7) died at step 3; stopping (no checkpoint)\n"
    assert codes == [1, 1]
    stop_line.end("a later end prints again once the first returned (only where os._exit returns)", 2)
    assert capfd.readouterr().err.startswith("error: a later end")


def test_the_watch_ends_the_worker_once_its_parent_changes(tmp_path, capfd, exits):
    """getppid() turning from the launcher's pid to another (the reaper) within one poll."""
    trainer = _Trainer(step=5)
    stop_line.track(trainer, _config(tmp_path))
    _save(tmp_path, 4)
    parent = [4242]
    watch = LauncherWatch(4242, launcher_watch.end_orphan, poll_s=0.01, getppid=lambda: parent[0]).start()
    assert not watch.orphaned()
    parent[0] = 1
    watch._thread.join(timeout=30)
    assert not watch._thread.is_alive() and watch.orphaned()
    assert exits == [launcher_watch.EXIT_STATUS]
    assert capfd.readouterr().err == (f"error: the launcher (torchrun, pid 4242) died at step 5; stopping "
                                      f"(last checkpoint: step-4 in {tmp_path}/checkpoint)\n")


def test_the_watch_runs_under_torchrun_only(monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    monkeypatch.setattr(launcher_watch, "_watch", None)
    assert launcher_watch.start_launcher_watch() is None


def test_sigint_ends_in_the_line_and_status_130(tmp_path, capfd, exits):
    trainer = _Trainer(step=2)
    stop_line.track(trainer, _config(tmp_path))
    previous = signal.getsignal(signal.SIGINT)
    try:
        assert interrupt.install()
        signal.raise_signal(signal.SIGINT)  # the handler runs here (os._exit recorded, not taken)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert exits == [130]
    assert capfd.readouterr().err == (f"error: interrupted (SIGINT) at step 2; stopping "
                                      f"(no checkpoint saved in {tmp_path}/checkpoint)\n")


def test_install_is_refused_off_the_main_thread():
    got = []
    t = threading.Thread(target=lambda: got.append(interrupt.install()))
    t.start()
    t.join()
    assert got == [False]


def test_end_frees_the_dump_folder(tmp_path, capfd, exits):
    """The next run finds the folder free instead of taking over a dead run's lock."""
    from skrull_ext.train.run_lock import LOCK_NAME, take

    take(str(tmp_path))
    stop_line.end("interrupted (SIGINT) at step 1; stopping (no checkpoint)", 130)
    assert not (tmp_path / LOCK_NAME).exists()
    again = take(str(tmp_path))
    assert again.taken_over is None
    again.release()
