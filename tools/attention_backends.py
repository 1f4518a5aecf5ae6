"""FlashAttention-2 against cuDNN's ragged attention, on packed buffers of the shipped mix.

    python tools/attention_backends.py --device cuda            # a lent GPU (tools/gpu_checks.sh runs it)
    python tools/attention_backends.py --device cpu --tokens 512 --repeats 1   # the plumbing only

Why: GPU run 9 (docs/results/gpu.md, "ninth run") put half of a Skrull step's
device time in FlashAttention-2's kernels, and every batching sat at 30-32%
document-aware MFU. FlashAttention-3 cannot be installed on the GPU image, but
torch ships cuDNN's attention with cumulative sequence offsets (the ragged
layout ``varlen_attn`` would call if its ``_should_use_cudnn`` did not return
False). This times both on the trainer's packed buffers before a kernel is
built on it: a one-process, CP 1 buffer is all local, so every document's
queries and keys have the same length and the top-left causal mask cuDNN
offers is the bottom-right one flash attention applies.

Per buffer (documents drawn in order from a length file, each cut at
``--max-len`` and the last at the buffer's end), per backend: forward and
backward through autograd (the aten ops' own derivatives), timed as the
profiler times (profile/ranks.py median_us: the device synchronised around
each pass), the median of ``--repeats`` after ``--warmup``; TFLOP/s at the project's
document-aware count (train/doc_flops.py: 12 H D per causal query-key pair,
forward and backward), each backend's time as a ratio of flash's, and its
first pass on the buffer alone (timed before the warm-up): cuDNN builds an
execution graph per layout (in PyTorch's aten/src/ATen/native/cudnn/MHA.cpp
as read here, a cache key of the number of sequences, the longest and the
tensors' sizes), which the median of a repeated buffer hides and training,
a new layout every micro-batch (once for all its layers), pays. The backends:

- ``flash``: ``aten._flash_attention_forward`` with ``cum_seq_q/k``, what
  ``varlen_attn`` (the ``varlen`` kernel, attention/kernels.py) calls; its
  K/V heads stay grouped (GQA).
- ``cudnn``: ``aten._cudnn_attention_forward`` with the same offsets and
  grouped K/V heads, where cuDNN takes them (else the row says why).
- ``cudnn-expanded``: the same with K/V repeated to the query heads, which
  any cuDNN takes (what a kernel would do if grouped heads were refused).
- ``reference`` (CPU's only row): one SDPA per document, float32; the dry run
  checks the plumbing, no kernel's speed.

Agreement: on a small buffer every backend's output and gradients against a
float64 per-document reference, the largest absolute error of each tensor
relative to that tensor's largest magnitude (bf16 keeps 8 bits: 4e-3 a
value, a few times that after a sum; a wrong mask or head mapping is off by
O(1)). A backend past 3e-2 is not timed, except flash, the kernel the trainer
runs: its rows are the baseline either way, marked. A measurement script, not a test: its pure
parts are tested in tests/unit_tests/test_attention_backends_tool.py.
"""

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

DEFAULT_MIX = "mix_sharegpt_conv95+longbench_en5"
DEFAULT_TOKENS = (16384, 65536, 131072)
"""One rank's buffer at the job's row length, and up to the BucketSize run 9's profile gave (133,119)."""


def draw_buffer(pool: np.ndarray, tokens: int, max_len: int, rng: np.random.Generator) -> list[int]:
    """Documents drawn from ``pool`` until ``tokens`` are filled: each cut at ``max_len`` (the job's
    SFT filter), the last cut at the buffer's end, none empty."""
    if tokens < 1 or max_len < 1:
        raise ValueError(f"tokens and max_len must be >= 1, got {tokens} and {max_len}")
    out: list[int] = []
    left = tokens
    while left > 0:
        n = min(int(pool[rng.integers(len(pool))]), max_len, left)
        if n > 0:
            out.append(n)
            left -= n
    return out


