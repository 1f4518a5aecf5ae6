"""The documented torchtitan path, ``torchtitan.train --module skrull_ext.train
--config ...``, trains on CPU: the trainer applies the CPU fixes
and nothing in skrull_ext binds torch.cuda at import (issue 16)."""

import pytest

from tests.integration_tests.launch import losses, torchrun


@pytest.mark.slow
def test_torchtitan_train_module_path_trains_two_steps(tmp_path):
    dump = str(tmp_path / "run")
    proc = torchrun(2, "torchtitan.train", [
        "--module", "skrull_ext.train", "--config", "skrull_llama3_debugmodel", "--dump_folder", dump,
        "--training.steps", "2", "--parallelism.context_parallel_degree", "2", "--metrics.enable_tensorboard",
    ], cwd=str(tmp_path), real=True)  # the user's command, torchrun and all
    assert "skrull step 2:" in proc.stdout + proc.stderr
    got = losses(dump)
    assert len(got) == 2 and all(0 < x < 20 for x in got)
