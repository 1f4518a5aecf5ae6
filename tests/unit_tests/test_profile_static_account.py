"""The profile's static account against what a rank holds, at FSDP 2 over gloo (profile/memory.py).

The memory ladder's model is FSDP-wrapped as the trainer's is (profile/model.py), so every
step it measures gathers each unit's parameters (and makes their gradients before the
reduce-scatter) above its starting point: FSDP's unsharded buffers are in the fitted peak,
as they are in the training check's peak above the step's start (profile/train_check.py).
The static account must then be the sharded tensors a rank keeps between steps and nothing
more; it once added the buffers again (13.0 MiB on the debug job at FSDP 2), so a profile's
prediction exceeded what a run measures by that much.
"""

import pytest
import torch


@pytest.mark.slow
def test_static_account_is_what_a_rank_holds_and_the_peak_holds_fsdp_buffers(tmp_path):
    """Two gloo ranks, the debug job (6.16M float32 parameters, AdamW): the account is exactly the
    rank's half of parameters, gradients and optimizer state (47.0 MiB; with FSDP's buffers added
    it read 60.0), and the ladder's peak at 256 tokens holds at least the head's unsharded weight
    (the [norm, lm_head] unit stays gathered from the forward to the backward)."""
    from tests.integration_tests import forked
    from tests.integration_tests.launch import _env

    # The ranks are forks of the suite's warm process (forked.py), not spawned: torch imported once.
    rc, out = forked.launch(2, "tests.unit_tests.static_account_worker", [str(tmp_path)], str(tmp_path), _env(), 600)
    assert rc == 0, out[-8000:]
    for rank in range(2):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        print(f"rank {rank}: {got}")
        assert got["fsdp_degree"] == 2
        assert got["account"] == got["held"]
        assert got["peak"] - got["gathered_before"] >= got["head_bytes"]
