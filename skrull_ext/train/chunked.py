"""A document longer than the job's limit, trained whole in chunks (``overlength = "chunk"``).

ChunkFlow's schedule (arXiv 2503.02356) on autograd. The document is cut into
consecutive chunks of ``chunk`` tokens; chunk c's forward takes, per layer,
the K/V of chunks 0..c-1 as inputs and gives its own K/V as outputs
(skrull_ext/attention/prefix.py), so each chunk attends causally to every
earlier token of its document, positions and RoPE continuing. Each chunk's
forward runs under non-reentrant activation checkpointing: what it keeps for
backward is its inputs (token ids, positions, the prefix K/V, which the
document keeps anyway) and its outputs (its loss and K/V), not its
activations. The last chunk is the exception: its backward is the first to
run, right after its forward, so it keeps its activations and is not
recomputed (the bytes at the start of its backward are the same either way,
the recomputed forward is saved). The backward of the summed loss then runs
the chunks in reverse order, recomputing one chunk's activations at a time
and handing the gradients of the prefix K/V back to the earlier chunks'
graphs, where they join the gradients of those chunks' own queries.

So the bytes a chunked document keeps are the document's K/V plus one
chunk's activations while that chunk's backward runs, whatever its length
(tests/unit_tests/test_chunked.py counts them), and the loss and every
gradient are those of the document in one pass, up to float rounding (the
same test, fp32: loss 1e-6, gradients 1e-5 relative). The price is one
recomputed forward per chunk but the last and attention over the prefix,
which the cost model charges (skrull_ext/scheduler/chunk_cost.py).

Over a CP group of N ranks, every chunk is sharded over the group (each rank
holds C/N contiguous tokens of it) and its K/V gathered; a chunk size that is
not a multiple of N is refused, the document's last chunk is padded to one
(padding comes after every real token, so causality hides it from them, and
its labels are ignored).

In a compiled job (torchtitan's per-block ``torch.compile(fullgraph=True)``)
a chunk's forward, and its recomputation in backward, run through the
compiled blocks (``traced``, chunk_path.py; over a CP group the K/V
all-gather is a functional collective in the trace, attention/prefix.py;
under TP a rank's share of each chunk a multiple of the TP degree, ``tp``):
each layer's prefix joined on its module (attention/prefix.py),
the forward traced dynamic in the token dimension from the first chunk (the
blocks' hidden states, positions, query positions and prefix length, marked; every other
size and scalar static, dynamo's default: dynamic everywhere made the modules' ints and
floats symbols too and restarted the trace on a float, twice the CPU per graph) and
without duck sizing, so the recomputation meets the graph its forward ran (two sizes that
happened to be equal in one and not the other would pick another graph,
which saves other tensors: pytorch issue 166926), and side effects allowed
under torchtitan's activation checkpointing (the recompute does not replay
them: the module's state is read in the forward only). Two graphs a block
code object, the first chunk's and the rest's, whatever the layers and
chunks (tests/unit_tests/test_chunked_compiled.py counts them), under FSDP
too (torchtitan wraps one rank too): FSDP's pre-forward hands a block its
input as a view (the autograd function its post-backward hook hangs on) but
not in a recomputation (its ``_pre_forward`` returns early in backward), and
dynamo guards on whether an input is a view, so the blocks' pre-hook hands
the recomputation a view too (train/dynamic_tokens.py ``settle``; before
it, 4 graphs: tests/integration_tests/test_chunk_dp_run.py counts 2 in the
first step with documents, none after). Elsewhere a chunk runs the blocks' own eager
code (``torch.compiler.set_stance("force_eager")`` around the model call),
which compiles nothing.
"""

from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.fx.experimental._config as fx_config
from torch.utils.checkpoint import checkpoint

from skrull_ext.attention.module import DacpAttention
from skrull_ext.attention.prefix import ChunkAttention
from skrull_ext.attention.segments import host_to_device
from skrull_ext.data.sources.synthetic import IGNORE_INDEX
from skrull_ext.train.dynamic_tokens import mark_blocks

__all__ = ["attention_layers", "chunk_bounds", "chunked_loss", "ChunkedLoss", "tp_local_numel", "tp_shard_numel",
           "unsharded_param_bytes"]


@dataclass(frozen=True)
class ChunkedLoss:
    """One chunked document's forward."""

    loss: torch.Tensor
    """The sum of its chunks' losses; its backward runs the chunks' in reverse."""
    chunks: int
    """Its own chunks (the pad chunks after them not counted)."""
    kv_bytes: int
    """Bytes of the document's K/V this rank keeps until backward (every layer, every chunk)."""