def attention_flops(lengths: list[int], heads: int, head_dim: int) -> float:
    """One layer's forward+backward attention FLOPs at the project's document-aware count."""
    return 12.0 * heads * head_dim * sum(n * (n + 1) / 2 for n in lengths)


def cum_seq(lengths: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor([0, *np.cumsum(lengths).tolist()], dtype=torch.int32, device=device)


@dataclass
class Buffer:
    lengths: list[int]
    q: torch.Tensor  # [T, H, D]
    k: torch.Tensor  # [T, Hkv, D]
    v: torch.Tensor
    grad: torch.Tensor  # [T, H, D], the output's gradient
    cu: torch.Tensor

    @property
    def max_len(self) -> int:
        return max(self.lengths)


def make_buffer(lengths: list[int], heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                device: torch.device, seed: int = 0) -> Buffer:
    g = torch.Generator(device="cpu").manual_seed(seed)
    t = sum(lengths)

    def rand(h: int) -> torch.Tensor:
        return torch.randn(t, h, head_dim, generator=g).to(device=device, dtype=dtype)

    return Buffer(lengths, rand(heads), rand(kv_heads), rand(kv_heads), rand(heads), cum_seq(lengths, device))


def _expand(x: torch.Tensor, heads: int) -> torch.Tensor:
    return x.repeat_interleave(heads // x.size(1), dim=1)


def run_flash(q, k, v, b: Buffer) -> torch.Tensor:
    return torch.ops.aten._flash_attention_forward(q, k, v, b.cu, b.cu, b.max_len, b.max_len, 0.0, True, False)[0]


def run_cudnn(q, k, v, b: Buffer) -> torch.Tensor:
    return torch.ops.aten._cudnn_attention_forward(q, k, v, None, b.cu, b.cu, b.max_len, b.max_len, True, 0.0, True,
                                                   False)[0]


def run_cudnn_expanded(q, k, v, b: Buffer) -> torch.Tensor:
    return run_cudnn(q, _expand(k, q.size(1)), _expand(v, q.size(1)), b)


def run_reference(q, k, v, b: Buffer) -> torch.Tensor:
    """One causal SDPA per document (heads first), K/V repeated to the query heads: the oracle."""
    outs, start = [], 0
    for n in b.lengths:
        s = slice(start, start + n)
        qq, kk, vv = (x[s].transpose(0, 1) for x in (q, _expand(k, q.size(1)), _expand(v, q.size(1))))
        outs.append(F.scaled_dot_product_attention(qq, kk, vv, is_causal=True).transpose(0, 1))
        start += n
    return torch.cat(outs)


BACKENDS: dict[str, Callable] = {"flash": run_flash, "cudnn": run_cudnn, "cudnn-expanded": run_cudnn_expanded,
                                 "reference": run_reference}


def forward_backward(run: Callable, b: Buffer, dtype: torch.dtype | None = None):
    """(output, dq, dk, dv) of one pass, in ``dtype`` if given (the float64 oracle)."""
    q, k, v = (x.detach().to(dtype or x.dtype).requires_grad_() for x in (b.q, b.k, b.v))
    out = run(q, k, v, b)
    out.backward(b.grad.to(out.dtype))
    return out.detach(), q.grad, k.grad, v.grad


def max_error(run: Callable, b: Buffer, oracle: tuple) -> float:
    """The largest of (output, dq, dk, dv)'s max |error| over its oracle's max |value|."""
    got = forward_backward(run, b)
    return max(float((g.double() - o).abs().max() / o.abs().max().clamp_min(1e-30)) for g, o in zip(got, oracle))


def time_pass(run: Callable, b: Buffer, warmup: int, repeats: int) -> float:
    """Median milliseconds of one forward+backward: the profiler's own timing (profile/ranks.py
    median_us: the device synchronised before and after each call, wall clock)."""
    from skrull_ext.profile.ranks import median_us

    return median_us(lambda: forward_backward(run, b), b.q.device, warmup, repeats)[0] / 1e3


def _why(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:160]}" if str(e) else type(e).__name__


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--lengths", default=DEFAULT_MIX, help="a shipped length file or a path (skrull_ext.lengths)")
    p.add_argument("--tokens", type=int, nargs="+", default=list(DEFAULT_TOKENS), help="one buffer per total")
    p.add_argument("--max-len", type=int, default=16384, help="each document cut here (the GPU job's max_len)")
    p.add_argument("--heads", type=int, default=14)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--backends", nargs="+", choices=list(BACKENDS), default=None,
                   help="default: flash cudnn cudnn-expanded on CUDA, reference on CPU")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    from skrull_ext import lengths as length_files
    from skrull_ext.errors import DataError

    if min(a.tokens) < 1 or a.max_len < 1 or a.warmup < 0 or a.repeats < 1:
        p.error(f"--tokens {a.tokens} and --max-len {a.max_len} must be >= 1, --warmup {a.warmup} >= 0, "
                f"--repeats {a.repeats} >= 1")
    if a.heads % a.kv_heads:
        p.error(f"--heads {a.heads} is not a multiple of --kv-heads {a.kv_heads}")
    device = torch.device(a.device)
    cuda = device.type == "cuda"
    backends = a.backends or (["flash", "cudnn", "cudnn-expanded"] if cuda else ["reference"])
    dtype = torch.bfloat16 if cuda else torch.float32
    try:
        pool = np.asarray(length_files.load(a.lengths, key="--lengths"))
    except DataError as e:
        p.error(str(e))
    print(f"torch {torch.version.__version__}, {torch.cuda.get_device_name(device) if cuda else 'cpu'}"
          + (f", cuDNN {torch.backends.cudnn.version()}" if cuda else "")
          + f"; heads {a.heads} over {a.kv_heads} K/V heads of {a.head_dim}, {dtype}, lengths {a.lengths}")

    # Agreement on a small buffer first: a backend that disagrees is not timed.
    small = make_buffer([300, 200, 77, 1], a.heads, a.kv_heads, a.head_dim, dtype, device, a.seed)
    oracle = forward_backward(run_reference, small, torch.float64)
    usable = []
    for name in backends:
        try:
            err = max_error(BACKENDS[name], small, oracle)
        except Exception as e:  # noqa: BLE001 - a backend this torch/cuDNN refuses is a row, not a crash
            print(f"agreement {name}: refused ({_why(e)})")
            continue
        ok = err < (3e-2 if dtype == torch.bfloat16 else 1e-5)
        print(f"agreement {name}: max |error| / max |value| {err:.2e} against float64 (output, dq, dk, dv)"
              + ("" if ok else " -- DISAGREES" + (", timed as the baseline" if name == "flash" else ", not timed")))
        if ok or name == "flash":
            usable.append(name)

    rng = np.random.default_rng(a.seed)
    print("\n| tokens | documents | longest | backend | fwd+bwd ms | TFLOP/s | ms x flash | first pass ms |")
    print("|---|---|---|---|---|---|---|---|")
    for tokens in a.tokens:
        lens = draw_buffer(pool, tokens, a.max_len, rng)
        b = make_buffer(lens, a.heads, a.kv_heads, a.head_dim, dtype, device, a.seed)
        flops = attention_flops(lens, a.heads, a.head_dim)
        base = None
        for name in usable:
            try:
                first = time_pass(BACKENDS[name], b, 0, 1)
                ms = time_pass(BACKENDS[name], b, a.warmup, a.repeats)
            except Exception as e:  # noqa: BLE001
                print(f"| {tokens:,} | {len(lens)} | {max(lens):,} | {name} | refused: {_why(e)} | - | - | - |")
                continue
            base = ms if name == "flash" else base
            ratio = f"x{ms / base:.3f}" if base else "-"
            print(f"| {tokens:,} | {len(lens)} | {max(lens):,} | {name} | {ms:.2f} | {flops / ms / 1e9:.3g} | {ratio} "
                  f"| {first:.2f} |")
        del b
        if cuda:
            torch.cuda.empty_cache()
    return 0 if usable else 1


if __name__ == "__main__":
    sys.exit(main())
