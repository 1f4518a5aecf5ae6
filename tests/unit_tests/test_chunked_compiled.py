"""overlength = "chunk" in a compiled job: chunks run through the compiled blocks, as an eager run's.

torchtitan compiles each TransformerBlock (``fullgraph=True``). The debug
llama3 (fp32, CPU) with its blocks compiled trains a packed micro-batch (the
blocks' graphs), then documents in chunks of 32 (train/chunked.py), then the
micro-batch again:

- traced (``chunked_loss(traced=True)``, what a compiled job without TP runs:
  train/chunk_path.py; at CP 2 in test_chunked.py): a 4-chunk document compiles the chunk's two
  graphs (the first chunk's, the rest's) and a 251-token document in 8 chunks
  after it compiles none, so the graphs do not grow with the chunks, nor with
  the layers (6 of them share the graphs); its recomputation in backward
  reuses its forward's. Its loss and every gradient are the one-pass
  reference's within the chunk tests' tolerances (loss 1e-6, gradients 1e-5
  relative). A forward under no_grad (validation's) gives its loss again.
- eager (``traced=False``, what an uncompiled job runs): the blocks' own code
  (``force_eager``), bitwise the eager model's chunked run, compiling nothing.
- the micro-batch after the chunks reuses its first graphs.

Graphs and frames are counted from ``torch._dynamo.utils.counters`` (each
recompile is one more graph). Under torchtitan's full activation checkpointing
(AC wraps each block, the wrapper compiled): its chunks take every step of the
plain blocks' and the checkpoint wrapper's besides. The plain blocks' traced
chunks run in tests/integration_tests/test_chunk_dp_run.py's
``test_compiled_chunked_run_matches_eager`` (a trainer run under FSDP: the same
graph bounds, the eager run's losses and gradients). ``aot_eager`` keeps these
free of inductor's C++ builds; inductor on the traced chunks is
tools/compiled_chunks.py --backend inductor. Slow: it compiles a model.
"""

import pytest
import torch

from skrull_ext.attention import build_meta
from skrull_ext.train.chunk_path import chunk_path
from skrull_ext.train.chunked import chunked_loss
from tests.unit_tests.test_chunked import (
    _close, _document, _grads, _loss, _model, CHUNK, chunked, LENGTH, one_pass,
)

# dynamo reads each input's .grad while tracing; a block's input is not a leaf.
pytestmark = pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")

PACKED = [40, 25, 31]  # a micro-batch's local sequences
SHORT = 4 * CHUNK - 5  # a document of 4 chunks


def _micro_batch(model) -> None:
    n = sum(PACKED)
    ids = torch.randint(0, 2048, (1, n), generator=torch.Generator().manual_seed(3))
    pos = torch.cat([torch.arange(k) for k in PACKED])[None]
    model(ids, positions=pos, attention_masks=build_meta(PACKED, [0] * len(PACKED), 0, 1)).square().mean().backward()


def _counts() -> dict:
    c = torch._dynamo.utils.counters
    return {"graphs": c["stats"]["unique_graphs"], "frames": c["frames"]["total"]}


def _added(after: dict, before: dict) -> dict:
    return {k: after[k] - before[k] for k in after}


@pytest.fixture(scope="module")
def compiled_run():
    """Under torchtitan's full AC (AC wraps each block, compile the wrapper, as torchtitan orders them)."""
    torch._dynamo.reset()  # dynamo's caches and counters are process-wide: start this run's from zero
    torch._dynamo.utils.counters.clear()
    model = _model(ac=True)
    for block in model.layers.values():
        block.compile(backend="aot_eager", fullgraph=True)
    _micro_batch(model)
    marks, runs = {"micro_batch": _counts()}, {}
    for name, length, traced in (("eager", LENGTH, False), ("traced_4", SHORT, True), ("traced_8", LENGTH, True)):
        model.zero_grad(set_to_none=True)
        tokens, labels = _document(length)
        out = chunked_loss(model, tokens, labels, CHUNK, _loss, traced=traced)
        out.loss.backward()
        runs[name] = (out.loss.item(), _grads(model), out.chunks)
        marks[name] = _counts()
    with torch.no_grad():
        tokens, labels = _document()
        runs["no_grad"] = chunked_loss(model, tokens, labels, CHUNK, _loss, recompute=False, traced=True).loss.item()
    marks["no_grad"] = _counts()
    _micro_batch(model)
    marks["micro_batch_again"] = _counts()
    return runs, marks


@pytest.mark.slow
def test_traced_chunks_compile_two_graphs_whatever_the_chunks(compiled_run):
    _, marks = compiled_run
    print(f"dynamo: {marks}")
    assert marks["micro_batch"]["graphs"] >= 1  # the micro-batch ran compiled
    assert marks["eager"] == marks["micro_batch"], "the eager chunks compiled a block"
    four = _added(marks["traced_4"], marks["eager"])
    assert four["graphs"] == 2, f"4 chunks: {four} (0: the chunks fell back to eager code)"
    assert marks["traced_8"] == marks["traced_4"], "8 chunks compiled more than 4"
    assert _added(marks["no_grad"], marks["traced_8"])["graphs"] <= 2  # validation's forward: its own grad mode
    assert marks["micro_batch_again"] == marks["no_grad"], "the micro-batch after the chunks recompiled"


@pytest.mark.slow
def test_traced_chunks_equal_one_pass(compiled_run):
    runs, _ = compiled_run
    loss, grads, n = runs["traced_8"]
    assert n == 8 and runs["traced_4"][2] == 4
    worst = _close((loss, grads), one_pass(ac=True))
    eager = runs["eager"]
    vs_eager = max(float((grads[k] - g).norm() / g.norm().clamp_min(1e-30)) for k, g in eager[1].items())
    print(f"traced chunks vs one pass: loss {abs(loss / one_pass(ac=True)[0] - 1):.2g}, gradients {worst:.2g} "
          f"(relative norm, worst parameter); vs eager chunks {vs_eager:.2g}")
    assert abs(runs["no_grad"] - loss) <= 1e-6 * abs(loss)


@pytest.mark.slow
def test_eager_chunks_in_a_compiled_model_are_the_eager_models(compiled_run):
    runs, _ = compiled_run
    loss, grads, n = runs["eager"]
    ref_loss, ref_grads, ref_n = chunked(ac=True)
    assert n == ref_n == 8 and loss == ref_loss
    for name, g in ref_grads.items():
        torch.testing.assert_close(grads[name], g, rtol=0, atol=0, msg=name)


def test_chunk_path_rule():
    """Compiled: traced (at any CP and TP); not compiled: eager, the reason named."""
    assert chunk_path(True).traced and chunk_path(True).reason == "compiled"
    assert not chunk_path(False).traced and "not compiled" in chunk_path(False).reason
    assert "compiled blocks" in chunk_path(True).line() and "eager" in chunk_path(False).line("chunk")
    assert "all-gathers a chunk's K/V again at CP > 1, as priced" in chunk_path(True).line()
    assert "a recompute reuses the K/V its chunk's forward gathered" in chunk_path(False).line()
    assert chunk_path(True).line("truncate") is None  # nothing chunked, nothing to say
