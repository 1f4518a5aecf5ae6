"""Measurement, not product: what building a BlockMask costs on CPU, compiled against eager.

torchtitan 0.3.0 builds every BlockMask through ``torch.compile(create_block_mask)``;
torchtitan_patches' CPU fix ``eager_block_masks_on_cpu`` builds masks of at most
``EAGER_MASK_ENTRIES`` entries eagerly instead (torchtitan_patches/dense_attention.py).
This prints, per mask shape (a document mask of three documents, torchtitan's
causal + document mask_mod), the time of one call after a warm-up, compiled and
eager, beside the dense mask DenseMaskAttention evaluates from the same mask_mod
anyway; and with ``--first``, the first compiled call in this process (the dynamo
trace and inductor compile each CPU training process paid). Figures and the
command: docs/reliability.md, "The suite's time".

    OMP_NUM_THREADS=1 python tools/block_mask_cost.py [--first]
"""

import argparse
import time
import warnings

import torch
from torch.nn.attention.flex_attention import and_masks, create_block_mask, create_mask
from torchtitan.models.common.attention import get_causal_mask_mod, get_document_mask_mod

SHAPES = ((4, 512), (4, 2048), (1, 8192))
"""(rows, tokens): the debug job's torchtitan batching (4 rows of 512), then longer."""


def mask_mod(rows: int, tokens: int):
    positions = torch.cat([torch.arange(n) for n in (tokens // 4, tokens // 4, tokens // 2)])
    return and_masks(get_causal_mask_mod(), get_document_mask_mod(positions=positions[None].expand(rows, -1)))


def per_call(fn, *args, repeats: int = 3) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        fn(*args, device="cpu")
    return (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--first", action="store_true", help="also time the first compiled call")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    compiled = torch.compile(create_block_mask)
    for rows, tokens in SHAPES:
        mod = mask_mod(rows, tokens)
        call = (mod, rows, None, tokens, tokens)
        start = time.perf_counter()
        compiled(*call, device="cpu")
        first = time.perf_counter() - start
        create_block_mask(*call, device="cpu")  # warm
        c, e = per_call(compiled, *call), per_call(create_block_mask, *call)
        start = time.perf_counter()
        create_mask(mod, rows, 1, tokens, tokens, device="cpu")
        dense = time.perf_counter() - start
        print(f"{rows} x {tokens} tokens ({rows * tokens * tokens:,} entries): compiled {c * 1e3:.1f} ms, "
              f"eager {e * 1e3:.1f} ms (x{e / c:.1f}); dense mask {dense * 1e3:.1f} ms"
              + (f"; first compiled call {first:.2f} s" if args.first else ""), flush=True)


if __name__ == "__main__":
    main()
