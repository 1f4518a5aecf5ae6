"""The head and loss forward+backward, side by side: ``[loss] head_backward`` "recompute" against "in_forward".

    nice -n 10 python tools/head_backward_bench.py --tokens 2048 --chunk 512 --repeats 5
    # on a lent GPU (the H200 profile's chunk, the shipped job's compiled loss):
    python tools/head_backward_bench.py --device cuda --dtype bfloat16 --compile --tokens 16384 --chunk 3533

One micro-batch's hidden states through a Qwen2.5-0.5B-shaped head (896 -> 151,936, no bias)
and torchtitan's cross-entropy, in chunks of ``--chunk`` tokens, as ``ChunkedHeadLoss`` runs
them in a job (train/head_loss.py): each chunk checkpointed (its head's matmul again in
backward: four matmuls a chunk) against each chunk's gradients computed in forward
(train/head_grad.py: three). The two alternate, ``--warmup`` rounds then ``--repeats`` timed,
so a shared machine's load falls on both; prints each mode's median milliseconds, the ratios
in_forward / recompute of the medians and of the fastest runs (the least disturbed on a shared
machine), and the ratio the matmuls alone would give (3/4). The loss and
gradients of the two are checked equal first (fp32: 1e-6 / 1e-5 relative).

On CPU this is the CPU's answer (float32 by default, the CPU's matmul and elementwise rates,
its caches): the H200 runs bf16 GEMMs at ~650 TFLOP/s, where the head's matmuls and the loss's
memory-bound elementwise passes weigh differently; ``--device cuda`` times the GPU's (synchronized
around each pass), with the chunk's loss compiled as the GPU job compiles it (``--compile``).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from torchtitan.config import CompileConfig

from skrull_ext.train.head_loss import ChunkedHeadLoss


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _run(loss_fn: ChunkedHeadLoss, mode: str, head: torch.nn.Linear, hidden: torch.Tensor, labels: torch.Tensor,
         divisor: torch.Tensor) -> tuple[float, torch.Tensor, torch.Tensor, float]:
    """(milliseconds of one forward+backward, the hidden states' and the head's gradients, the loss)."""
    loss_fn.set_head_backward(mode)
    head.weight.grad = None
    h = hidden.detach().requires_grad_()
    _sync(h.device)
    start = time.perf_counter()
    loss, _ = loss_fn(h, labels, divisor)
    loss.backward()
    _sync(h.device)
    ms = (time.perf_counter() - start) * 1e3
    return ms, h.grad, head.weight.grad, loss.item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--chunk", type=int, default=512)
    ap.add_argument("--dim", type=int, default=896)
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (timed with synchronize)")
    ap.add_argument("--compile", action="store_true", help="compile the chunk's loss, as a job with "
                    "compile.enable does (torchtitan's compile.components holds \"loss\")")
    args = ap.parse_args()

    dtype, device = getattr(torch, args.dtype), torch.device(args.device)
    g = torch.Generator().manual_seed(args.seed)
    head = torch.nn.Linear(args.dim, args.vocab, bias=False, dtype=dtype, device=device)
    with torch.no_grad():
        head.weight.copy_(torch.randn(args.vocab, args.dim, generator=g) * args.dim**-0.5)
    hidden = torch.randn(1, args.tokens, args.dim, generator=g).to(device, dtype)
    labels = torch.randint(0, args.vocab, (1, args.tokens), generator=g)
    labels[0, ::9] = -100
    labels = labels.to(device)
    divisor = (labels != -100).sum().float()
    modes = ("recompute", "in_forward")
    loss_fn = ChunkedHeadLoss(ChunkedHeadLoss.Config(chunk_tokens=args.chunk),
                              compile_config=CompileConfig(enable=args.compile))
    loss_fn.set_lm_head(head)

    ref = {m: _run(loss_fn, m, head, hidden, labels, divisor) for m in modes}
    if dtype == torch.float32 and not args.compile:
        (_, h0, w0, l0), (_, h1, w1, l1) = ref["recompute"], ref["in_forward"]
        errs = (abs(l1 - l0) / abs(l0), float((h1 - h0).norm() / h0.norm()), float((w1 - w0).norm() / w0.norm()))
        assert errs[0] <= 1e-6 and max(errs[1:]) <= 1e-5, errs
        print(f"equal: loss {errs[0]:.1e}, grad hidden {errs[1]:.1e}, grad weight {errs[2]:.1e} (relative)")

    times: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(args.warmup + args.repeats):
        for m in modes if r % 2 == 0 else modes[::-1]:
            ms = _run(loss_fn, m, head, hidden, labels, divisor)[0]
            if r >= args.warmup:
                times[m].append(ms)
    med = {m: statistics.median(t) for m, t in times.items()}
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU {torch.get_num_threads()} threads"
    print(f"head + loss fwd+bwd, {args.tokens} tokens in chunks of {args.chunk}, {args.dim} -> {args.vocab}, "
          f"{args.dtype}{', compiled loss' if args.compile else ''}, {where}, median of {args.repeats}:")
    for m in modes:
        print(f"  {m:10s} {med[m]:9.1f} ms  ({', '.join(f'{t:.0f}' for t in times[m])})")
    best = {m: min(t) for m, t in times.items()}
    print(f"  in_forward / recompute = x{med['in_forward'] / med['recompute']:.3f} medians, "
          f"x{best['in_forward'] / best['recompute']:.3f} fastest runs (the matmuls alone: x{3 / 4:.3f})"
          + ("" if device.type == "cuda" else "; CPU, not the GPU"))


if __name__ == "__main__":
    main()
