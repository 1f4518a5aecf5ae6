"""Launch a job's ranks as forks of one warm process, the way torchrun would
start them, minus the imports.

Why: on this 2-core machine a rank spends about 6 s importing torch and
torchtitan before it trains 5 steps of a tiny model in 2-3 s, and the
torchrun process imports torch again: most of the suite's CPU time was
imports. Here a multiprocessing forkserver, started once per test process,
imports the entry points once (``PRELOAD``); every rank of every launch is a
fork of it, with torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, GROUP_RANK, ROLE_RANK, MASTER_ADDR, MASTER_PORT,
TORCHELASTIC_RUN_ID) and ``python -m module args`` run by ``runpy``.

It is still a real multi-process job: one OS process per rank, gloo over
loopback, rank 0 hosting the TCP store (as under ``torchrun`` without
--standalone's agent store). When one rank fails, the others are stopped,
as torchrun's agent does. What torchrun itself does (its CLI, its agent
watching and restarting the workers, its exit codes) is tested by the tests
that launch it for real (launch.torchrun with ``real=True``,
test_runtime_failures.py, test_launcher_death.py, the gpu_checks dry run).
"""

from __future__ import annotations

import multiprocessing
import os
import runpy
import signal
import sys
import time
import uuid

from tests.integration_tests.launch import _env, free_port

PRELOAD = ["torch", "skrull_ext.train.trainer", "torchtitan.train", "tests.integration_tests.probe",
           "skrull_ext.profile.train_check"]
"""What the forkserver imports once: the entry points the suite launches, the
product's first (as under ``python -m skrull_ext.train``)."""

_ctx = None


def _context():
    """The forkserver context, started with the environment a launched job gets
    (launch._env: no torchrun variables, OMP_NUM_THREADS=1, the repo on PYTHONPATH),
    since the imports in it (libgomp reads OMP_NUM_THREADS once) happen there."""
    global _ctx
    if _ctx is None:
        from multiprocessing import forkserver

        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        saved = dict(os.environ)
        try:
            os.environ.clear()
            os.environ.update(_env())
            forkserver.ensure_running()
        finally:
            os.environ.clear()
            os.environ.update(saved)
        _ctx = ctx
    return _ctx


def _rank_main(env: dict[str, str], cwd: str, log: str, module: str, args: list[str]) -> None:
    """One rank: torchrun's environment, output to ``log``, ``python -m module args``."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    import torch

    torch.set_num_threads(int(env.get("OMP_NUM_THREADS", "1")))
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def launch(nproc: int, module: str, args: list[str], cwd: str, env: dict[str, str],
           timeout: float) -> tuple[int, str]:
    """Run ``module args`` on ``nproc`` forked ranks; (exit status, output of
    every rank, rank 0 first). The status is the first failing rank's, or
    124 on timeout (every rank then killed). A store port taken between its
    pick and rank 0's bind (another test process launching) is retried once
    on a new port."""
    rc, out = _launch(nproc, module, args, cwd, env, timeout)
    if rc != 0 and "EADDRINUSE" in out:
        rc, out = _launch(nproc, module, args, cwd, env, timeout)
    return rc, out


def _launch(nproc: int, module: str, args: list[str], cwd: str, env: dict[str, str],
            timeout: float) -> tuple[int, str]:
    ctx = _context()
    port, run_id = free_port(), uuid.uuid4().hex[:8]
    logs = [os.path.join(cwd, f".forked-{run_id}-rank{r}.log") for r in range(nproc)]
    procs = []
    for r in range(nproc):
        rank_env = {**env, "RANK": str(r), "LOCAL_RANK": str(r), "GROUP_RANK": "0", "ROLE_RANK": str(r),
                    "WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc), "ROLE_WORLD_SIZE": str(nproc),
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "TORCHELASTIC_RUN_ID": run_id}
        p = ctx.Process(target=_rank_main, args=(rank_env, cwd, logs[r], module, list(args)), daemon=True)
        p.start()
        procs.append(p)
    status, deadline = 0, time.monotonic() + timeout
    while any(p.exitcode is None for p in procs):
        failed = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
        if failed or time.monotonic() > deadline:
            status = failed[0] if failed else 124
            _stop(procs)
            break
        time.sleep(0.05)
    else:
        status = next((p.exitcode for p in procs if p.exitcode != 0), 0)
    out = []
    for r, path in enumerate(logs):
        if not os.path.exists(path):  # the fork failed before its rank began (its traceback: the forkserver's stderr)
            out.append(f"rank {r} never started (exit status {procs[r].exitcode})\n")
            continue
        with open(path, errors="replace") as f:
            out.append(f.read())
        os.remove(path)
    return (status if status >= 0 else 128 - status), "".join(out)


def _stop(procs, grace_s: float = 5.0) -> None:
    """torchrun's agent on a failed worker: SIGTERM the rest, SIGKILL what outlives the grace."""
    for p in procs:
        if p.exitcode is None:
            os.kill(p.pid, signal.SIGTERM)
    end = time.monotonic() + grace_s
    for p in procs:
        p.join(max(0.0, end - time.monotonic()))
        if p.exitcode is None:
            p.kill()
            p.join()
