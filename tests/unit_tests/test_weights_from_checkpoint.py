"""Which jobs skip the parameters' random initialization (their start-up load overwrites every
one), and that the skip leaves parameters alone, still initializes buffers, and ends with the
trainer's construction. That the skipping run trains bitwise as before: the parity tests compare
such runs (seed checkpoint loads) with torchtitan's reference."""

import os
from types import SimpleNamespace

import pytest
import torch
from torchtitan.protocols.module import Module

from skrull_ext.train.job.weights_from_checkpoint import params_loaded_whole
from torchtitan_patches.param_init import skip_param_init


def _config(tmp_path, **ckpt):
    base = dict(enable=True, create_seed_checkpoint=False, initial_load_in_hf=False,
                initial_load_path="/seed/step-0", exclude_from_loading=[], folder="checkpoint", load_step=-1)
    return SimpleNamespace(checkpoint=SimpleNamespace(**{**base, **ckpt}), dump_folder=str(tmp_path),
                           lora=SimpleNamespace(enable=False))


def _save(tmp_path, step: int, hf: bool) -> None:
    path = os.path.join(tmp_path, "checkpoint", f"step-{step}")
    os.makedirs(path)
    open(os.path.join(path, "model.safetensors.index.json" if hf else ".metadata"), "w").close()


def test_a_dcp_seed_load_skips(tmp_path):
    assert params_loaded_whole(_config(tmp_path))


@pytest.mark.parametrize("change", [
    dict(enable=False), dict(create_seed_checkpoint=True), dict(initial_load_in_hf=True),
    dict(initial_load_path=None), dict(exclude_from_loading=["model"]), dict(folder="s3://bucket/ckpt"),
])
def test_loads_that_may_leave_a_parameter_initialize(tmp_path, change):
    assert not params_loaded_whole(_config(tmp_path, **change))


def test_lora_initializes(tmp_path):
    config = _config(tmp_path)
    config.lora.enable = True
    assert not params_loaded_whole(config)


def test_the_step_the_folder_loads_decides(tmp_path):
    _save(tmp_path, 2, hf=False)
    assert params_loaded_whole(_config(tmp_path))  # resumes from a full save
    _save(tmp_path, 4, hf=True)
    assert not params_loaded_whole(_config(tmp_path))  # the newest is a HF folder
    assert params_loaded_whole(_config(tmp_path, load_step=2))


class _Tiny(Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(3))
        self.register_buffer("cache", torch.zeros(2), persistent=False)

    def reset_parameters(self):
        self.w.data.fill_(1.0)

    def _init_self_buffers(self, *, buffer_device=None):
        self.cache.fill_(2.0)


def test_the_skip_leaves_parameters_and_initializes_buffers(tmp_path):
    m = _Tiny()
    with skip_param_init(params_loaded_whole(_config(tmp_path))) as skipped:
        m.init_states()
    assert skipped
    assert torch.equal(m.w.detach(), torch.zeros(3)) and torch.equal(m.cache, torch.full((2,), 2.0))
    m.init_states()  # after the trainer's construction, initialization is back
    assert torch.equal(m.w.detach(), torch.ones(3))


def test_no_skip_initializes_and_a_raise_restores(tmp_path):
    m = _Tiny()
    with skip_param_init(params_loaded_whole(_config(tmp_path, enable=False))) as skipped:
        m.init_states()
    assert not skipped and torch.equal(m.w.detach(), torch.ones(3))
    with pytest.raises(RuntimeError), skip_param_init(True):
        raise RuntimeError("trainer construction failed")
    m.w.data.zero_()
    m.init_states()
    assert torch.equal(m.w.detach(), torch.ones(3))
