"""tools/attention_backends.py: its buffers, FLOP count and oracle, and its CPU run (the GPU is the point)."""

import numpy as np
import pytest
import torch

from skrull_ext.attention import build_meta, dacp_attention
from tests.unit_tests.tool_module import load_tool

tool = load_tool("attention_backends")


def test_draw_buffer_cuts_at_max_len_and_the_end():
    pool = np.array([5, 30, 2])
    rng = np.random.default_rng(0)
    lens = tool.draw_buffer(pool, 40, 10, rng)
    assert sum(lens) == 40 and max(lens) <= 10 and min(lens) >= 1
    # the same draws as the pool's, each cut at 10 (the last at what is left)
    rng = np.random.default_rng(0)
    expect, left = [], 40
    while left:
        n = min(int(pool[rng.integers(3)]), 10, left)
        expect.append(n)
        left -= n
    assert lens == expect
    with pytest.raises(ValueError, match="tokens and max_len must be >= 1"):
        tool.draw_buffer(pool, 0, 10, rng)


def test_attention_flops_counts_causal_pairs():
    # 12 H D per pair; a document of n tokens has n (n + 1) / 2 causal pairs
    assert tool.attention_flops([1, 3], heads=2, head_dim=4) == 12 * 2 * 4 * (1 + 6)


def test_reference_equals_the_products_dense_kernel():
    """The tool's oracle (one SDPA per document, K/V heads repeated) against DACP's dense kernel at CP 1."""
    lens = [7, 1, 12]
    b = tool.make_buffer(lens, heads=4, kv_heads=2, head_dim=8, dtype=torch.float64, device=torch.device("cpu"))
    got = tool.run_reference(b.q, b.k, b.v, b)
    meta = build_meta(lens, [0] * len(lens), 0, 1)
    want = dacp_attention(b.q.transpose(0, 1), b.k.transpose(0, 1), b.v.transpose(0, 1), meta, kernel="dense")
    torch.testing.assert_close(got, want.transpose(0, 1), rtol=1e-12, atol=1e-12)
    assert b.cu.tolist() == [0, 7, 8, 20]


def test_cpu_run_prints_agreement_and_a_row(capsys):
    assert tool.main(["--device", "cpu", "--tokens", "64", "--repeats", "1", "--warmup", "0",
                      "--heads", "4", "--kv-heads", "2", "--head-dim", "8"]) == 0
    out = capsys.readouterr().out
    assert "agreement reference: max |error| / max |value| " in out and "DISAGREES" not in out
    assert "| 64 |" in out and "| reference |" in out


@pytest.mark.parametrize("argv, says", [
    (["--tokens", "0"], "--tokens [0] and --max-len 16384 must be >= 1"),
    (["--heads", "5"], "--heads 5 is not a multiple of --kv-heads 2"),
    (["--lengths", "no_such_file"], "--lengths: 'no_such_file' is neither a shipped length file"),
])
def test_wrong_flags_name_themselves(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        tool.main(["--device", "cpu", *argv])
    assert e.value.code == 2 and says in capsys.readouterr().err


def test_agreement_catches_a_wrong_mask_and_passes_the_oracle():
    """The agreement measure: 0 for the oracle itself, O(1) for attention without its causal mask."""
    b = tool.make_buffer([9, 4], heads=4, kv_heads=2, head_dim=8, dtype=torch.float32, device=torch.device("cpu"))
    oracle = tool.forward_backward(tool.run_reference, b, torch.float64)

    def no_mask(q, k, v, buf):
        k, v = tool._expand(k, q.size(1)), tool._expand(v, q.size(1))
        return torch.nn.functional.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)).transpose(0, 1)

    assert tool.max_error(tool.run_reference, b, oracle) < 1e-5
    assert tool.max_error(no_mask, b, oracle) > 0.1
