"""Experiment, not product: could a chunked document's chunks run inside torchtitan's compiled blocks?

The product runs each chunk through the blocks' eager code in a compiled job
(skrull_ext/train/chunked.py; docs/design/chunked.md, "Not done"): traced as
it stands, ``ChunkAttention`` compiles a graph per layer and chunk index. This
script restates the chunk schedule (a labelled restatement, as
``chunked_loss``: checkpointed chunks, the prefix K/V carried as the chunk's
inputs and outputs) with what a traceable variant would change:

- each layer's prefix on its attention module (``chunk_prefix``: one joined
  tensor, or None for the first chunk) and its own K/V out the same way
  (``chunk_kept``), so nothing in the trace looks a layer up;
- the chunk's query positions a tensor, not an int offset;
- the chunk's forward and its recomputation compiled dynamic from the start
  (``assume_static_by_default = False``) and without duck sizing, so the
  recomputation in backward picks the graph its forward ran (else
  torch.utils.checkpoint fails: "A different number of tensors was saved",
  pytorch issue 166926).

It trains the debug llama3's 251-token document in 8 chunks of 32, eager and
with each block compiled, against the document in one pass. Measured on the
2-core CPU machine (2026-11-29):

    python tools/compiled_chunks_probe.py inductor
    eager    grad err vs one pass 3.4e-07
    compiled grad err vs one pass 4.3e-07, 2 graphs (first chunk, the rest) for 6 layers x 8 chunks

Not in the product because: the joined prefix is one more copy of the
prefix K/V in each chunk's forward, which the memory rule
(chunk_cost.peak_bytes_beyond_chunk) does not count and nobody measured; at
CP > 1 the K/V gather (attention/exchange.py) is not traceable; under TP the
trace meets DTensors; and the module attributes are state outside the
``attention_masks`` the eager path keeps everything in.
"""

import sys

import torch
import torch.fx.experimental._config as fx_config
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from skrull_ext.attention import build_meta
from skrull_ext.attention import module as attention_module
from skrull_ext.data.sources.synthetic import IGNORE_INDEX
from skrull_ext.models.registry import build_model_spec
from skrull_ext.train.chunked import attention_layers, chunk_bounds
from torchtitan_patches.dacp_attention import install_dacp_attention

LENGTH, CHUNK, VOCAB = 251, 32, 2048


class TracedChunk:
    """A chunk's ``attention_masks``: its query positions; the prefix lives on each layer."""

    def __init__(self, q_pos: torch.Tensor) -> None:
        self.q_pos = q_pos

    def attend(self, layer, q, k, v, scale):
        own = torch.stack([k[0].transpose(0, 1), v[0].transpose(0, 1)])  # [2, Hkv, L, D]
        kv = own if layer.chunk_prefix is None else torch.cat([layer.chunk_prefix, own], dim=2)
        layer.chunk_kept = own
        mask = torch.arange(kv.size(2), device=q.device)[None, :] <= self.q_pos[:, None]
        out = F.scaled_dot_product_attention(q.transpose(1, 2), kv[0][None], kv[1][None], attn_mask=mask,
                                             scale=scale, enable_gqa=kv.size(1) != q.size(2))
        return out.transpose(1, 2)


def _model(compile_backend: str | None):
    torch.manual_seed(0)
    model = build_model_spec("llama3", "debugmodel").model.build()
    model.init_states()
    install_dacp_attention([model], None, kernel="dense")
    if compile_backend:
        for block in model.layers.values():
            block.compile(backend=compile_backend, fullgraph=True)
    return model


def _loss(pred, labels):
    return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum")


def _document():
    ids = torch.randint(0, VOCAB, (LENGTH + 1,), generator=torch.Generator().manual_seed(1))
    labels = ids[1:].clone()
    labels[:7] = IGNORE_INDEX
    return ids[:-1], labels


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def chunked(model, tokens, labels):
    layers = attention_layers([model])
    prefix: list[list[torch.Tensor]] = [[] for _ in layers]
    total = None
    for a, b in chunk_bounds(tokens.numel(), CHUNK):
        c = len(prefix[0])

        def run(*flat, tok=tokens[a:b].clone(), lab=labels[a:b].clone(), pos=torch.arange(a, b), c=c):
            for i, m in enumerate(layers):
                m.chunk_prefix = torch.cat(flat[i * c:(i + 1) * c], dim=2) if c else None
            with torch._dynamo.config.patch(assume_static_by_default=False), fx_config.patch(use_duck_shape=False):
                pred = model(tok[None], positions=pos[None], attention_masks=TracedChunk(pos))
            return (_loss(pred, lab[None]), *[m.chunk_kept for m in layers])

        out = checkpoint(run, *[kv for per in prefix for kv in per], use_reentrant=False)
        for i, kv in enumerate(out[1:]):
            prefix[i].append(kv)
        total = out[0] if total is None else total + out[0]
    return total


def main() -> None:
    backend = sys.argv[1] if len(sys.argv) > 1 else "aot_eager"
    attention_module.ChunkAttention = TracedChunk  # DacpAttention dispatches a chunk by this class
    tokens, labels = _document()
    ref_model = _model(None)
    _loss(ref_model(tokens[None], positions=torch.arange(LENGTH)[None],
                    attention_masks=build_meta([LENGTH], [0], 0, 1)), labels[None]).backward()
    ref = _grads(ref_model)
    for name, compiled in (("eager", None), ("compiled", backend)):
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        model = _model(compiled)
        chunked(model, tokens, labels).backward()
        got = _grads(model)
        err = max(float((got[k] - g).norm() / g.norm()) for k, g in ref.items())
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        print(f"{name:8} grad err vs one pass {err:.2g}" + (f", {graphs} graphs" if compiled else ""))


if __name__ == "__main__":
    main()
