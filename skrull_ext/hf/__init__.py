"""HF model folders in and out: config.json -> ModelSpec (``config``),
safetensors <-> torchtitan state dict (``weights``), and the Qwen2 adapter
torchtitan lacks (``qwen2_adapter``)."""
