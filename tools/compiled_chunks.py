"""Compiled chunks (``overlength = "chunk"`` in a compiled job), side by side with eager ones.

The debug llama3 (fp32, CPU, dense DACP attention), its blocks compiled as
torchtitan compiles them (``fullgraph=True``), trains a document in chunks
with the product's ``chunked_loss``: eager (``traced=False``, the blocks' own
code, what an uncompiled job runs) and traced (``traced=True``, what a compiled
job runs: train/chunk_path.py), at CP 1. It prints

- graphs: what a 4-chunk document compiles, then what an 8-chunk one adds
  (0: the graphs do not grow with the chunks), from dynamo's counters;
- gradients: each run's worst parameter against the document in one pass
  (relative norm);
- peak: the live CPU tensor bytes of the document's forward and backward
  (the CPU allocator's events, profile/memory.py CpuTensorPeak), eager and
  traced: the traced chunk joins each layer's prefix into one tensor
  (attention/prefix.py), which the memory rule does not count;
- time: forward + backward of the document, eager and traced alternating,
  the median of each and their ratio (process CPU time: a loaded host's
  other jobs do not count).

    python tools/compiled_chunks.py [--backend inductor] [--length 1019] [--chunk 128] [--repeats 5]
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from skrull_ext.attention import build_meta
from skrull_ext.data.sources.synthetic import IGNORE_INDEX
from skrull_ext.models.registry import build_model_spec
from skrull_ext.profile.memory import CpuTensorPeak
from skrull_ext.train.chunked import chunked_loss
from torchtitan_patches.dacp_attention import install_dacp_attention

VOCAB = 2048


def _model(backend: str | None) -> torch.nn.Module:
    torch.manual_seed(0)
    model = build_model_spec("llama3", "debugmodel").model.build()
    model.init_states()
    install_dacp_attention([model], None, kernel="dense")
    if backend:
        for block in model.layers.values():
            block.compile(backend=backend, fullgraph=True)
    return model


def _document(length: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, VOCAB, (length + 1,), generator=torch.Generator().manual_seed(1))
    labels = ids[1:].clone()
    labels[:7] = IGNORE_INDEX
    return ids[:-1], labels


def _loss(pred: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum")


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def _graphs() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", default="inductor")
    ap.add_argument("--length", type=int, default=1019, help="the document's tokens (8 chunks of 128 by default)")
    ap.add_argument("--chunk", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    tokens, labels = _document(args.length)

    ref = _model(None)
    meta = build_meta([args.length], [0], 0, 1)
    _loss(ref(tokens[None], positions=torch.arange(args.length)[None], attention_masks=meta), labels[None]).backward()
    one_pass = _grads(ref)

    model = _model(args.backend)

    def run(traced: bool, n: int = args.length) -> None:
        model.zero_grad(set_to_none=False)
        chunked_loss(model, tokens[:n], labels[:n], args.chunk, _loss, traced=traced).loss.backward()

    def err() -> float:
        return max(float((p.grad - one_pass[n]).norm() / one_pass[n].norm()) for n, p in model.named_parameters())

    before = _graphs()
    run(True, 4 * args.chunk - 5)
    four = _graphs() - before
    run(True)
    eight = _graphs() - before - four
    chunks = -(-args.length // args.chunk)
    print(f"graphs ({args.backend}): a 4-chunk document compiled {four}, then a {chunks}-chunk one {eight} more "
          f"({len(model.layers)} layers)")
    traced_err = err()
    run(False)
    print(f"gradients vs one pass (worst parameter, relative norm): eager chunks {err():.2g}, "
          f"traced {traced_err:.2g}")

    peaks = {}
    for traced in (False, True):
        meter = CpuTensorPeak()
        model.zero_grad(set_to_none=False)
        meter.start()
        run(traced)
        peaks[traced] = meter.peak()
    mib = 2.0 ** 20
    print(f"peak tensor bytes, {chunks} chunks of {args.chunk}: eager {peaks[False] / mib:.2f} MiB, traced "
          f"{peaks[True] / mib:.2f} MiB = {peaks[True] / peaks[False]:.3f}x")

    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.repeats):
        for traced in (False, True):
            start = time.process_time()
            run(traced)
            times[traced].append(time.process_time() - start)
    eager, traced = (statistics.median(times[k]) for k in (False, True))
    print(f"forward + backward (CPU time, median of {args.repeats}, one thread): eager {eager * 1e3:.0f} ms, "
          f"traced {traced * 1e3:.0f} ms = {eager / traced:.2f}x faster compiled")


if __name__ == "__main__":
    main()
