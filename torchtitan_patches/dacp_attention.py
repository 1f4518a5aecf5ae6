"""Installing DACP attention into a built torchtitan model.

torchtitan has no extension point for a model's inner attention once built,
so this replaces the module (and torchtitan's own CP wrapper): a change to
torchtitan's behaviour, hence here with the other patches. Used by the
trainer and the profiler alike (the profiler times the attention the job
trains with).
The kernel and the K/V transport are resolved here, once per layer, from the
``[skrull]`` names: a bad name fails before the first step.
"""

from torchtitan.models.common.attention import GQAttention
from torchtitan.tools.logging import logger

from skrull_ext.attention.module import DacpAttention

__all__ = ["activate_flash_attention_impl", "install_dacp_attention"]


def activate_flash_attention_impl() -> str | None:
    """Select the flash attention the GPU runs best, as torchtitan's
    VarlenAttention does when it is built (FA3 on Hopper, FA4 on Blackwell,
    torch's default FA2 below), so the DACP varlen kernel gets it too when the
    model was built with another attention. Process-wide; a no-op off CUDA.
    Returns the implementation now active (None: torch's default)."""
    from torch.nn.attention import activate_flash_attention_impl as activate
    from torch.nn.attention import current_flash_attention_impl
    from torchtitan.tools.utils import get_cuda_flash_attention_impl

    impl = get_cuda_flash_attention_impl()
    if impl is not None and current_flash_attention_impl() != impl:
        activate(impl)  # an implementation whose package is absent is never chosen (compat.py)
        logger.info(f"DACP attention: flash attention implementation {impl} activated for the varlen kernel")
    return current_flash_attention_impl()


def install_dacp_attention(model_parts, cp_group, kernel: str = "auto",
                           exchange: str = "auto") -> list[DacpAttention]:
    """Replace every GQAttention's inner attention by DACP attention on ``cp_group``,
    whose parts run on the attention ``kernel`` (``[skrull] attention_kernel``) and
    move K/V with ``exchange`` (``[skrull] kv_exchange``).

    Done after torchtitan's parallelize_fn: that is where torchtitan itself
    installs its CP attention wrapper (apply_cp_to_forward), which this
    replaces together with the module it wrapped. The inner attention holds
    no parameters, so FSDP, AC and checkpoints are unaffected. A kernel that
    may resolve to varlen first activates the GPU's flash attention
    implementation (activate_flash_attention_impl).
    """
    if kernel in ("varlen", "auto"):
        activate_flash_attention_impl()
    installed = []
    for part in model_parts:
        for module in part.modules():
            if isinstance(module, GQAttention):
                module.inner_attention = DacpAttention(cp_group, kernel=kernel, exchange=exchange)
                installed.append(module.inner_attention)
    if not installed:
        raise ValueError("no GQAttention found: this model family is not supported by Skrull yet")
    return installed
