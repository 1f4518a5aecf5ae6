"""Launch real training processes for integration tests and read their losses.

Runs ``torchrun --standalone`` (gloo on loopback) on the repo's entry points
and reads ``loss_metrics/global_avg_loss`` back from the TensorBoard events,
which keep float32 precision (the console shows 5 decimals).
"""

import glob
import os
import subprocess
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
LOSS_TAG = "loss_metrics/global_avg_loss"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def torchrun(nproc: int, module: str, args: list[str], cwd: str, timeout: int = 600):
    """Run ``torchrun -m module args`` with ``nproc`` ranks; raise with the log tail on failure."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={nproc}", "-m", module, *args]
    proc = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
        )
    return proc


def scalars(dump_folder: str, tag: str) -> list[float]:
    """Per-step values of one TensorBoard scalar logged by rank 0, in step order."""
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


def seed_checkpoint(workdir: str, config: list[str]) -> str:
    """Create a one-process seed checkpoint; return its absolute path."""
    dump = os.path.join(workdir, "seed")
    torchrun(1, "torchtitan.train", [*config, "--dump_folder", dump,
             "--checkpoint.enable", "--checkpoint.create_seed_checkpoint"], cwd=workdir)
    path = os.path.join(dump, "checkpoint", "step-0")
    assert os.path.isdir(path), f"seed checkpoint missing at {path}"
    return path


def train_from_seed(workdir: str, name: str, nproc: int, module: str, config: list[str],
                    seed: str, steps: int, extra: list[str] = ()) -> list[float]:
    """Train ``steps`` steps from the seed checkpoint (no saves); return losses."""
    dump = os.path.join(workdir, name)
    torchrun(nproc, module, [
        *config, "--dump_folder", dump, "--training.steps", str(steps),
        "--checkpoint.enable", "--checkpoint.load_only",
        "--checkpoint.initial_load_path", seed,
        "--metrics.enable_tensorboard", *extra,
    ], cwd=workdir)
    return losses(dump)
