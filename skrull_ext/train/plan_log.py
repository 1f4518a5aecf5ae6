"""A per-rank record of what each step scheduled and fed the model.

With ``skrull.plan_log = true`` every rank appends one JSON line per step to
``<dump_folder>/skrull_plans/rank<R>.jsonl``: the global batch's sample
indices, lengths, the plan (DP rank, micro-batch, CP placement per
sequence), the plan digests and a digest of this rank's buffers (tokens,
labels, positions). It answers "what did Skrull do at step N" after the
fact, and it is how tests prove that a resumed run schedules and feeds
exactly what an uninterrupted one does. A resumed run appends, so the file
of a run interrupted and resumed reads like one uninterrupted run.
"""

import hashlib
import json
import os

import torch

from skrull_ext.train.step_checks import gds_digest


def buffers_digest(micro_batches) -> str:
    """sha256 of this rank's micro-batch buffers, in order."""
    h = hashlib.sha256()
    for mb in micro_batches:
        for t in (mb.input, mb.labels, mb.positions):
            h.update(t.to(torch.int64).contiguous().numpy().tobytes())
            h.update(b"|")
    return h.hexdigest()


def step_record(step) -> dict:
    """One line of the log for a ``SkrullStep``."""
    plan = step.plan
    return {
        "step": step.step,
        "dp_rank": step.dp_rank,
        "samples": list(step.samples),
        "lengths": list(plan.input_lengths),
        # Each sequence's rank set, and its (DP rank, CP rank or -1 sharded) view (scheduler/plan.py).
        "plan_first_rank": list(plan.first_rank),
        "plan_num_ranks": list(plan.num_ranks),
        "plan_dp_rank": list(plan.dp_rank),
        "plan_cp_rank": list(plan.cp_rank),
        "plan_micro_batch": list(plan.micro_batch),
        "micro_batches": plan.slots,
        # overlength = "chunk": each chunked document's DP rank, and the samples this rank trained in chunks.
        "plan_chunked_dp_rank": list(plan.chunked_group),
        "chunked_here": [step.samples[len(plan.input_lengths) + k] for k in plan.chunked_of(step.dp_rank)],
        "chunked_here_lengths": [s.length for s in step.chunked],
        "plan_chunked_chunk": list(plan.chunked_chunk),  # each chunked document's chunk, as priced and run
        "plan_digest": plan.digest(),
        "gds_digest": gds_digest(plan),
        "buffers_digest": buffers_digest(step.micro_batches),
        # this rank's buffers as fed, in order: under TP each padded to a multiple of the degree
        "buffer_lengths": [mb.input.numel() for mb in step.micro_batches],
    }


class PlanLog:
    """Appends ``step_record`` lines to this rank's file."""

    def __init__(self, dump_folder: str, rank: int):
        folder = os.path.join(dump_folder, "skrull_plans")
        os.makedirs(folder, exist_ok=True)
        self.path = os.path.join(folder, f"rank{rank}.jsonl")
        self._file = open(self.path, "a", encoding="utf-8")

    def write(self, step) -> None:
        self._file.write(json.dumps(step_record(step)) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_plan_log(path: str) -> dict[int, dict]:
    """Records by step (a later line for the same step wins: a resumed run
    that repeats a step after an unsaved crash logs it twice)."""
    with open(path, encoding="utf-8") as f:
        return {r["step"]: r for r in map(json.loads, f)}
