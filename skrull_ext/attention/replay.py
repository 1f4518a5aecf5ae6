# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""The forward's gathered K/V, reused when activation checkpointing recomputes.

torchtitan 0.3.0 applies AC with non-reentrant ``torch.utils.checkpoint``
around each TransformerBlock: full AC re-runs the whole block inside
backward, and selective AC re-runs every op its policy does not save. The
policy saves ``_c10d_functional.reduce_scatter_tensor`` and all-to-all but
no all-gather (FSDP's parameter all-gathers must not be kept), and our
exchange is a c10d all-gather inside an autograd Function anyway. So
without help the recomputation issues the K/V all-gather a second time:
two rounds of communication per layer per micro-batch.

Instead each DacpAttention layer keeps a :class:`KVReplay`. A forward outside
backward records the gathered K/V (``record``); the recomputation of that
layer for that micro-batch, which runs inside backward, takes them back
(``take``) and skips the collective. Everything else re-runs as before: the
recomputed graph has the same autograd nodes and saves the same tensors,
which non-reentrant checkpoint matches by position, and the original graph's
backward still reduce-scatters dK/dV.

Why a cache and not a custom op that the SAC policy marks MUST_SAVE: full AC
has no policy, and torchtitan's save list is fixed (adding to it means
patching or re-registering torchtitan's SelectiveAC). The cache works the
same under both, and without AC it is never read.

Keys and lifetimes:

- one KVReplay per layer, keyed by the identity of the micro-batch's
  DacpBatchMeta (the ``attention_masks`` object every layer receives; the
  checkpoint keeps it alive until the recomputation), so layers and
  micro-batches never mix;
- an entry is taken once, by the recomputation, or dropped by the original
  graph's wait node in backward, whichever comes first; the cache holds it
  weakly, so a forward that never gets a backward frees it with its graph;
- two forwards of one layer with the same meta object both pending a
  backward are ambiguous: neither is replayed, both gather again (correct,
  only slower). The decision depends only on the call sequence, which is
  the same on every CP rank, so all ranks skip or issue the collective
  together.

Memory: the kept K/V are the very tensors handed to the distributed part's
SDPA, which its fused kernels (CPU flash, CUDA flash/efficient/cuDNN) save
for backward anyway, so without AC the entry costs nothing (SDPA's math
fallback saves other intermediates; there it is one extra gathered K/V per
layer until backward). Under AC it is the gathered K/V of every layer held
from forward until that layer's recomputation: what selective AC would keep
for torchtitan's own CP all-gather if its policy saved all-gathers. It is
not small next to what AC saves: per layer 2 * h_kv * (distributed tokens of
the whole group) * bytes, against h * (this rank's tokens) * bytes for the
block input; for Qwen2.5-0.5B (h 896, h_kv 128, 24 layers, bf16) a 32K-token
distributed sequence keeps 16.8 MB per layer, 0.4 GB per rank. The memory
profile (skrull_ext/profile, one rank, whole sequences) does not measure it.
"""

import weakref

import torch

__all__ = ["KVReplay", "in_backward"]


def in_backward() -> bool:
    """True while the autograd engine runs a backward on this thread.

    That is where non-reentrant ``torch.utils.checkpoint`` (what torchtitan's
    full and selective AC use) re-runs a checkpointed forward. FSDP2
    (``_fsdp_common.is_bw``) and ``torch.utils.module_tracker`` test the same.
    """
    return torch._C._current_graph_task_id() != -1


class KeptKV:
    """One forward's gathered K/V ([Hkv, N*Td, D] each) until its backward."""

    __slots__ = ("meta", "kv", "open", "__weakref__")

    def __init__(self, meta, kv: tuple[torch.Tensor, torch.Tensor]) -> None:
        self.meta = weakref.ref(meta)
        self.kv: tuple[torch.Tensor, torch.Tensor] | None = kv
        self.open = True
        """Its backward has not run; a recomputation may still come."""

    def close(self) -> None:
        """The original graph's backward passed this layer: nothing will take it now."""
        self.kv, self.open = None, False


class KVReplay:
    """One attention layer's kept K/V, by micro-batch (see the module docstring)."""

    def __init__(self) -> None:
        self._by_meta: dict[int, list[weakref.ref]] = {}

    def _pending(self, meta) -> list[KeptKV]:
        """Open entries recorded for ``meta`` (this very object), pruning the rest."""
        alive = [e for r in self._by_meta.get(id(meta), []) if (e := r()) is not None and e.open]
        alive = [e for e in alive if e.meta() is meta]  # an id reused by a newer meta
        if alive:
            self._by_meta[id(meta)] = [weakref.ref(e) for e in alive]
        else:
            self._by_meta.pop(id(meta), None)
        return alive

    def record(self, meta, k: torch.Tensor, v: torch.Tensor) -> KeptKV:
        """Keep a forward's gathered K/V; the caller ties the entry to its graph
        (strong reference) and closes it in backward."""
        entry = KeptKV(meta, (k.detach(), v.detach()))
        pending = self._pending(meta)
        if pending:  # ambiguous: which graph would a recomputation belong to?
            for e in (*pending, entry):
                e.kv = None
        self._by_meta.setdefault(id(meta), []).append(weakref.ref(entry))
        return entry

    def take(self, meta) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The K/V a recomputation of ``meta`` may reuse, once; None: gather again."""
        pending = self._pending(meta)
        if len(pending) != 1 or pending[0].kv is None:
            return None
        kv = pending[0].kv
        pending[0].close()
        self._pending(meta)
        return kv

    def __len__(self) -> int:
        """Open entries (tests check that backward released them all)."""
        return sum(1 for refs in self._by_meta.values() for r in refs if (e := r()) is not None and e.open)
