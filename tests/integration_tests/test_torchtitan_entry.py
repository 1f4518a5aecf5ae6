"""The documented torchtitan path, ``python -m torchtitan.train --module skrull_ext.train
--config skrull_llama3_debugmodel`` (skrull_ext/train/config_registry.py), trains on CPU:
the trainer applies the CPU fixes and nothing in skrull_ext binds torch.cuda at import
(issue 16).

One process, the command itself in a fresh interpreter: torchtitan.train is imported
first and finds the trainer through ``--module``, the import order a forked rank of the
suite's warm process (forked.py, which preloads the trainer) would not show. It ran under
torchrun at CP 2 (three interpreters, ~30 s of CPU); the trainer's CP 2 runs are the
forked parity runs (conftest.py's skrull_runs), torchrun's CLI is tested where it is the
claim (test_runtime_failures.py, test_launcher_death.py)."""

import subprocess
import sys

import pytest

from tests.integration_tests.launch import _env, losses


@pytest.mark.slow
def test_torchtitan_train_module_path_trains_two_steps(tmp_path):
    dump = str(tmp_path / "run")
    proc = subprocess.run([sys.executable, "-m", "torchtitan.train", "--module", "skrull_ext.train",
                           "--config", "skrull_llama3_debugmodel", "--dump_folder", dump, "--training.steps", "2",
                           "--metrics.enable_tensorboard"],
                          cwd=str(tmp_path), env=_env(), capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "skrull step 2:" in out
    got = losses(dump)
    assert len(got) == 2 and all(0 < x < 20 for x in got)
