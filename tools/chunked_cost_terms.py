"""The terms of a chunked document's cost, one size varied at a time (docs/design/chunked.md,
"Memory and time, checked"): what chunk_cost's ``peak_bytes_beyond_chunk`` and ``dense_fit`` rest on.

For each chunk C, documents of n chunks (``--chunks``): the peak tensor bytes of one
``chunked_loss`` forward + backward (check_chunked's meter), the slope of the peak in the
document's length from the first to the last n (against 3 x K/V + the CPU mask over C queries),
and the step from one chunk to two (against the trainable parameters' bytes). With ``--freeze-layers``
the blocks' parameters are frozen, so that step falls by what was frozen.

With ``--sdpa``: the CPU masked SDPA's forward + backward time (process CPU, best of 3, the debug
model's 16 heads of 16) of a chunk's rectangle of queries over its prefix and itself against the
square of a whole sequence: proportional to the pairs computed, masked or not, not to the causal share.

    OMP_NUM_THREADS=1 python tools/chunked_cost_terms.py --chunk 64,128,256 --chunks 1,2,4
    OMP_NUM_THREADS=1 python tools/chunked_cost_terms.py --chunk 128 --chunks 1,2 --freeze-layers
    OMP_NUM_THREADS=1 python tools/chunked_cost_terms.py --sdpa
"""

import argparse
import time

import torch
import torch.nn.functional as F

from skrull_ext.profile.check_chunked import allocate_grads, random_document
from skrull_ext.profile.memory import PEAK_METERS
from skrull_ext.profile.model import build_job_model
from skrull_ext.train.chunked import attention_layers, chunked_loss
from skrull_ext.train.job.job_file import load_config


def sdpa_ms(queries: int, keys: int, heads: int = 16, dim: int = 16) -> float:
    """Best of 3 forward + backward of a masked SDPA, the last ``queries`` of ``keys`` causal."""
    q = torch.randn(1, heads, queries, dim, requires_grad=True)
    k, v = (torch.randn(1, heads, keys, dim, requires_grad=True) for _ in range(2))
    mask = torch.arange(keys)[None, :] <= (keys - queries + torch.arange(queries))[:, None]
    best = float("inf")
    for _ in range(3):
        t0 = time.process_time()
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask).sum().backward()
        best = min(best, time.process_time() - t0)
    return best * 1e3


def sdpa() -> None:
    square = sdpa_ms(2048, 2048)
    print(f"square 2048 x 2048: {square:.1f} ms")
    for nq, nk in ((1024, 2048), (512, 2048), (1024, 1024)):
        pairs, causal = nq * nk / 2048**2, (nq * (2 * nk - nq)) / 2048**2
        print(f"{nq} queries x {nk} keys: {sdpa_ms(nq, nk) / square:.2f} of the square "
              f"(pairs {pairs:.2f}, causal share {causal:.2f})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config-file", default="skrull_ext/jobs/debug_cpu.toml")
    p.add_argument("--chunk", default="64,128,256", help="chunk sizes, comma-separated")
    p.add_argument("--chunks", default="1,2,4", help="chunks per document, comma-separated, ascending")
    p.add_argument("--freeze-layers", action="store_true", help="freeze every block's parameters")
    p.add_argument("--sdpa", action="store_true", help="time the CPU masked SDPA's rectangle against the square")
    args = p.parse_args()
    torch.set_num_threads(1)
    if args.sdpa:
        return sdpa()
    config = load_config(["--config-file", args.config_file])
    counts = [int(x) for x in args.chunks.split(",")]
    chunks = [int(x) for x in args.chunk.split(",")]
    jm = build_job_model(config, torch.device("cpu"), max(chunks) * max(counts))
    if args.freeze_layers:
        for name, param in jm.model.named_parameters():
            if name.startswith("layers."):
                param.requires_grad_(False)
    allocate_grads(jm)
    layers = attention_layers([jm.model])
    shape = jm.shape
    kv = 2 * shape.kv_width * shape.bytes_per_elem * shape.layers  # K/V bytes a token, every layer
    trainable = sum(q.numel() * q.element_size() for q in jm.model.parameters() if q.requires_grad)
    print(f"K/V {kv} B a token; trainable parameters {trainable} B")
    for c in chunks:
        peaks = []
        for n in counts:
            ids, labels = random_document(jm, n * c, 0)
            meter = PEAK_METERS["cpu"](jm.device)
            jm.model.zero_grad(set_to_none=False)
            meter.start()
            chunked_loss(jm.model, ids, labels, c, lambda pred, lab: jm.loss_fn(pred, lab)[0],
                         layers=layers).loss.backward()
            peaks.append(meter.peak())
            print(f"chunk {c}, {n} chunk(s) ({n * c} tokens): peak {peaks[-1]:.0f} B", flush=True)
        multi = [(n, pk) for n, pk in zip(counts, peaks) if n > 1]  # the step from one chunk is apart
        if len(multi) > 1:
            (n0, p0), (n1, p1) = multi[0], multi[-1]
            mask = shape.layers * 4 * c  # the CPU kernel's float mask: C queries x 4 B, every layer
            print(f"chunk {c}: slope {(p1 - p0) / (c * (n1 - n0)):.0f} B a token (3 x K/V + mask: {3 * kv + mask})")
        if counts[:2] == [1, 2]:
            print(f"chunk {c}: one chunk -> two: +{peaks[1] - peaks[0]:.0f} B "
                  f"(trainable {trainable} + 2 x K/V(C) {2 * kv * c})")

if __name__ == "__main__":
    main()
