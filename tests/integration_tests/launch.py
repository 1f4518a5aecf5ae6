"""Launch real training processes for integration tests and read back what they wrote.

Runs ``torchrun --standalone`` (gloo on loopback) on the repo's entry points,
wrapped by ``probe.py`` so a run can save its gradients at a check step, and
reads scalars back from the TensorBoard events, which keep float32 precision
(the console shows 5 decimals).
"""

import glob
import os
import socket
import subprocess
import sys
from dataclasses import dataclass, field

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
LOSS_TAG = "loss_metrics/global_avg_loss"
PROBE = "tests.integration_tests.probe"


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment for a launched job, without torchrun's variables
    (tests/conftest.LAUNCHER_ENV): the job is launched here, by torchrun or as one process."""
    from tests.conftest import LAUNCHER_ENV

    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra or {})
    return env


def torchrun(nproc: int, module: str, args: list[str], cwd: str, timeout: int = 600,
             expect_failure: bool = False, env: dict[str, str] | None = None, real: bool | None = None):
    """Run ``torchrun -m module args`` with ``nproc`` ranks; raise with the log tail
    if it fails (or, with ``expect_failure``, if it succeeds).

    ``real``: through the torchrun CLI (``python -m torch.distributed.run
    --standalone``); by default only where a failure is expected, whose output
    torchrun's failure summary shapes. Otherwise the ranks are forks of a warm
    process with torchrun's environment (forked.py): the same job, without
    importing torch and torchtitan again in every rank."""
    if expect_failure if real is None else real:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={nproc}", "-m", module, *args]
        proc = subprocess.run(cmd, cwd=cwd, env=_env(env), capture_output=True, text=True,
                              timeout=timeout)
    else:
        from tests.integration_tests import forked

        rc, out = forked.launch(nproc, module, args, cwd, _env(env), timeout)
        proc = subprocess.CompletedProcess([f"forked x{nproc}", "-m", module, *args], rc, out, "")
    if (proc.returncode != 0) != expect_failure:
        raise AssertionError(
            f"{' '.join(proc.args)} exited {proc.returncode}:\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
        )
    return proc


def free_port() -> int:
    """A free TCP port on loopback (for a store; another process may take it before it is bound)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scalars(dump_folder: str, tag: str) -> list[float]:
    """Per-step values of one TensorBoard scalar logged by rank 0, in step order
    (from the newest run under ``dump_folder/tb``)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    runs = glob.glob(os.path.join(dump_folder, "tb", "*"))
    assert runs, f"no TensorBoard run under {dump_folder}/tb"
    acc = EventAccumulator(max(runs), size_guidance={"scalars": 0})
    acc.Reload()
    events = acc.Scalars(tag)
    return [e.value for e in sorted(events, key=lambda e: e.step)]


def losses(dump_folder: str) -> list[float]:
    """Per-step global average loss, in step order."""
    return scalars(dump_folder, LOSS_TAG)


@dataclass
class Run:
    """What one training launch left behind."""

    dump: str
    output: str
    grads: str | None
    """Path of the gradients saved at the check step (probe.py), if asked for."""
    step_grads: dict[int, str] = field(default_factory=dict)
    """Paths of the gradients saved at further steps (``more_grads_at``), by step."""

    @property
    def losses(self) -> list[float]:
        return losses(self.dump)

    def scalars(self, tag: str) -> list[float]:
        return scalars(self.dump, tag)


def seed_checkpoint(workdir: str, config: list[str]) -> str:
    """Create a one-process seed checkpoint; return its absolute path."""
    dump = os.path.join(workdir, "seed")
    torchrun(1, "torchtitan.train", [*config, "--dump_folder", dump,
             "--checkpoint.enable", "--checkpoint.create_seed_checkpoint"], cwd=workdir)
    path = os.path.join(dump, "checkpoint", "step-0")
    assert os.path.isdir(path), f"seed checkpoint missing at {path}"
    return path


def train_from_seed(workdir: str, name: str, nproc: int, module: str, config: list[str],
                    seed: str | None, steps: int, extra: list[str] = (), grads_at: int | None = None,
                    save_every: int | None = None, env: dict[str, str] | None = None,
                    more_grads_at: tuple[int, ...] = ()) -> Run:
    """Train ``steps`` steps from the seed checkpoint with TensorBoard on.

    ``seed``: None keeps the job's own initial load (a ``[model] hf_path``
    job starts from its HF folder).
    ``grads_at``: save the gradients of that step (``Run.grads``).
    ``more_grads_at``: also save those steps' gradients (``Run.step_grads``).
    ``save_every``: also save full checkpoints every that many steps (the
    default saves nothing).
    ``env``: extra environment variables of the launch.
    """
    dump = os.path.join(workdir, name)
    saving = (["--checkpoint.interval", str(save_every)]
              if save_every else ["--checkpoint.load_only"])
    initial = ["--checkpoint.initial_load_path", seed] if seed is not None else []
    grads = os.path.join(workdir, f"{name}.grads.pt") if grads_at else None
    step_grads = {s: os.path.join(workdir, f"{name}.grads.step{s}.pt") for s in more_grads_at}
    specs = ([f"{grads_at}:{grads}"] if grads_at else []) + [f"{s}:{p}" for s, p in step_grads.items()]
    env = {**(env or {}), **({"SKRULL_PROBE_GRADS": ",".join(specs)} if specs else {})}
    proc = torchrun(nproc, PROBE, [
        module, *config, "--dump_folder", dump, "--training.steps", str(steps),
        "--checkpoint.enable", *saving, *initial,
        "--metrics.enable_tensorboard", *extra,
    ], cwd=workdir, env=env)
    for s, path in ([(grads_at, grads)] if grads else []) + list(step_grads.items()):
        assert os.path.isfile(path), f"{name}: no gradients saved at step {s}"
    return Run(dump=dump, output=proc.stdout + proc.stderr, grads=grads, step_grads=step_grads)


def assert_same_grads(got_path: str, ref_path: str, rtol: float, atol: float,
                      max_rel_norm: float) -> tuple[float, float]:
    """Every parameter's gradient agrees elementwise (``assert_close``) and the
    whole gradient within ``max_rel_norm`` (||got - ref|| / ||ref||).

    Returns (largest abs difference, relative norm of the difference).
    """
    import torch

    got, ref = torch.load(got_path), torch.load(ref_path)
    assert got.keys() == ref.keys(), f"parameters differ: {sorted(got.keys() ^ ref.keys())}"
    worst, diff2, ref2 = 0.0, 0.0, 0.0
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], rtol=rtol, atol=atol,
                                   msg=lambda m, n=name: f"gradient of {n}: {m}")
        d = got[name].double() - ref[name].double()
        worst = max(worst, float(d.abs().max()))
        diff2 += float((d * d).sum())
        ref2 += float((ref[name].double() ** 2).sum())
    rel = (diff2 / ref2) ** 0.5
    assert rel < max_rel_norm, f"||grad diff|| / ||grad|| = {rel:.3g} >= {max_rel_norm}"
    return worst, rel
