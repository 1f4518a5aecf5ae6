"""Model specs a job can name in its ``[model]`` section.

torchtitan's own families (llama3, qwen3) resolve to their ``model_registry``;
skrull-ext adds ``qwen2_5`` with a Qwen2.5-0.5B-sized flavor (the paper's
small model), built from torchtitan's Qwen3 blocks at Qwen2.5-0.5B sizes.
"""

from collections.abc import Callable
from dataclasses import dataclass

from torchtitan.models import llama3, qwen3
from torchtitan.protocols.model_spec import ModelSpec


@dataclass(frozen=True)
class ModelFamily:
    registry: Callable[..., ModelSpec]
    """``registry(flavor, attn_backend=...)`` -> ModelSpec."""
    flavors: Callable[[], list[str]]


def _qwen2_5_0_5b_sized(attn_backend: str):
    """Qwen2.5-0.5B sizes: dim 896, 24 layers, 14 heads, 2 KV heads of 64,
    FFN 4864, vocab 151936, tied embeddings, RoPE theta 1e6, 32K context.

    Differs from the released model only in the attention block's details
    (Qwen3-style QK-norm instead of QKV bias): same shapes, same FLOPs within
    0.1%, which is what the scheduler's cost model sees. Uses torchtitan
    0.3.0's private Qwen3 builders (no public builder takes these sizes).
    """
    from torchtitan.models.common import CosSinRoPE, Embedding, Linear
    from torchtitan.models.qwen3 import (
        _build_qwen3_layers,
        _EMBEDDING_SKIP_INIT,
        _LINEAR_INIT,
        _qwen3_norm,
        Qwen3Model,
    )

    dim, head_dim, vocab = 896, 64, 151936
    return Qwen3Model.Config(
        vocab_size=vocab,
        dim=dim,
        norm=_qwen3_norm(dim),
        enable_weight_tying=True,
        tok_embeddings=Embedding.Config(
            num_embeddings=vocab, embedding_dim=dim, param_init=_EMBEDDING_SKIP_INIT
        ),
        lm_head=Linear.Config(in_features=dim, out_features=vocab, param_init=_LINEAR_INIT),
        layers=_build_qwen3_layers(
            n_layers=24,
            dim=dim,
            n_heads=14,
            n_kv_heads=2,
            head_dim=head_dim,
            hidden_dim=4864,
            attn_backend=attn_backend,
            rope=CosSinRoPE.Config(dim=head_dim, max_seq_len=32768, theta=1000000.0),
        ),
    )


_QWEN2_5_FLAVORS = {"0.5B-sized": _qwen2_5_0_5b_sized}


def _qwen2_5_registry(flavor: str, attn_backend: str = "flex") -> ModelSpec:
    base = qwen3.model_registry("0.6B", attn_backend=attn_backend)
    base.name, base.flavor = "qwen2_5", flavor
    base.model = _QWEN2_5_FLAVORS[flavor](attn_backend)
    return base


MODEL_FAMILIES: dict[str, ModelFamily] = {
    "llama3": ModelFamily(llama3.model_registry, lambda: list(llama3.llama3_configs)),
    "qwen3": ModelFamily(qwen3.model_registry, lambda: list(qwen3.qwen3_configs)),
    "qwen2_5": ModelFamily(_qwen2_5_registry, lambda: list(_QWEN2_5_FLAVORS)),
}

ATTN_BACKENDS = ("flex", "varlen")


def build_model_spec(name: str, flavor: str, attn_backend: str = "flex") -> ModelSpec:
    """Resolve ``[model]`` name/flavor/attn_backend; errors list what exists."""
    if name not in MODEL_FAMILIES:
        raise ValueError(f"model.name: {name!r} is not one of {sorted(MODEL_FAMILIES)}")
    family = MODEL_FAMILIES[name]
    if flavor not in family.flavors():
        raise ValueError(
            f"model.flavor: {flavor!r} is not a {name} flavor; one of {family.flavors()}"
        )
    if attn_backend not in ATTN_BACKENDS:
        raise ValueError(
            f"model.attn_backend: {attn_backend!r} is not one of {list(ATTN_BACKENDS)}"
        )
    return family.registry(flavor, attn_backend=attn_backend)
