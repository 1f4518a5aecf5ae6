"""Runtime failures and noise a user reads as a fault (issue 24): each caught at
config time or said in one line, in-process (the launches are in
tests/integration_tests/test_runtime_failures.py)."""

import math
import os

import pytest

from skrull_ext import lengths
from skrull_ext.errors import JobFileError
from skrull_ext.scheduler import Scheduler, cost_model
from skrull_ext.scheduler.config import SchedulerConfig
from skrull_ext.train.job.job_file import load_config
from tests.integration_tests.launch import free_port

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
DEBUG = os.path.join(ROOT, "skrull_ext", "jobs", "debug_cpu.toml")


@pytest.mark.parametrize("cpsat", [False, True])
def test_mean_bound_gap_is_defined_without_cpsat(cpsat):
    """It was NaN on every shipped job: only the CP-SAT fallback set the bound."""
    sched = Scheduler(SchedulerConfig(dp=2, cp=4, bucket_size=4096, policy="skrull", cpsat=cpsat),
                      cost_model.preset("qwen2.5-0.5b"))
    plan = sched.schedule([min(x, 16384) for x in lengths.load("sharegpt_v3_conversations.qwen")[:64]])
    gap = plan.summary()["mean_bound_gap"]
    assert math.isfinite(gap) and gap >= -1e-6
    assert all(mb.lower_bound_us is not None and mb.lower_bound_us <= mb.time_us * (1 + 1e-6)
               for mb in plan.micro_batches)


PROFILER = [
    (["--profiler.enable_profiling", "--profiler.profile_freq", "2"],
     "profiler.profile_freq = 2: must be >= profiler.profiler_warmup + profiler.profiler_active = 3 + 1 = 4"),
    (["--profiler.enable_profiling", "--profiler.profiler_active", "0"], "profiler.profiler_active = 0: must be >= 1"),
    (["--profiler.enable_memory_snapshot"], "profiler.enable_memory_snapshot = True: memory snapshots need a CUDA"),
]


@pytest.mark.parametrize("flags, message", PROFILER, ids=[" ".join(f) for f, _ in PROFILER])
def test_profiler_schedule_is_refused_at_config_time(flags, message, monkeypatch):
    """torchtitan asserted it (AssertionError, no key) once the model was built."""
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(JobFileError) as info:
        load_config(["--config-file", DEBUG, *flags])
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_profiler_cycle_that_fits_passes(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "1")
    load_config(["--config-file", DEBUG, "--profiler.enable_profiling", "--profiler.profile_freq", "2",
                 "--profiler.profiler_warmup", "1"])


def test_each_run_gets_its_own_tensorboard_folder(tmp_path):
    """torchtitan named it by the minute: a run and its continuation shared one."""
    from datetime import datetime

    from torchtitan_patches.metrics import claim_run_folder

    now = datetime(2026, 11, 26, 14, 30, 5)
    names = [os.path.basename(claim_run_folder(str(tmp_path), now)) for _ in range(3)]
    later = os.path.basename(claim_run_folder(str(tmp_path), datetime(2026, 11, 26, 14, 30, 6)))
    assert names == ["20261126-143005", "20261126-143005-1", "20261126-143005-2"]
    assert sorted([*names, later, "20261126-1429"]) == ["20261126-1429", *names, later]  # start order


def test_cpu_memory_is_the_process_peak_not_minus_one():
    from torchtitan_patches import _CpuDeviceModule

    cpu = _CpuDeviceModule()
    cpu.reset_peak_memory_stats()
    stats = cpu.memory_stats()
    if not stats:
        pytest.skip("no /proc/self/status here")
    assert stats["reserved_bytes.all.peak"] > 0 and stats["num_ooms"] == 0


def test_no_peak_flops_on_cpu():
    import torchtitan_patches

    if not torchtitan_patches.on_cpu():
        pytest.skip("CPU only")
    torchtitan_patches.apply()
    from torchtitan.tools import utils

    assert math.isnan(utils.get_peak_flops("x86_64"))


def _record(level, msg):
    import logging

    return logging.LogRecord("root", level, __file__, 1, msg, None, None)


