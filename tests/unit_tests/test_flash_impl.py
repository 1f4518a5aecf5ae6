# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""DACP installation selects torchtitan's flash attention implementation for the
DACP varlen kernel (FA3 on Hopper), as torchtitan's VarlenAttention does.

The GPU's capability is what decides, so on this CPU machine it is stood in
for by torchtitan's own probe returning what it returns on an H100; torch's
process-wide activation is recorded instead of loading FA3's library.
"""

import pytest
import torch.nn.attention
from torchtitan.models.llama3 import model_registry

from torchtitan_patches import dacp_attention as install


@pytest.fixture
def flash(monkeypatch):
    state = {"active": None, "calls": []}

    def activate(impl):
        state["calls"].append(impl)
        state["active"] = impl

    monkeypatch.setattr(torch.nn.attention, "activate_flash_attention_impl", activate)
    monkeypatch.setattr(torch.nn.attention, "current_flash_attention_impl", lambda: state["active"])
    return state


def test_cpu_keeps_torchs_default(flash):
    assert install.activate_flash_attention_impl() is None
    assert flash["calls"] == []


def test_hopper_gets_fa3_once(flash, monkeypatch):
    import torchtitan.tools.utils

    monkeypatch.setattr(torchtitan.tools.utils, "get_cuda_flash_attention_impl", lambda: "FA3")
    assert install.activate_flash_attention_impl() == "FA3"
    assert install.activate_flash_attention_impl() == "FA3"
    assert flash["calls"] == ["FA3"]


@pytest.mark.parametrize("kernel, activated", [("auto", ["FA3"]), ("varlen", ["FA3"]), ("dense", []),
                                               ("segments", [])])
def test_install_activates_only_for_varlen(flash, monkeypatch, kernel, activated):
    import torchtitan.tools.utils

    monkeypatch.setattr(torchtitan.tools.utils, "get_cuda_flash_attention_impl", lambda: "FA3")
    model = model_registry("debugmodel").model.build()
    installed = install.install_dacp_attention([model], None, kernel=kernel)
    assert installed and all(m.kernel == kernel for m in installed)
    assert flash["calls"] == activated
