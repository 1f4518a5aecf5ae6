"""Skrull under torchtitan's tensor parallelism (TP), and what it refuses.

torchtitan 0.3.0's TP plan for llama3/qwen3 (``models/common/decoder_sharding.py``)
shards the Q/K/V projections column-wise, so each TP rank's inner attention sees
``n_heads / tp`` heads of every token of its CP rank's buffer (sequence
parallelism shards the sequence over TP only between blocks; the attention
block all-gathers it back first). DACP composes with that unchanged:

- heads: ``DacpAttention`` runs on this rank's local heads (q, k, v arrive as
  DTensors sharded on the head dim; skrull_ext/attention/module.py);
- K/V exchange: over torchtitan's ``cp`` mesh of this rank, the ranks that share
  its DP and TP coordinates, so each TP rank exchanges its own heads' K/V;
- data: the dataloader's DP rank is the ``batch`` mesh's (DP only) and its CP
  rank the ``cp`` mesh's, so every TP rank of a (DP, CP) position builds the
  same buffers from the same plan;
- cost: ``ModelShape.tp`` divides a rank's FLOPs and exchanged K/V bytes by TP
  (cpp/include/skrull/cost_model.hpp);
- loss: torchtitan's loss over the vocab-sharded logits is the same on every
  TP rank; the step's loss is summed over the ``loss`` mesh (DP x CP) as before;
- length: each buffer padded to a multiple of the TP degree, as sequence
  parallelism shards it between blocks (data/steps/buffers.py pad_to_multiple:
  compiled blocks failed on an uneven shard).

Tested over gloo at TP 2 x CP 2 and DP 2 x TP 2 against the 1-process reference
(tests/integration_tests/test_parity_tp.py), and compiled at TP 2
(tests/integration_tests/test_chunk_dp_run.py).
"""

from __future__ import annotations

from skrull_ext.errors import JobFileError

__all__ = ["PP_REASON", "check_skrull_parallelism", "pp_refusal"]

PP_REASON = (
    "a Skrull step runs its plan's micro-batches, each a buffer of its own length with its own "
    "DacpBatchMeta, a number that differs from step to step; torchtitan's pipeline schedules split one "
    "fixed-shape local batch into parallelism.pipeline_parallel_microbatch_size rows and pass plain "
    "tensors between stages, so they cannot carry those micro-batches or their metadata through the stages"
)
"""Why ``skrull.enable`` refuses pipeline parallelism."""


def pp_refusal(degree: int) -> str:
    """The one-line refusal of ``parallelism.pipeline_parallel_degree = degree`` under Skrull."""
    return (f"parallelism.pipeline_parallel_degree = {degree}: skrull.enable does not run with pipeline "
            f"parallelism: {PP_REASON}")


def check_skrull_parallelism(config, on_cpu: bool) -> None:
    """Raise JobFileError naming the key when Skrull cannot run this job's parallelism:
    PP (``PP_REASON``); TP with ``skrull-pool`` (its exchange sets name world ranks, one
    TP rank of each, so the other TP ranks' heads would never be exchanged); TP under an
    ``spmd_backend`` other than ``partial_dtensor`` on a GPU (on CPU torchtitan_patches
    sets it): only that backend hands the inner attention DTensors of local heads."""
    skrull = getattr(config, "skrull", None)
    if skrull is None or not skrull.enable:
        return
    p = config.parallelism
    if p.pipeline_parallel_degree > 1:
        raise JobFileError(pp_refusal(p.pipeline_parallel_degree))
    if p.tensor_parallel_degree <= 1:
        return
    if skrull.policy_spec.pool:  # the section's Policy, resolved once when it was made
        raise JobFileError(
            f"skrull.policy = {skrull.policy!r}: skrull-pool does not run with parallelism.tensor_parallel_degree = "
            f"{p.tensor_parallel_degree} (its K/V exchange sets name world ranks, so only one TP rank's heads "
            "would be exchanged); use policy skrull"
        )
    if not on_cpu and p.spmd_backend != "partial_dtensor":
        raise JobFileError(
            f"parallelism.spmd_backend = {p.spmd_backend!r}: Skrull with tensor_parallel_degree "
            f"{p.tensor_parallel_degree} runs under 'partial_dtensor' only (the backend whose TP hands the inner "
            "attention DTensors of its local heads, tested over gloo); set parallelism.spmd_backend = "
            "'partial_dtensor'"
        )
