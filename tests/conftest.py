"""Suite-wide settings: how many xdist workers, launcher variables kept out of
tests, and torchtitan imported once with import-time warnings silenced.

Workers (``-n auto`` in pyproject): one per core, at most 4. Most slow tests
launch 2-4 ranks, each mostly importing torch and torchtitan or waiting on
its peers, so two tests at once keep both cores of a CI box busy (the suite
took 27 min instead of 34); more would only multiply the ranks on the cores.
Each worker builds the session fixtures it needs (``--dist loadfile`` keeps a
file's tests, and the runs they share, on one worker).

One torch thread per worker (``OMP_NUM_THREADS=1`` unless set): the workers already
fill the cores, and torch's default (a thread per core) in each of them
oversubscribes the box; libgomp's threads then spin on each other's cores. On
the shared 2-core box test_profile_lora_memory.py took 167 s with two threads
and 28 s with one, the same tests. The launched ranks already ran with one
(launch._env); set before torch is imported, so the forked and subprocess
jobs inherit it too. No test depends on the thread count.

Import torchtitan once with third-party import-time warnings silenced.

pyproject turns warnings into errors. torch 2.13 warns on its own import
paths that torchtitan 0.3.0 pulls in (``torch.jit.script_method`` is
deprecated, from torch.utils.mkldnn), which would fail collection of every
test module importing torchtitan. Only these import-time warnings are
silenced; warnings raised while a test runs still fail it.
"""

import os
import warnings

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

LAUNCHER_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")
"""What torchrun sets for its workers: a test that leaves one set in the test process makes a
later test's one-process ``python -m skrull_ext.train`` think it was launched by torchrun."""


def pytest_xdist_auto_num_workers(config) -> int:
    return max(1, min(os.cpu_count() or 1, 4))


@pytest.fixture(autouse=True)
def _launcher_env_restored():
    saved = {k: os.environ.get(k) for k in LAUNCHER_ENV}
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    try:
        import torchtitan.trainer  # noqa: F401
    except ImportError:  # the [train] extra is not installed
        pass
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))  # had a plugin imported torch first
