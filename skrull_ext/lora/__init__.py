"""LoRA fine-tuning: the ``[lora]`` section (``config``), torchtitan's
converter with layer selection and dropout (``converter``), applying it to a
job's model spec (``apply``), and peft / merged HF folders out (``peft_io``).
See docs/lora.md."""

from skrull_ext.lora.apply import apply_lora, with_lora
from skrull_ext.lora.config import LoRAConfig

__all__ = ["LoRAConfig", "apply_lora", "with_lora"]
