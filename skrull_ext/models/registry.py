"""Model specs a job can name in its ``[model]`` section.

torchtitan's own families (llama3, qwen3) resolve to their ``model_registry``;
skrull-ext adds ``qwen2_5``, the Qwen2 architecture (``skrull_ext.models.decoders``)
at Qwen2.5-0.5B's sizes (the paper's small model) and a tiny debug size.
"""

from collections.abc import Callable
from dataclasses import dataclass

from torchtitan.models import llama3, qwen3
from torchtitan.protocols.model_spec import ModelSpec

from skrull_ext.models.decoders import DecoderDims, decoder_spec
from skrull_ext.models.hf_config import spec_from_hf


@dataclass(frozen=True)
class ModelFamily:
    registry: Callable[..., ModelSpec]
    """``registry(flavor, attn_backend=...)`` -> ModelSpec."""
    flavors: Callable[[], list[str]]


QWEN2_5_FLAVORS: dict[str, DecoderDims] = {
    "debugmodel": DecoderDims(
        vocab_size=2048, dim=256, n_layers=4, n_heads=8, n_kv_heads=2, head_dim=32,
        hidden_dim=768, rope_theta=1e6, max_seq_len=4096, norm_eps=1e-6, tie_embeddings=True,
    ),
    # Qwen/Qwen2.5-0.5B config.json: 494M parameters.
    "0.5B": DecoderDims(
        vocab_size=151936, dim=896, n_layers=24, n_heads=14, n_kv_heads=2, head_dim=64,
        hidden_dim=4864, rope_theta=1e6, max_seq_len=32768, norm_eps=1e-6, tie_embeddings=True,
    ),
}


def _qwen2_5_registry(flavor: str, attn_backend: str = "flex") -> ModelSpec:
    return decoder_spec("qwen2_5", flavor, QWEN2_5_FLAVORS[flavor], attn_backend)


MODEL_FAMILIES: dict[str, ModelFamily] = {
    "llama3": ModelFamily(llama3.model_registry, lambda: list(llama3.llama3_configs)),
    "qwen3": ModelFamily(qwen3.model_registry, lambda: list(qwen3.qwen3_configs)),
    "qwen2_5": ModelFamily(_qwen2_5_registry, lambda: list(QWEN2_5_FLAVORS)),
}

ATTN_BACKENDS = ("flex", "varlen")


def build_model_spec(
    name: str | None = None,
    flavor: str | None = None,
    attn_backend: str = "flex",
    hf_path: str | None = None,
) -> ModelSpec:
    """Resolve ``[model]`` name/flavor/attn_backend/hf_path; errors list what exists.

    With ``hf_path`` (a HF model folder) the family and sizes come from its
    config.json; ``name``, if given, must be that family, and ``flavor``, if
    given, labels the spec instead of the folder name.
    """
    if attn_backend not in ATTN_BACKENDS:
        raise ValueError(
            f"model.attn_backend: {attn_backend!r} is not one of {list(ATTN_BACKENDS)}"
        )
    if hf_path is not None:
        return _spec_from_folder(hf_path, name, flavor, attn_backend)
    if name not in MODEL_FAMILIES:
        raise ValueError(f"model.name: {name!r} is not one of {sorted(MODEL_FAMILIES)}")
    family = MODEL_FAMILIES[name]
    if flavor not in family.flavors():
        raise ValueError(
            f"model.flavor: {flavor!r} is not a {name} flavor; one of {family.flavors()}"
        )
    return family.registry(flavor, attn_backend=attn_backend)


def _spec_from_folder(
    hf_path: str, name: str | None, flavor: str | None, attn_backend: str
) -> ModelSpec:
    if not isinstance(hf_path, str):
        raise ValueError(f"model.hf_path: expected a folder path string, got {hf_path!r}")
    spec = spec_from_hf(hf_path, attn_backend=attn_backend)
    if name is not None and name != spec.name:
        raise ValueError(
            f"model.name: {name!r}, but model.hf_path {hf_path!r} holds a {spec.name} model"
        )
    if flavor is not None:
        spec.flavor = flavor
    return spec
