"""torchtitan decoder configs at any size, for llama3, qwen3 and qwen2_5.

torchtitan 0.3.0's registries only build their named flavors, and its
per-family layer builders are private with some sizes fixed (Qwen3's RMSNorm
eps, Llama3's head_dim). A pretrained checkpoint brings its own sizes
(``skrull_ext.models.hf_config`` reads them from config.json), and the qwen2_5
flavors need the Qwen2 attention torchtitan lacks, so the three families are
built here from one plain ``DecoderDims`` with torchtitan's public pieces:
``make_gqa_config`` (so attention is torchtitan's ``GQAttention``, whose
``inner_attention`` DACP replaces), ``make_ffn_config``, RMSNorm, RoPE.

The families differ only where their HF models do:

- llama3: ComplexRoPE (interleaved pairs; the adapter permutes HF's q/k
  rows), optional Llama-3.1 frequency scaling, no biases, no QK-norm.
- qwen3: CosSinRoPE (HF's rotate_half), RMSNorm on each q/k head.
- qwen2_5: CosSinRoPE, biases on q/k/v (not on o), no QK-norm. Qwen2 and
  Qwen3 blocks are otherwise identical, so torchtitan's Qwen3 block and model
  classes (and its Qwen3 parallelize/sharding, which shard biases) serve.
"""

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch.nn as nn
from torchtitan.distributed.pipeline_parallel import pipeline_llm
from torchtitan.models.common import ComplexRoPE, CosSinRoPE, Embedding, Linear, RMSNorm
from torchtitan.models.common.config_utils import (
    get_attention_config,
    make_ffn_config,
    make_gqa_config,
)
from torchtitan.models.common.decoder import Decoder
from torchtitan.models.common.param_init import skip_param_init
from torchtitan.models.llama3 import Llama3Model, parallelize_llama
from torchtitan.models.llama3.model import Llama3TransformerBlock
from torchtitan.models.llama3.state_dict_adapter import Llama3StateDictAdapter
from torchtitan.models.qwen3 import Qwen3Model, parallelize_qwen3
from torchtitan.models.qwen3.model import Qwen3TransformerBlock
from torchtitan.models.qwen3.state_dict_adapter import Qwen3StateDictAdapter
from torchtitan.protocols.model_spec import ModelSpec

from skrull_ext.models.qwen2_adapter import Qwen2StateDictAdapter


