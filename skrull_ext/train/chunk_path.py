"""Where a job's chunked documents run: the compiled blocks, or their eager code.

``overlength = "chunk"`` runs each chunk of a document as a forward of the model
(train/chunked.py). In a compiled job (torchtitan's per-block
``torch.compile(fullgraph=True)``) a chunk's forward, and its recomputation in
backward, run through the blocks' compiled graphs (*traced*): each layer's
prefix on its module, joined, and the chunk compiled with dynamic shapes from
its first call, so a few graphs per block code object serve every layer and
chunk (train/chunked.py). At any CP and TP degree: over a CP group each
chunk's K/V all-gather is a functional collective inside the trace
(attention/prefix.py); under TP each rank's share of a chunk is a multiple of
the TP degree (train/chunked.py ``tp``), as sequence parallelism shards it
evenly (compiled blocks failed on an uneven shard: a RecursionError in
backward). An uncompiled job has nothing to trace: its chunks run the blocks'
own eager code (``force_eager``), whose recompute takes the K/V its forward
gathered instead of gathering again (attention/prefix.py); a traced chunk's
recompute is the forward's graph again, the gather in it, which the cost
model then prices (``CostModel.chunk_regather``: trainer.py passes
``traced``). The trainer logs the choice once (``ChunkPath.line``).
"""

from dataclasses import dataclass

__all__ = ["ChunkPath", "chunk_path"]


@dataclass(frozen=True)
class ChunkPath:
    """How a job's chunks run."""

    traced: bool
    """Through the compiled blocks (chunked_loss(traced=True)); False: their eager code."""
    reason: str

    def line(self, overlength: str = "chunk") -> str | None:
        """The start-up log line; None for a job whose ``skrull.overlength`` chunks nothing."""
        if overlength != "chunk":
            return None
        how = "run the compiled blocks" if self.traced else "run the blocks' eager code"
        again = ("a recompute all-gathers a chunk's K/V again at CP > 1, as priced" if self.traced else
                 "a recompute reuses the K/V its chunk's forward gathered")
        return f"Skrull: chunked documents {how}: {self.reason}; {again} (train/chunk_path.py)"


def chunk_path(compiled: bool) -> ChunkPath:
    """Traced in a compiled job, the blocks' eager code otherwise (module docstring)."""
    return ChunkPath(True, "compiled") if compiled else ChunkPath(False, "the job is not compiled")
