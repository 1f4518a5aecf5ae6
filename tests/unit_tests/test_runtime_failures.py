"""Runtime failures and noise a user reads as a fault (issue 24): each caught at
config time or said in one line, in-process (the launches are in
tests/integration_tests/test_runtime_failures.py)."""

import math
import os

import pytest

from skrull_ext import cost_model, lengths
from skrull_ext.config import SchedulerConfig
from skrull_ext.errors import JobFileError
from skrull_ext.job_file import load_config
from skrull_ext.scheduler import Scheduler

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
               for mb in plan.all_micro_batches())


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
