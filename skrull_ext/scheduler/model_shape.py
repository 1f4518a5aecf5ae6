"""The cost model's ``ModelShape`` of the model a job trains.

The scheduler prices a sequence by the model's layers, hidden width, K/V
width and activation bytes (docs/design/cost_model.md). Those come from the
job itself, ``config.model_spec`` and its training dtype, so the cost model
always describes the model that trains; ``[skrull] cost_model`` only names
the hardware (a preset or a measured profile, whose own ``[model]`` must then
be this shape). The offline profiler (skrull_ext/profile/model.py) describes
the model it builds with the same functions, so a profile it writes matches
the job it was measured for.
"""

from __future__ import annotations

from typing import Any

import torch

from skrull_ext._core import ModelShape

__all__ = ["DTYPES", "compute_dtype", "fsdp_degree", "job_shape", "kv_width", "model_compiled", "q_width",
           "spec_shape"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def fsdp_degree(config: Any, world_size: int) -> int:
    """Ranks one parameter is sharded over: torchtitan's 'fsdp' mesh is
    dp_shard x cp, with dp_shard = -1 taking what the other degrees leave."""
    p = config.parallelism
    shard = p.data_parallel_shard_degree
    if shard == -1:
        others = p.data_parallel_replicate_degree * p.context_parallel_degree * p.tensor_parallel_degree \
            * p.pipeline_parallel_degree
        if world_size % others:
            raise ValueError(f"world size {world_size} is not a multiple of the job's other parallel degrees ({others})")
        shard = world_size // others
    return max(1, shard * p.context_parallel_degree)


def compute_dtype(config: Any) -> torch.dtype:
    """Dtype of activations: ``mixed_precision_param``. torchtitan 0.3.0's
    decoders (llama3, qwen3) apply FSDP2 at every degree, 1 included, for its
    MixedPrecisionPolicy, so one GPU computes in it too."""
    return DTYPES[config.training.mixed_precision_param]


def model_compiled(config: Any) -> bool:
    """Whether torchtitan compiles the job's transformer blocks (a profile records it:
    compile changes a layer's time and memory)."""
    return bool(config.compile.enable and "model" in config.compile.components)


def _heads_width(attn: Any, dim: int, heads_keys: tuple[str, ...]) -> int:
    """heads * head_dim of an attention config, the heads from the first of ``heads_keys``
    set (llama3 keeps them on qkv_linear); ``dim`` without an explicit head_dim (MHA)."""
    for src in (getattr(attn, "qkv_linear", None), attn):
        if src is None:
            continue
        heads = next((h for h in (getattr(src, k, None) for k in heads_keys) if h), None)
        head_dim = getattr(src, "head_dim", None)
        if heads and head_dim:
            return int(heads) * int(head_dim)
    return dim


def kv_width(attn: Any, dim: int) -> int:
    """n_kv_heads * head_dim of an attention config (n_heads where it has no n_kv_heads)."""
    return _heads_width(attn, dim, ("n_kv_heads", "n_heads"))


def q_width(attn: Any, dim: int) -> int:
    """n_heads * head_dim of an attention config: the query heads' width."""
    return _heads_width(attn, dim, ("n_heads",))


def spec_shape(model_config: Any, dtype: torch.dtype, tp: int = 1) -> ModelShape:
    """Shape of a decoder config (a ModelSpec's ``model``) computing in ``dtype``,
    its heads and columns split over ``tp`` ranks (the cost model prices one rank's share)."""
    dim = int(model_config.dim)
    return ModelShape(len(model_config.layers), dim, kv_width(model_config.first_attention, dim), dtype.itemsize,
                      tp=tp)


def job_shape(config: Any) -> ModelShape:
    """Shape of the model a job trains, as one rank of its TP group computes it
    (``parallelism.tensor_parallel_degree``)."""
    return spec_shape(config.model_spec.model, compute_dtype(config), config.parallelism.tensor_parallel_degree)