def test_logs_come_from_rank_0_and_other_ranks_keep_their_errors():
    import logging

    from torchtitan_patches.logs import RankFilter, shown_ranks

    assert shown_ranks(None) == {0} and shown_ranks("0,1") == {0, 1} and shown_ranks("all") is None
    zero, one, every = RankFilter(0, {0}), RankFilter(1, {0}), RankFilter(1, None)
    info = "Training starts at step 1"
    assert zero.filter(_record(logging.INFO, info)) and every.filter(_record(logging.INFO, info))
    assert not one.filter(_record(logging.INFO, info)) and not one.filter(_record(logging.WARNING, info))
    err = _record(logging.ERROR, "boom")
    assert one.filter(err) and err.getMessage() == "[rank 1] boom"
    noise = "initial_load_model_only=True has no effect without an initial_load_path."
    assert not zero.filter(_record(logging.WARNING, noise))
    assert not zero.filter(_record(logging.WARNING, "HF assets path  does not exist!"))
    assert zero.filter(_record(logging.WARNING, "HF assets path /models/x does not exist!"))
    # torchrun always sets it to 1, torchtitan always to 3: a warning on every launch of the README's command.
    nccl = "ENV[TORCH_NCCL_ASYNC_ERROR_HANDLING] = 1 will be overridden to 3 based on job config"
    assert not zero.filter(_record(logging.WARNING, nccl))
    assert zero.filter(_record(logging.WARNING, "ENV[TORCH_NCCL_TRACE_BUFFER_SIZE] = 0 will be overridden to 20000"))


def _checkpoints(tmp_path, full=(), hf=()):
    from types import SimpleNamespace

    for step in full:
        (tmp_path / "checkpoint" / f"step-{step}").mkdir(parents=True)
        (tmp_path / "checkpoint" / f"step-{step}" / ".metadata").write_text("")
    for step in hf:
        (tmp_path / "checkpoint" / f"step-{step}").mkdir(parents=True)
        (tmp_path / "checkpoint" / f"step-{step}" / "model.safetensors.index.json").write_text("{}")
    return lambda load_step=-1, steps=100: SimpleNamespace(
        dump_folder=str(tmp_path), training=SimpleNamespace(steps=steps), checkpoint=SimpleNamespace(
            enable=True, create_seed_checkpoint=False, folder="checkpoint", load_step=load_step,
            initial_load_path=None, initial_load_model_only=True, initial_load_in_hf=False))


@pytest.mark.parametrize("full, hf, load_step, steps", [((2, 4), (), -1, 4), ((4,), (), 4, 3), ((2,), (4,), -1, 4)],
                         ids=["newest", "load_step-past-steps", "hf-last-save"])
def test_a_finished_run_launched_again_has_nothing_to_train(tmp_path, full, hf, load_step, steps):
    """Issue 50: it loaded step-N, logged 'Training starts at step N+1' and 'Training completed',
    rc 0, having trained nothing; now one line before any model, and exit status 0."""
    from skrull_ext.errors import NothingToTrain
    from skrull_ext.train.job.resume_checks import check_continue

    config = _checkpoints(tmp_path, full=full, hf=hf)
    with pytest.raises(NothingToTrain) as info:
        check_continue(config(load_step, steps))
    assert str(info.value) == (f"nothing left to train: {tmp_path}/checkpoint/step-4 is at step 4 of {steps} "
                               f"(training.steps); raise training.steps (e.g. --training.steps {4 + steps}) to "
                               "train on from it")
    if 2 in full:
        check_continue(config(2, steps))  # an earlier step named: it trains on


def test_nothing_to_train_exits_0_with_its_line(capsys):
    from skrull_ext.cli_errors import run_cli
    from skrull_ext.errors import NothingToTrain

    def main(argv):
        raise NothingToTrain("nothing left to train: at step 3 of 3")

    with pytest.raises(SystemExit) as info:
        run_cli(main, [])
    assert info.value.code == 0
    out = capsys.readouterr()
    assert out.out == "nothing left to train: at step 3 of 3\n" and out.err == ""


