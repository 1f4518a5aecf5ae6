"""overlength = "chunk" in a compiled job: a chunked document trains as in an eager one.

torchtitan compiles each TransformerBlock (``fullgraph=True``). The debug
llama3 (fp32, CPU) with its blocks compiled trains a packed micro-batch (the
blocks' compiled graphs), then the 251-token document in 8 chunks of 32
(train/chunked.py), then the micro-batch again. The chunks run the blocks'
own eager code (``force_eager`` around each chunk's forward and its
recomputation), so:

- the document's loss and every gradient are the eager chunked run's,
  bitwise (with and without torchtitan's full activation checkpointing),
  and the one-pass reference's within the chunk tests' tolerances
  (loss 1e-6, gradients 1e-5 relative);
- the chunks compile nothing: dynamo's counters of graphs compiled (each
  recompile is one more) and frames it compiled are the same after the
  document as before it, and the second micro-batch reuses
  the first one's graphs (counted from ``torch._dynamo.utils.counters``).

``aot_eager`` keeps the quick lane free of inductor's C++ builds; inductor on
real processes is tests/integration_tests/test_chunk_dp_run.py
(``test_compiled_chunked_run_matches_eager``). The full-AC case is in the
slow lane: it compiles a second model (about a minute on this machine).
"""

import pytest
import torch

from skrull_ext.attention import build_meta
from skrull_ext.train.chunked import chunked_loss
from tests.unit_tests.test_chunked import _close, _document, _grads, _loss, _model, CHUNK, chunked, one_pass

# dynamo reads each input's .grad while tracing; a block's input is not a leaf.
pytestmark = pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")

PACKED = [40, 25, 31]  # a micro-batch's local sequences


def _micro_batch(model) -> None:
    n = sum(PACKED)
    ids = torch.randint(0, 2048, (1, n), generator=torch.Generator().manual_seed(3))
    pos = torch.cat([torch.arange(k) for k in PACKED])[None]
    model(ids, positions=pos, attention_masks=build_meta(PACKED, [0] * len(PACKED), 0, 1)).square().mean().backward()


def _counts() -> dict:
    c = torch._dynamo.utils.counters
    return {"graphs": c["stats"]["unique_graphs"], "frames": c["frames"]["total"]}


@pytest.fixture(scope="module", params=[False, pytest.param(True, marks=pytest.mark.slow)], ids=["plain", "full_ac"])
def compiled_run(request):
    """Under torchtitan's full AC too (AC wraps each block, compile the wrapper, as torchtitan orders them)."""
    torch._dynamo.reset()  # dynamo's caches and counters are process-wide: start this run's from zero
    torch._dynamo.utils.counters.clear()
    model = _model(ac=request.param)
    for block in model.layers.values():
        block.compile(backend="aot_eager", fullgraph=True)
    _micro_batch(model)
    before = _counts()
    model.zero_grad(set_to_none=True)
    tokens, labels = _document()
    out = chunked_loss(model, tokens, labels, CHUNK, _loss)
    out.loss.backward()
    result = (out.loss.item(), _grads(model))
    after_chunks = _counts()
    _micro_batch(model)
    return result, out.chunks, before, after_chunks, _counts(), request.param


def test_compiled_chunked_equals_eager_chunked_and_one_pass(compiled_run):
    (loss, grads), n, *_, ac = compiled_run
    ref_loss, ref_grads, ref_n = chunked(ac=ac)
    assert n == ref_n == 8
    assert loss == ref_loss
    for name, g in ref_grads.items():
        torch.testing.assert_close(grads[name], g, rtol=0, atol=0, msg=name)
    _close((loss, grads), one_pass(ac=ac))


def test_chunks_compile_nothing_and_micro_batches_keep_their_graphs(compiled_run):
    _, _, before, after_chunks, after, _ = compiled_run
    print(f"dynamo: after the micro-batch {before}, after the chunked document {after_chunks}, "
          f"after the second micro-batch {after}")
    assert before["graphs"] >= 1  # the micro-batch ran compiled
    assert after_chunks == before, "the chunked document compiled or recompiled a block"
    assert after == before, "the micro-batch after the chunks recompiled"
