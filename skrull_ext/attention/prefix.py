"""One chunk of a long document attending over the K/V of its earlier chunks.

``[skrull] overlength = "chunk"`` trains a document longer than the job's
limit whole, in consecutive chunks (skrull_ext/train/chunked.py runs them).
Chunk c is a forward of its own tokens whose attention reads, in every layer,
the K/V of chunks 0..c-1 of the same document (its *prefix*, kept from their
forwards) and its own: causal over the whole document, with positions and
RoPE continuing, so the loss and the gradients are those of one pass.

A :class:`ChunkAttention` is the ``attention_masks`` of such a forward, as a
``DacpBatchMeta`` is of a micro-batch: ``DacpAttention`` hands it q, k, v and
it returns the attention output. It takes the prefix K/V as tensors (inputs
of the chunk's forward, so autograd carries their gradients back to the
earlier chunks) and gives this chunk's K/V out in ``kept`` (outputs, the next
chunks' prefix).

Over a CP group of N ranks each rank holds 1/N of the chunk, contiguous
(rank r: tokens [r C/N, (r+1) C/N) of a chunk of C); its K/V shard is
gathered over the group with DACP's own exchange (exchange.py: an all-gather
forward, a reduce-scatter of dK/dV backward), so every rank keeps the whole
chunk's K/V and the prefix never travels again. docs/design/chunked.md says
why that layout.

Layout of a kept K/V: ``[2, Hkv, C, D]`` (K then V), one tensor per layer
and chunk.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F

from skrull_ext.attention.exchange import KVExchange, start_exchange, wait_exchange
from skrull_ext.attention.transport import resolve_transport

__all__ = ["ChunkAttention"]


class ChunkAttention:
    """What one chunk's forward attends over, layer by layer.

    Args:
        layers: the model's attention modules in layer order (their identity names the layer:
            under torchtitan's activation checkpointing a block runs again alone, so a call
            counter would not do).
        prefix: per layer, the kept K/V (``[2, Hkv, C_j, D]``) of the document's earlier chunks.
        offset: this rank's first token within the chunk (0 without a CP group).
        group: the CP group the chunk is sharded over (None: held whole by this rank).
    """

    def __init__(self, layers, prefix: list[list[torch.Tensor]], offset: int = 0,
                 group: dist.ProcessGroup | None = None) -> None:
        if len(prefix) != len(layers):
            raise ValueError(f"prefix has {len(prefix)} layers, the model {len(layers)}")
        self.index = {id(m): i for i, m in enumerate(layers)}
        self.prefix = prefix
        self.offset = offset
        self.group = group if group is not None and dist.get_world_size(group) > 1 else None
        self.kept: list[torch.Tensor | None] = [None] * len(layers)
        """Per layer, this chunk's whole K/V ``[2, Hkv, C, D]`` once its forward ran."""

    def prefix_tokens(self) -> int:
        """The chunk's first token in the document: the earlier chunks' tokens."""
        return sum(kv.size(2) for kv in self.prefix[0]) if self.prefix else 0

    def attend(self, layer, q_BLNH: torch.Tensor, k_BLNH: torch.Tensor, v_BLNH: torch.Tensor,
               scale: float | None) -> torch.Tensor:
        """Causal attention of this rank's queries over the prefix and the chunk; (1, L, N, H) in and out."""
        i = self.index[id(layer)]
        shard = torch.stack([k_BLNH[0].transpose(0, 1), v_BLNH[0].transpose(0, 1)])  # [2, Hkv, L, D]
        if self.group is None:
            own = shard
        else:  # every rank gets the whole chunk's K/V; dK/dV come back reduce-scattered
            ex = KVExchange(self.group, getattr(layer, "stats", None), transport=resolve_transport("auto", self.group))
            own = torch.stack(wait_exchange(start_exchange(shard, ex), ex))
        self.kept[i] = own
        kv = torch.cat([*self.prefix[i], own], dim=2) if self.prefix[i] else own
        n_q = q_BLNH.size(1)
        first = self.prefix_tokens() + self.offset  # the first query's index among kv's keys
        q_pos = torch.arange(first, first + n_q, device=q_BLNH.device)
        mask = torch.arange(kv.size(2), device=q_BLNH.device)[None, :] <= q_pos[:, None]
        # 4-D, K/V at their own head count: CPU's flash kernel then saves K/V, not (L x P) probabilities.
        out = F.scaled_dot_product_attention(q_BLNH.transpose(1, 2), kv[0][None], kv[1][None], attn_mask=mask,
                                             scale=scale, enable_gqa=kv.size(1) != q_BLNH.size(2))
        return out.transpose(1, 2)
