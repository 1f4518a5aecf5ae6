"""``@override`` factories of skrull-ext (torchtitan config/override.py).

Activate with ``--override.imports torchtitan_patches.overrides.<function>``;
``torchtitan_patches.apply(config)`` activates ``cpu_dense_mask_attention``
by itself when there is no accelerator.
"""

from torchtitan.config.override import derive, override
from torchtitan.models.common.attention import FlexAttention

from torchtitan_patches.dense_attention import DenseMaskAttention


@override(
    target=FlexAttention.Config,
    description="SDPA with a dense mask from the FlexAttention mask_mod (CPU)",
)
def cpu_dense_mask_attention(cfg: FlexAttention.Config) -> DenseMaskAttention.Config:
    return derive(cfg, DenseMaskAttention.Config)