def chunk_bounds(length: int, chunk: int) -> list[tuple[int, int]]:
    """[start, end) of each chunk of a ``length``-token document cut every ``chunk`` tokens."""
    if chunk <= 0:
        raise ValueError(f"chunk size must be positive, got {chunk}")
    return [(a, min(a + chunk, length)) for a in range(0, length, chunk)]


def attention_layers(model_parts) -> list[DacpAttention]:
    """The DACP attention modules of ``model_parts``, in layer order."""
    return [m for part in model_parts for m in part.modules() if isinstance(m, DacpAttention)]


def unsharded_param_bytes(model_parts, itemsize: int) -> float:
    """Bytes of every FSDP unit's unsharded parameters on one rank at ``itemsize`` bytes an element
    (FSDP's ``mixed_precision_param``), 0 for a part without FSDP: a chunk's checkpointed recompute
    runs each unit's forward in FSDP's pre-backward state, which gathers the unit and keeps it until
    the unit's backward, so the whole copy is held at once (scheduler/chunk_cost.py). FSDP gathers
    over its own mesh dimensions only: a parameter TP shards stays a TP shard (``tp_local_numel``)."""
    from torch.distributed.fsdp import FSDPModule

    return float(sum(tp_local_numel(p) for part in model_parts if isinstance(part, FSDPModule)
                     for p in part.parameters()) * itemsize)


def tp_local_numel(p: torch.Tensor) -> int:
    """Elements of ``p`` on one rank once FSDP has gathered it: the whole tensor, divided by the
    ranks of each mesh dimension named "tp" (torchtitan's tensor-parallel dimension) that shards it."""
    mesh, placements = getattr(p, "device_mesh", None), getattr(p, "placements", ())
    names = (mesh.mesh_dim_names or ()) if mesh is not None else ()
    return tp_shard_numel(p.numel(), names, tuple(mesh.shape) if mesh is not None else (), placements)