def test_continuing_from_a_hf_last_save_names_the_full_checkpoint(tmp_path):
    """It failed with ~300 lines (step-N/.metadata not found) on every rank."""
    from skrull_ext.train.job.resume_checks import check_continue

    config = _checkpoints(tmp_path, full=(2, 4), hf=(6,))
    with pytest.raises(JobFileError) as info:
        check_continue(config())
    text = str(info.value)
    assert "checkpoint/step-6 is the HF model folder" in text and text.endswith("--checkpoint.load_step 4")
    check_continue(config(4))  # the full one continues
    with pytest.raises(JobFileError, match=r"checkpoint.load_step = 5: there is no .*step-5 \(full checkpoints: "
                                           r"\[2, 4\]\)"):
        check_continue(config(5))


def test_a_hf_last_save_without_full_checkpoints_says_how_to_start_from_it(tmp_path):
    from skrull_ext.train.job.resume_checks import check_continue

    config = _checkpoints(tmp_path, hf=(3,))
    with pytest.raises(JobFileError, match="no full checkpoint to continue from .* --checkpoint.initial_load_path "
                                           ".*step-3 --checkpoint.initial_load_in_hf"):
        check_continue(config())
    check_continue(_checkpoints(tmp_path / "fresh")())  # nothing saved: a fresh start


def _stores(n):
    from datetime import timedelta

    import torch.distributed as dist

    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    clients = [dist.PrefixStore("hb/", dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False,
                                                     timeout=timedelta(seconds=60))) for _ in range(n)]
    return server, clients


def test_a_rank_whose_heartbeat_stops_is_named_once():
    """Rank 1 stops beating (as a SIGSTOPped process would): rank 0 names it and its
    step once its silence reaches the timeout, not a beat sooner; rank 2, which
    finished (done), is not taken for stopped. The beats are ticked by hand on a
    clock of the test's own (milliseconds), so a loaded machine changes nothing."""
    from skrull_ext.train.watchdog import Heartbeat

    now_ms = [0]
    server, stores = _stores(3)
    said = []
    beats = [Heartbeat(s, r, 3, 1.0, lambda r=r: 7 + r, on_stale=said.append, interval_s=0.05, kill_stopped=False,
                       clock=lambda: now_ms[0] / 1000) for r, s in enumerate(stores)]

    def tick(ranks, until_ms):
        while now_ms[0] < until_ms and not said:
            now_ms[0] += 50
            for r in sorted(ranks, reverse=True):  # the watcher (rank 0) last: it sees this tick's stamps
                beats[r]._tick()

    tick((0, 1, 2), 300)  # everyone beats; rank 0 last saw rank 1's stamp change at 300 ms
    beats[2].stop()  # done: never reported
    tick((0,), 1250)  # rank 1 silent for 950 ms: not yet
    assert said == [] and beats[0].silent()[0][:2] == (1, 8)
    tick((0,), 1300)  # 1000 ms: the timeout
    assert said == ["rank 1 stopped answering at step 8 (no heartbeat for 1.0 s; comm.heartbeat_timeout_seconds = 1)"]
    tick((0,), 3000)
    assert len(said) == 1  # once


def test_the_heartbeat_timeout_is_checked():
    from skrull_ext.train.job.comm_config import SkrullComm

    assert SkrullComm().heartbeat_timeout_seconds == 30 and SkrullComm(heartbeat_timeout_seconds=0)
    with pytest.raises(ValueError, match="comm.heartbeat_timeout_seconds must be 0 \\(off\\) or >= 1, got 0.5"):
        SkrullComm(heartbeat_timeout_seconds=0.5)


@pytest.mark.parametrize("exitcode, rc", [(2, 2), (1, 1), (-9, 1)])
def test_launch_adds_nothing_to_a_user_error_and_the_summary_to_others(exitcode, rc, monkeypatch, capsys):
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from skrull_ext import launch

    def failing(args):
        raise ChildFailedError("skrull_ext.train", {0: ProcessFailure(0, 123, exitcode, "/nonexistent/error.json")})

    monkeypatch.setattr(launch, "run", failing)
    assert launch.main(["--standalone", "--nproc_per_node", "1", "-m", "skrull_ext.train"]) == rc
    err = capsys.readouterr().err
    assert ("skrull_ext.train FAILED" in err) == (rc == 1) and "Traceback" not in err


