"""Exact attention for CPU: SDPA with a dense boolean mask.

torch 2.13 runs FlexAttention forward on CPU but not its backward, and has
no CPU varlen kernel. ``DenseMaskAttention`` is a ``FlexAttention`` subclass
(so torchtitan still builds BlockMasks for it, and its CP wrapper still
all-gathers K/V for it) whose forward evaluates the BlockMask's ``mask_mod``
densely and calls ``F.scaled_dot_product_attention``. The mask_mod already
encodes causality, document boundaries and, under CP, the local-to-global
query index map, so the result is the same attention. Memory is O(Lq * Lkv)
per batch row: meant for debug sizes.

``eager_block_masks`` builds the small ones without torch.compile on CPU.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, create_mask
from torchtitan.models.common.attention import FlexAttention

_last: tuple[BlockMask | None, torch.Tensor | None] = (None, None)


def dense_mask(block_mask: BlockMask, device: torch.device) -> torch.Tensor:
    """Boolean [B, 1, Lq, Lkv] mask equal to ``block_mask``'s mask_mod.

    Every layer gets the same BlockMask object in one forward, so the last
    one is cached (by identity) instead of being re-evaluated per layer.
    Not under torch.compile: traced through this module-level cache, a
    compiled block went on attending with the first step's documents; there
    the mask is evaluated inside the graph, per layer.
    """
    global _last
    if torch.compiler.is_compiling():
        return _evaluate(block_mask, device)
    if _last[0] is block_mask:
        return _last[1]
    mask = _evaluate(block_mask, device)
    _last = (block_mask, mask)
    return mask


def _evaluate(block_mask: BlockMask, device: torch.device) -> torch.Tensor:
    q_len, kv_len = block_mask.seq_lengths
    batch = block_mask.kv_num_blocks.shape[0]
    return create_mask(block_mask.mask_mod, batch, 1, q_len, kv_len, device=device)


class DenseMaskAttention(FlexAttention):
    @dataclass(kw_only=True, slots=True)
    class Config(FlexAttention.Config):
        pass

    def forward(
        self,
        q_BLNH: torch.Tensor,
        k_BLNH: torch.Tensor,
        v_BLNH: torch.Tensor,
        *,
        attention_masks: BlockMask,
        score_mod=None,
        scale: float | None = None,
        enable_gqa: bool = False,
        out_transform=None,
        **kwargs,
    ) -> torch.Tensor:
        if score_mod is not None or out_transform is not None:
            raise NotImplementedError(
                "DenseMaskAttention supports neither score_mod nor out_transform"
            )
        if not isinstance(attention_masks, BlockMask):
            raise TypeError(
                f"attention_masks must be a BlockMask, got {type(attention_masks)}"
            )
        mask = dense_mask(attention_masks, q_BLNH.device)
        out_BNLH = F.scaled_dot_product_attention(
            q_BLNH.transpose(1, 2),
            k_BLNH.transpose(1, 2),
            v_BLNH.transpose(1, 2),
            attn_mask=mask,
            scale=scale,
            enable_gqa=enable_gqa,
        )
        return out_BNLH.transpose(1, 2)


EAGER_MASK_ENTRIES = 2**20
"""Masks of at most this many entries (batch x queries x keys; the debug job's 4 rows of 512 tokens)
are built eagerly on CPU. Eager construction costs about 14x the compiled call at every size, a few
ms a step at this size against a compile of seconds per process; at 16x this size it costs about
0.1 s a step, so longer masks stay compiled (tools/block_mask_cost.py; docs/reliability.md, "The
suite's time")."""


def eager_below(limit: int, eager: Callable, compiled: Callable) -> Callable:
    """``create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, ...)`` by ``eager`` for a mask of at
    most ``limit`` entries (B x Q_LEN x KV_LEN; B None: 1), by ``compiled`` above it."""

    def create(mask_mod, B, H, Q_LEN, KV_LEN, *args, **kwargs):
        small = (B or 1) * Q_LEN * KV_LEN <= limit
        return (eager if small else compiled)(mask_mod, B, H, Q_LEN, KV_LEN, *args, **kwargs)

    create.eager, create.compiled = eager, compiled  # what it routes to (test_compat reads the binding under it)
    return create


def eager_block_masks() -> None:
    """torchtitan 0.3.0 builds every BlockMask through a module-level
    ``torch.compile(create_block_mask)``, and under CP torch's
    ``_create_cp_block_mask`` (which torchtitan's CP sharding calls) through
    its own. On CPU each is a dynamo trace and an inductor C++ compile in every
    process, and again at a new length: seconds of every CPU training launch
    (docs/reliability.md, "The suite's time") that building a small mask
    eagerly (vmap over the same ``mask_mod``) does not pay. Up to
    ``EAGER_MASK_ENTRIES`` the mask is built eagerly, the same BlockMask; past
    it eager construction costs more a step than the compile saves, and the
    compiled function runs as before. Where torch lacks ``separate_full_blocks``
    the compat shim's function is used eagerly.
    """
    import torchtitan.models.common.attention as attention
    from torch.distributed.tensor.experimental._context_parallel import _attention as cp_attention
    from torch.nn.attention.flex_attention import create_block_mask

    from torchtitan_patches import compat

    eager = (compat.create_block_mask_without_separate_full_blocks if compat._create_block_mask_missing()
             else create_block_mask)
    attention._compiled_create_block_mask = eager_below(EAGER_MASK_ENTRIES, eager,
                                                        attention._compiled_create_block_mask)
    if hasattr(cp_attention, "_compiled_create_block_mask"):  # torch 2.13: None until CP first compiles it
        # what _create_cp_block_mask compiles on its first call, built here (torch.compile is lazy)
        compiled = cp_attention._compiled_create_block_mask or torch.compile(
            create_block_mask, dynamic=False, fullgraph=True)
        cp_attention._compiled_create_block_mask = eager_below(EAGER_MASK_ENTRIES, create_block_mask, compiled)