def tp_shard_numel(numel: int, dim_names, dim_sizes, placements) -> int:
    """``numel`` over the sizes of the mesh dimensions named "tp" whose placement shards (ceil: an
    uneven shard's largest part)."""
    ways = 1
    for name, size, placement in zip(dim_names, dim_sizes, placements):
        if name == "tp" and placement.is_shard():
            ways *= size
    return -(-numel // ways)


def _padded(x: torch.Tensor, lo: int, hi: int, fill: int) -> torch.Tensor:
    """``x[lo:hi]``, filled with ``fill`` past the end of ``x``."""
    part = x[lo:min(hi, x.numel())].clone()  # its own storage: a chunk keeps its ids, not the document's
    if part.numel() == hi - lo:
        return part
    return torch.cat([part, part.new_full((hi - lo - part.numel(),), fill)])


def chunked_loss(
    model: torch.nn.Module,
    tokens: torch.Tensor,
    labels: torch.Tensor,
    chunk: int,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    *,
    layers: list | None = None,
    group: dist.ProcessGroup | None = None,
    recompute: bool = True,
    pad_chunks: int = 0,
    traced: bool = False,
    tp: int = 1,
) -> ChunkedLoss:
    """Forward of one document in chunks.

    Args:
        model: a decoder whose inner attention is DacpAttention (``layers``: those modules in
            layer order, default all of ``model``'s).
        tokens, labels: the document, 1-D (label k predicts token k + 1, IGNORE_INDEX where none).
        chunk: tokens per chunk (over a CP group: the whole group's, a multiple of its size).
        loss_fn: ``(pred [1, L, V], labels [1, L]) -> scalar``, summed over the chunks.
        group: the CP group each chunk is sharded over (None: this rank holds the chunks).
        recompute: checkpoint each chunk but the last (the bounded-memory schedule); False keeps
            every chunk's activations (the same values, for tests and measurements).
        pad_chunks: passes after the document's own, one token per CP rank each, ids 0 and labels
            ignored (lockstep DP ranks run as many passes as each other: scheduler/chunk_lockstep.py).
            After every real token, so causality hides them from the document: its loss and
            gradients are unchanged. The last pass (a pad one if any) is the one not checkpointed.
            Their positions count from 0 (any within the RoPE cache does: nothing real sees them).
            ``tokens`` may then be empty (an all-pad document).
        traced: run the chunks through the compiled blocks (module docstring; chunk_path.py decides);
            False: their eager code. The values are the same either way, up to the compiler's rounding.
        tp: the TP degree: a rank's tokens of each chunk a multiple of it (sequence parallelism shards
            them over the TP ranks between blocks, and compiled blocks failed on an uneven shard:
            docs/design/buffer_layout.md), so ``chunk`` must be a multiple of CP x TP, the last chunk
            and each pad chunk padded to ``tp`` tokens a rank.
    """
    if tokens.dim() != 1 or tokens.shape != labels.shape:
        raise ValueError(f"tokens and labels must be 1-D of one length, got {tuple(tokens.shape)}, "
                         f"{tuple(labels.shape)}")
    n, rank = (dist.get_world_size(group), dist.get_rank(group)) if group is not None else (1, 0)
    if tp < 1 or chunk % (n * tp):
        raise ValueError(f"chunk size {chunk} is not a multiple of the CP group's {n} ranks" +
                         (f" x TP {tp}" if tp != 1 else ""))
    if pad_chunks < 0:
        raise ValueError(f"pad_chunks must be >= 0, got {pad_chunks}")
    layers = attention_layers([model]) if layers is None else layers
    prefix: list[list[torch.Tensor]] = [[] for _ in layers]
    gathered: dict[int, list[torch.Tensor]] = {}
    """Eager at CP > 1: each checkpointed pass's gathered K/V, per layer, until its recompute takes
    them (attention/prefix.py ``_exchange``: no second all-gather); the next passes keep them as
    their prefix until then anyway."""
    total, bounds = None, chunk_bounds(tokens.numel(), chunk)
    unit = n * tp  # the last chunk padded to a multiple of it: tp tokens a rank, or more
    end = -(-tokens.numel() // unit) * unit if bounds else 0  # past the last chunk's padding
    passes = bounds + [(end + i * unit, end + (i + 1) * unit) for i in range(pad_chunks)]
    for i, (a, b) in enumerate(passes):
        per = -(-(b - a) // unit) * tp  # this rank's tokens of the chunk (its share, padded)
        lo = a + rank * per
        tok, lab = _padded(tokens, lo, lo + per, 0), _padded(labels, lo, lo + per, IGNORE_INDEX)
        first = rank * per if i >= len(bounds) else lo  # a pad chunk: positions from 0, within any RoPE cache
        pos = torch.arange(first, first + per, device=tokens.device)
        q_pos = torch.arange(lo, lo + per, device=tokens.device)  # among the keys: the prefix, then the chunk
        cu = host_to_device(torch.tensor([[0, per], [0, lo + per]], dtype=torch.int32), tokens.device)  # varlen's
        c = len(prefix[0]) if layers else 0

        def run(*flat, tok=tok, lab=lab, pos=pos, q_pos=q_pos, cu=cu, c=c, i=i):
            per_layer = [list(flat[j * c:(j + 1) * c]) for j in range(len(layers))]
            ctx = ChunkAttention(q_pos, layers, per_layer, group, cu, replay=gathered.pop(i, None))
            with _chunk_forward(model, layers, per_layer, traced):
                pred = model(tok[None], positions=pos[None], attention_masks=ctx)
                kept = [m.chunk_kept if k is None else k for m, k in zip(layers, ctx.kept)]  # traced: on the module
            return (loss_fn(pred, lab[None]), *kept)

        flat = [kv for per_layer in prefix for kv in per_layer]
        keep = not recompute or i == len(passes) - 1  # the last pass: its backward runs first, nothing to save
        out = run(*flat) if keep else checkpoint(run, *flat, use_reentrant=False)
        if not keep and not traced and n > 1:  # eager at CP > 1: its recompute reuses them
            gathered[i] = [kv.detach() for kv in out[1:]]
        for layer, kv in enumerate(out[1:]):
            prefix[layer].append(kv)
        total = out[0] if total is None else total + out[0]
    kv_bytes = sum(kv.nbytes for per_layer in prefix for kv in per_layer)
    return ChunkedLoss(total, len(bounds), kv_bytes)


@contextmanager
def _chunk_forward(model, layers, prefix: list[list[torch.Tensor]], traced: bool):
    """Around a chunk's model call. Eager: ``force_eager`` (compiled blocks run their own code).
    Traced: each layer's prefix joined on its module (attention/prefix.py), its length and the
    token dimension of what each block of ``model.layers`` receives marked dynamic
    (train/dynamic_tokens.py: a compiled job's trainer marks them already, the profiler's and the
    tests' chunks need it here), dynamo's settings of a chunk (module docstring); the modules' chunk state
    and the hooks cleared after (also when a recomputation stops early), so no copy outlives the call."""
    if not traced:
        with torch.compiler.set_stance("force_eager"):
            yield
        return
    for m, parts in zip(layers, prefix):
        m.chunk_prefix = torch.cat(parts, dim=2) if parts else None
        if m.chunk_prefix is not None:
            torch._dynamo.maybe_mark_dynamic(m.chunk_prefix, 2)
    hooks = mark_blocks([model])
    try:
        with (torch._dynamo.config.patch(skip_fwd_side_effects_in_bwd_under_checkpoint=True),
              fx_config.patch(use_duck_shape=False)):
            yield
    finally:
        for h in hooks:
            h.remove()
        for m in layers:
            m.chunk_prefix = m.chunk_kept = None