@dataclass(frozen=True)
class LlamaRopeScaling:
    """Llama 3.1's RoPE frequency scaling (HF ``rope_type = "llama3"``)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class DecoderDims:
    """The sizes that tell one dense decoder of a family from another."""

    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden_dim: int
    """FFN (SwiGLU) inner width."""
    rope_theta: float
    max_seq_len: int
    """RoPE cache length; the trainer shrinks it to ``training.seq_len``."""
    norm_eps: float
    tie_embeddings: bool
    rope_scaling: LlamaRopeScaling | None = None
    """llama3 only."""


# Used only when a model is trained from scratch; a pretrained checkpoint
# overwrites every parameter. Normal(0.02) as in torchtitan's Qwen3.
_LINEAR_INIT: dict[str, Callable] = {
    "weight": partial(nn.init.normal_, std=0.02),
    "bias": nn.init.zeros_,
}
_NORM_INIT = {"weight": nn.init.ones_}
_EMBEDDING_INIT = {"weight": partial(nn.init.normal_, std=0.02)}


def _norm(size: int, dims: DecoderDims) -> RMSNorm.Config:
    return RMSNorm.Config(normalized_shape=size, eps=dims.norm_eps, param_init=_NORM_INIT)


def _rope(dims: DecoderDims, cls: type) -> ComplexRoPE.Config | CosSinRoPE.Config:
    scaling = dims.rope_scaling
    if scaling is None:
        return cls.Config(dim=dims.head_dim, max_seq_len=dims.max_seq_len, theta=dims.rope_theta)
    return cls.Config(
        dim=dims.head_dim,
        max_seq_len=dims.max_seq_len,
        theta=dims.rope_theta,
        scaling="llama",
        scaling_factor=scaling.factor,
        low_freq_factor=scaling.low_freq_factor,
        high_freq_factor=scaling.high_freq_factor,
        original_max_position_embeddings=scaling.original_max_position_embeddings,
    )


def _with_qkv_bias(qkv_linear) -> None:
    """Turn on the q/k/v biases of a fused or separate projection config.

    torchtitan's ``Linear.Config`` has a ``bias`` flag, and ``FusedQKVLinear``
    already splits and merges ``wqkv.bias`` in its state-dict hooks, so
    Qwen2's attention needs no new module.
    """
    linears = [qkv_linear.wqkv] if hasattr(qkv_linear, "wqkv") else [qkv_linear.wq, qkv_linear.wkv]
    for linear in linears:
        linear.bias = True


def _decoder(
    model_cls: type[Decoder],
    block_cls: type,
    dims: DecoderDims,
    attn_backend: str,
    *,
    rope_cls: type,
    qk_norm: bool,
    qkv_bias: bool,
) -> Decoder.Config:
    inner_attention = get_attention_config(attn_backend)
    layers = []
    for _ in range(dims.n_layers):
        attention = make_gqa_config(
            dim=dims.dim,
            n_heads=dims.n_heads,
            n_kv_heads=dims.n_kv_heads,
            head_dim=dims.head_dim,
            wqkv_param_init=_LINEAR_INIT,
            wo_param_init=_LINEAR_INIT,
            inner_attention=inner_attention,
            fuse_qkv=True,
            rope=_rope(dims, rope_cls),
            qk_norm=_norm(dims.head_dim, dims) if qk_norm else None,
        )
        if qkv_bias:
            _with_qkv_bias(attention.qkv_linear)
        layers.append(
            block_cls.Config(
                attention_norm=_norm(dims.dim, dims),
                ffn_norm=_norm(dims.dim, dims),
                attention=attention,
                feed_forward=make_ffn_config(
                    dim=dims.dim,
                    hidden_dim=dims.hidden_dim,
                    w1_param_init=_LINEAR_INIT,
                    w2w3_param_init=_LINEAR_INIT,
                ),
            )
        )
    # Tied: lm_head.weight is the embedding table, initialized once (as lm_head).
    embedding_init = {"weight": skip_param_init} if dims.tie_embeddings else _EMBEDDING_INIT
    return model_cls.Config(
        vocab_size=dims.vocab_size,
        dim=dims.dim,
        norm=_norm(dims.dim, dims),
        enable_weight_tying=dims.tie_embeddings,
        tok_embeddings=Embedding.Config(
            num_embeddings=dims.vocab_size,
            embedding_dim=dims.dim,
            param_init=embedding_init,
        ),
        lm_head=Linear.Config(
            in_features=dims.dim, out_features=dims.vocab_size, param_init=_LINEAR_INIT
        ),
        layers=layers,
    )


def llama3_config(dims: DecoderDims, attn_backend: str) -> Llama3Model.Config:
    return _decoder(
        Llama3Model, Llama3TransformerBlock, dims, attn_backend,
        rope_cls=ComplexRoPE, qk_norm=False, qkv_bias=False,
    )


def qwen3_config(dims: DecoderDims, attn_backend: str) -> Qwen3Model.Config:
    return _decoder(
        Qwen3Model, Qwen3TransformerBlock, dims, attn_backend,
        rope_cls=CosSinRoPE, qk_norm=True, qkv_bias=False,
    )


def qwen2_5_config(dims: DecoderDims, attn_backend: str) -> Qwen3Model.Config:
    return _decoder(
        Qwen3Model, Qwen3TransformerBlock, dims, attn_backend,
        rope_cls=CosSinRoPE, qk_norm=False, qkv_bias=True,
    )


@dataclass(frozen=True)
class DecoderFamily:
    config: Callable[[DecoderDims, str], Decoder.Config]
    parallelize_fn: Callable
    state_dict_adapter: type


DECODER_FAMILIES: dict[str, DecoderFamily] = {
    "llama3": DecoderFamily(llama3_config, parallelize_llama, Llama3StateDictAdapter),
    "qwen3": DecoderFamily(qwen3_config, parallelize_qwen3, Qwen3StateDictAdapter),
    "qwen2_5": DecoderFamily(qwen2_5_config, parallelize_qwen3, Qwen2StateDictAdapter),
}


def decoder_spec(family: str, flavor: str, dims: DecoderDims, attn_backend: str = "flex") -> ModelSpec:
    """A ModelSpec of ``family`` at ``dims`` (named ``flavor``)."""
    if dims.rope_scaling is not None and family != "llama3":
        raise ValueError(f"{family}: Llama-3 RoPE scaling applies to llama3 only")
    fam = DECODER_FAMILIES[family]
    return ModelSpec(
        name=family,
        flavor=flavor,
        model=fam.config(dims, attn_backend),
        parallelize_fn=fam.parallelize_fn,
        pipelining_fn=pipeline_llm,
        post_optimizer_build_fn=None,
        state_dict_adapter=fam.state_dict_adapter,
    )