@pytest.mark.parametrize("other, rc", [(-15, 2), (1, 1), (-9, 1)])
def test_launch_reads_the_user_error_past_a_rank_torchrun_stopped(other, rc, monkeypatch, capsys):
    """CI, 2 ranks: rank 1 exited 2 first; torchrun then stopped rank 0 (SIGTERM), whose error
    file (the same line) was written a second earlier. torchrun's first failure is rank 0's
    -15, and the launch exited 1 with the summary. A rank that failed on its own (1, or -9
    from outside) still makes it 1."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from skrull_ext import launch

    def failing(args):
        stopped, user = ProcessFailure(0, 123, other, "/nonexistent/0.json"), ProcessFailure(1, 124, 2, "/nonexistent/1.json")
        stopped.timestamp, user.timestamp = 100, 101
        raise ChildFailedError("skrull_ext.train", {0: stopped, 1: user})

    monkeypatch.setattr(launch, "run", failing)
    assert launch.main(["--standalone", "--nproc_per_node", "2", "-m", "skrull_ext.train"]) == rc
    assert ("skrull_ext.train FAILED" in capsys.readouterr().err) == (rc == 1)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")  # dcp.save in one process
def test_a_checkpoint_without_a_dataloader_key_this_version_saves_is_refused_in_one_line(tmp_path):
    """DCP loads the keys of the fresh loader: a checkpoint saved before ``dataloader.lookahead``
    existed failed deep in DCP on every rank ('Missing key in checkpoint state_dict')."""
    import torch.distributed.checkpoint as dcp

    from skrull_ext.train.job.resume_checks import check_continue

    config = _checkpoints(tmp_path)
    old, new = (tmp_path / "checkpoint" / f"step-{s}" for s in (2, 4))
    dcp.save({"dataloader": {"step": 2, "carry": "[]"}}, checkpoint_id=str(old), no_dist=True)
    dcp.save({"dataloader": {"step": 4, "carry": "[]", "lookahead": "[]"}}, checkpoint_id=str(new), no_dist=True)
    check_continue(config())  # the newest has every key
    with pytest.raises(JobFileError) as info:
        check_continue(config(2))
    assert str(info.value) == (
        f"{old}: its dataloader state has no lookahead (added 2026-11-28: the look-ahead windows a run trained, "
        "data/steps/windows.py), so this version cannot continue its data where it stopped; train on from its weights "
        f"in a new dump_folder with --checkpoint.initial_load_path {old} --checkpoint.initial_load_model_only, "
        "or continue it with the version that saved it")


@pytest.mark.slow
def test_a_reader_that_leaves_early_is_no_traceback():
    """``python -m skrull_ext.bench simulate | head`` ended in a BrokenPipeError traceback."""
    import subprocess
    import sys

    code = ("from skrull_ext.cli_errors import run_cli\n"
            "def main(argv):\n    for i in range(100000):\n        print('row', i)\n"
            "run_cli(main, [])\n")
    out = subprocess.run(f"{sys.executable} -c \"{code}\" | head -1", shell=True, capture_output=True, text=True,
                         timeout=120)
    assert out.stdout == "row 0\n" and "Traceback" not in out.stderr and "BrokenPipe" not in out.stderr


@pytest.mark.slow
@pytest.mark.parametrize("exit_by", ["return 0", "raise UserError('bad value')"])
def test_a_command_freezes_its_heap_when_it_exits(exit_by):
    """Every command's shutdown skips the cyclic collections over what torch left (cli_errors.freeze_at_exit):
    frozen at exit (an atexit handler registered before run_cli runs after its), after a success or a user
    error, and not before (a test calling run_cli in-process keeps collecting)."""
    import subprocess
    import sys

    code = ("import atexit, gc\n"
            "atexit.register(lambda: print('frozen at exit', gc.get_freeze_count() > 0))\n"
            "from skrull_ext.cli_errors import run_cli\nfrom skrull_ext.errors import UserError\n"
            f"def main(argv):\n    print('frozen before', gc.get_freeze_count() > 0)\n    {exit_by}\n"
            "run_cli(main, [])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.splitlines() == ["frozen before False", "frozen at exit True"], out.stdout + out.stderr
    assert out.returncode == (0 if exit_by == "return 0" else 2), out.stderr
