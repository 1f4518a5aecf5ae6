"""Document-aware training FLOPs (skrull_ext/train/doc_flops.py) against hand counts."""

from types import SimpleNamespace

import pytest
import torch

from skrull_ext.train.doc_flops import DocumentFlops, DocumentMeter, linear_weights


class _Toy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4)  # a lookup: no FLOPs
        self.up = torch.nn.Linear(4, 8)
        self.down = torch.nn.Linear(8, 4, bias=False)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight  # tied: one matmul, counted once
        self.again = self.head


def _causal_pairs(lengths):
    """Query-key pairs of causal attention, counted one by one."""
    return sum(1 for s in lengths for q in range(s) for k in range(s) if k <= q)


def test_linear_weights_count_each_matmul_weight_once():
    assert linear_weights([_Toy()]) == 4 * 8 + 8 * 4 + 10 * 4


def test_flops_by_hand():
    config = SimpleNamespace(layers=[0, 1], dim=4, first_attention=SimpleNamespace(n_heads=2, head_dim=4))
    f = DocumentFlops.of_model(config, [_Toy()])
    assert (f.linear_weights, f.layers, f.attention_width) == (104, 2, 8)
    lengths = [3, 2, 1]
    assert _causal_pairs(lengths) == 6 + 3 + 1
    # linear: 6 FLOPs a weight a token (2 forward, 4 backward); attention: 4 a pair a query
    # width a layer forward (QK^T and PV), 12 with the backward.
    assert f(lengths) == 6 * 104 * 6 + 12 * 2 * 8 * 10
    # Cutting a document into pieces keeps its linear FLOPs and loses attention.
    assert f([4]) - f([2, 2]) == 12 * 2 * 8 * (10 - 6)


def test_llama3_debugmodel_counts_its_matmuls():
    from skrull_ext.models.registry import build_model_spec

    spec = build_model_spec("llama3", "debugmodel")
    model = spec.model.build()
    f = DocumentFlops.of_model(spec.model, [model])
    dim, layers, vocab = 256, 6, 2048
    hidden = model.layers["0"].feed_forward.w1.weight.shape[0]
    per_layer = 4 * dim * dim + 3 * dim * hidden  # q, k, v, o (16 heads of 16, no GQA); w1, w2, w3
    assert f.linear_weights == layers * per_layer + dim * vocab
    assert (f.layers, f.attention_width) == (layers, dim)


def test_meter_reports_per_device_rate_and_run_totals():
    f = DocumentFlops(linear_weights=1000, layers=2, attention_width=8)
    meter = DocumentMeter(f, world_size=4, peak_flops=1e6, seq_len=64)
    meter.add([10, 20])
    meter.add([5], cut_documents=1, context_lost_tokens=5)
    m = meter.metrics(seconds=2.0)
    assert m["documents/flops"] == f([10, 20]) + f([5])
    assert m["documents/tflops"] == pytest.approx((f([10, 20]) + f([5])) / 2.0 / 4 / 1e12)
    assert m["documents/mfu(%)"] == pytest.approx(100 * (f([10, 20]) + f([5])) / 2.0 / 4 / 1e6)
    assert m["documents/cut_documents"] == 1 and m["documents/context_lost_tokens"] == 5
    assert meter.metrics(seconds=1.0)["documents/tflops"] == 0.0  # FLOPs since the last log only
    assert "documents/mfu(%)" not in DocumentMeter(f, 1, None, 64).metrics(1.0)  # CPU: no peak, no MFU
    assert "torchtitan's tflops/mfu above price every token at seq_len 64" in meter.line(3, m)
