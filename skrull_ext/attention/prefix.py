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

Two ways to find a layer's prefix, one attention:

- eager (the blocks' own code): the object holds every layer's prefix, a list
  of the earlier chunks' K/V, and finds the layer by its identity (under
  torchtitan's eager activation checkpointing a block runs again alone in
  backward, with this same object, so a call counter would not do);
- traced (inside a compiled block, train/chunk_path.py): dynamo would guard
  on that identity and on the list's length, one graph per layer and chunk
  index. So the chunk's forward puts each layer's prefix on its module
  instead, joined into one tensor (``DacpAttention.chunk_prefix``, None for
  the first chunk), and the chunk's K/V come out the same way
  (``chunk_kept``): two graphs for any number of layers and chunks (the
  first chunk's, the rest's; under FSDP too: train/chunked.py). The join is one more copy of a layer's prefix;
  ``attend`` drops it from the module once read, so it lives until its
  layer's attention (docs/design/chunked.md, "Compiled chunks").

Over a CP group of N ranks each rank holds 1/N of the chunk, contiguous
(rank r: tokens [r C/N, (r+1) C/N) of a chunk of C); its K/V shard is
gathered over the group with DACP's own exchange (exchange.py: an all-gather
forward, a reduce-scatter of dK/dV backward), so every rank keeps the whole
chunk's K/V and the prefix never travels again; a recomputation in backward
replays the K/V its forward gathered (``_exchange``). docs/design/chunked.md says
why that layout. Inside a compiled block (a traced chunk, chunk_path.py) the
gather is torch's functional all-gather instead
(``all_gather_tensor_autograd``: its backward the same reduce-scatter), which
dynamo holds in the trace; the exchange's autograd Functions and async work
handles are not traceable, and a chunk waits for its gather at once anyway
(its attention needs the whole chunk's K/V), so nothing overlaps either way.
The traced gather is not counted in the layer's DacpStats (host counters).

The attention itself: this rank's queries over the keys up to its last
query, causal, which is bottom-right causal over that key prefix. Where the
job's kernel runs its distributed part on flash attention's varlen kernel
(``Kernel.chunk_varlen``: ``auto`` on CUDA in bf16/fp16, ``varlen``, the
cudnn kernels) it is one varlen segment with no mask (``_varlen``); else
SDPA with a [queries, keys] bool mask, the CPU reference, whose mask grows
with the prefix (docs/design/chunked.md, "Cost model").

Layout of a kept K/V: ``[2, Hkv, C, D]`` (K then V), one tensor per layer
and chunk.
"""

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F

from skrull_ext.attention.exchange import KVExchange, start_exchange, wait_exchange
from skrull_ext.attention.kernels import _varlen_keywords, _varlen_kwargs, AUTO, resolve_kernel, varlen_call
from skrull_ext.attention.replay import in_backward
from skrull_ext.attention.transport import resolve_transport

__all__ = ["ChunkAttention"]


class ChunkAttention:
    """What one chunk's forward attends over, layer by layer.

    Args:
        q_pos: this rank's queries' indices among the document's keys (prefix and chunk), 1-D:
            a tensor, so a traced chunk does not specialise on where it starts.
        layers: the model's attention modules in layer order (eager: their identity names the layer).
        prefix: per layer, the kept K/V (``[2, Hkv, C_j, D]``) of the document's earlier chunks,
            which eager code reads (traced code reads each module's ``chunk_prefix``, the same joined).
        group: the CP group the chunk is sharded over (None: held whole by this rank).
        cu: int32 ``[[0, queries], [0, keys]]`` on the device, keys up to this rank's last query:
            a kernel whose chunks run varlen (``Kernel.chunk_varlen``) reads them; None: the mask.
    """

    def __init__(self, q_pos: torch.Tensor, layers, prefix: list[list[torch.Tensor]],
                 group: dist.ProcessGroup | None = None, cu: torch.Tensor | None = None,
                 replay: list[torch.Tensor] | None = None) -> None:
        if len(prefix) != len(layers):
            raise ValueError(f"prefix has {len(prefix)} layers, the model {len(layers)}")
        self.q_pos = q_pos
        self.index = {id(m): i for i, m in enumerate(layers)}
        self.prefix = prefix
        self.group = group if group is not None and dist.get_world_size(group) > 1 else None
        self.cu = cu
        self.varlen_kwargs: dict[bool, dict] = {}
        """varlen_attn's keywords without and with GQA, read here: the signature's inspection does not trace."""
        if cu is not None:
            self.varlen_kwargs = {gqa: _varlen_kwargs(gqa, _varlen_keywords()) for gqa in (False, True)}
        self.after = dist.get_world_size(group) - 1 - dist.get_rank(group) if self.group is not None else 0
        """The CP ranks after this one: their slices of the chunk end the keys, past this rank's queries."""
        self.kept: list[torch.Tensor | None] = [None] * len(layers)
        """Eager: per layer, this chunk's whole K/V ``[2, Hkv, C, D]`` once its forward ran."""
        self.replay = replay
        """Eager, a checkpointed chunk's recompute: per layer, the K/V its forward gathered (``kept``)."""

    def attend(self, layer, q_BLNH: torch.Tensor, k_BLNH: torch.Tensor, v_BLNH: torch.Tensor,
               scale: float | None) -> torch.Tensor:
        """Causal attention of this rank's queries over the prefix and the chunk; (1, L, N, H) in and out."""
        shard = torch.stack([k_BLNH[0].transpose(0, 1), v_BLNH[0].transpose(0, 1)])  # [2, Hkv, L, D]
        if self.group is None:
            own = shard
        elif torch.compiler.is_compiling():  # traced: a functional all-gather, its backward a reduce-scatter
            own = funcol.all_gather_tensor_autograd(shard.contiguous(), gather_dim=2, group=self.group)
        else:  # every rank gets the whole chunk's K/V; dK/dV come back reduce-scattered
            own = torch.stack(wait_exchange(start_exchange(shard, ex := self._exchange(layer)), ex))
        if torch.compiler.is_compiling():  # traced: the layer's state on its module (module docstring)
            joined = layer.chunk_prefix
            parts = [] if joined is None else [joined]
            layer.chunk_prefix = None  # the join's last holder: freed once its layer has read it
            layer.chunk_kept = own
        else:
            i = self.index[id(layer)]
            parts = self.prefix[i]
            self.kept[i] = own
        kv = torch.cat([*parts, own], dim=2) if parts else own
        if self.cu is not None and resolve_kernel(getattr(layer, "kernel", AUTO), q_BLNH).chunk_varlen:
            return self._varlen(q_BLNH, kv, scale)
        mask = torch.arange(kv.size(2), device=q_BLNH.device)[None, :] <= self.q_pos[:, None]
        # 4-D, K/V at their own head count: CPU's flash kernel then saves K/V, not (L x P) probabilities.
        # A branch, not the comparison: traced, FSDP's parameters leave the head counts symbolic, SDPA
        # takes a plain bool, and a branch on a symbolic condition is decided (and guarded) by dynamo.
        gqa = True if kv.size(1) != q_BLNH.size(2) else False  # noqa: SIM210
        out = F.scaled_dot_product_attention(q_BLNH.transpose(1, 2), kv[0][None], kv[1][None], attn_mask=mask,
                                             scale=scale, enable_gqa=gqa)
        return out.transpose(1, 2)

    def _exchange(self, layer) -> KVExchange:
        """The eager K/V all-gather of ``layer``'s shard; in a recomputation (inside backward: the
        chunk's checkpoint, or torchtitan's activation checkpointing of the block) one that hands back
        the K/V this chunk's forward gathered instead (DACP's replay, attention/replay.py): the same
        values, no collective; the forward's graph still reduce-scatters dK/dV."""
        i = self.index[id(layer)]
        forward = self.kept[i] if self.kept[i] is not None else (self.replay[i] if self.replay else None)
        again = forward.detach() if forward is not None and in_backward() else None
        return KVExchange(self.group, getattr(layer, "stats", None), transport=resolve_transport("auto", self.group),
                          replay=None if again is None else (again[0], again[1]))

    def _varlen(self, q_BLNH: torch.Tensor, kv: torch.Tensor, scale: float | None) -> torch.Tensor:
        """One varlen segment: this rank's L queries over the keys up to its last one, bottom-right
        causal (flash attention's alignment where keys outnumber queries), no mask; the key count
        from the sizes (the later ranks' slices of L end the keys), so a traced chunk keeps it symbolic."""
        n = q_BLNH.size(1)
        keys = kv.size(2) - self.after * n
        gqa = True if kv.size(1) != q_BLNH.size(2) else False  # noqa: SIM210 (attend says why)
        out = varlen_call(q_BLNH[0].transpose(0, 1), kv[0], kv[1], self.cu[0], self.cu[1], n, keys, scale,
                          dict(self.varlen_kwargs[gqa]))
        return out.transpose(0, 1)[None]
