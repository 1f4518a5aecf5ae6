# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""Inductor's C++ code for what Skrull hands torch.compile, in one process:
the suite's inductor runs of them.

- Blocks around the ``skrull::dacp_attention`` custom op (attention/compiled.py):
  test_dacp_compiled.py's checks (outputs and gradients those of eager, one
  graph per shape kind, no tape left, the eager counters) with inductor's
  static, dynamic and no_grad graphs.
- An all-local micro-batch, whose attention is traced into the block
  (attention/local_only.py): test_dacp_local_only.py's check.
- The in-forward head chunk's loss and logits' gradient (train/head_grad.py),
  which a job compiling its loss compiles: against eager, at two chunk sizes.

Why here, on toy sizes: the CP 2 training runs that compile the same pieces
(tests/integration_tests/test_compile.py) trace under ``aot_eager`` (the same
dynamo graphs and AOT autograd), because two ranks each building inductor's
C++ cold cost CI about 120 s; the op's K/V exchange is eager code inside the
op, the same whichever backend compiled the block around it. One file, so
that one worker pays inductor's cold start (about 15 s of CPU) once; inductor
compiles in this process (``compile_threads = 1``: no pool of compile workers
to start for a few kernels).
"""

import pytest
import torch

from tests.unit_tests.test_dacp_compiled import compiled_runs, leaves_no_tape_and_counts_like_eager, matches_eager
from tests.unit_tests.test_dacp_local_only import traces_the_local_attention

pytestmark = [pytest.mark.slow,  # inductor builds C++
              pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")]


@pytest.fixture(autouse=True)
def one_process():
    """Inductor in this process, and the vector ISAs the CPU reports taken as buildable.

    ``vec_isa_ok``: on a cold cache inductor proves each ISA the CPU's flags list (AVX-512 with
    VNNI and AMX, AVX-512, AVX2 on CI's box) by building a probe library with its flags and loading
    it in a fresh Python (10 probes, ~16 of this file's 59 CPU s); trusted, 6 remain and it picks the
    same ISA from the same list (the flags' own checks: VNNI, AMX), so the blocks' kernels are
    the ones it would build. The probe is torch's, not what these tests are about."""
    import torch._inductor.config

    with torch._inductor.config.patch(compile_threads=1, **{"cpp.vec_isa_ok": True}):
        yield


def test_dacp_op_in_compiled_blocks():
    runs = compiled_runs("inductor")
    matches_eager(runs)
    leaves_no_tape_and_counts_like_eager(runs)


def test_local_only_attention_traced_into_the_block():
    traces_the_local_attention("inductor")


def test_in_forward_chunk_step():
    """Inductor's fused log-softmax, gather and in-place scatter of the gradient: the eager
    function's loss and gradient, ignored labels included, static then dynamic in the tokens."""
    from skrull_ext.data.sources.synthetic import IGNORE_INDEX
    from skrull_ext.train.head_grad import linear_cross_entropy_grad

    torch._dynamo.reset()
    step = torch.compile(linear_cross_entropy_grad, backend="inductor")
    g = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(64, 16, generator=g), torch.randn(64, generator=g)
    for n in (6, 5):
        h = torch.randn(n, 16, generator=g)
        labels = torch.randint(0, 64, (n,), generator=g)
        labels[1] = IGNORE_INDEX
        scale = torch.tensor(0.1)
        got, want = step(h, weight, bias, labels, scale), linear_cross_entropy_grad(h, weight, bias, labels, scale)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
        assert want[1][1].abs().sum() == 0  # the ignored row has no gradient: the check sees it
