"""State-dict adapter between torchtitan's qwen2_5 decoder and HF
``Qwen2ForCausalLM``.

HF Qwen2 and Qwen3 checkpoints share every key name except inside
attention: Qwen2 has ``{q,k,v}_proj.bias`` and no ``{q,k}_norm``. Both use
rotate_half RoPE, so no row permutation is needed (unlike llama3). The
Qwen3 adapter's key mapping, tied-embedding handling and HF storage reader
therefore carry over; only the attention entries of its map change.
"""

from typing import Any

from torchtitan.models.qwen3.state_dict_adapter import Qwen3StateDictAdapter


# Qwen3 keys a Qwen2 checkpoint never has (QK-norm, MoE); dropped from the
# map so that from_hf fails on them instead of loading a foreign checkpoint.
_QWEN3_ONLY = ("self_attn.q_norm.", "self_attn.k_norm.", "mlp.experts.", "mlp.gate.")


class Qwen2StateDictAdapter(Qwen3StateDictAdapter):
    def __init__(self, model_config: Any, hf_assets_path: str | None):
        super().__init__(model_config, hf_assets_path)
        self.from_hf_map = {
            hf: titan
            for hf, titan in self.from_hf_map.items()
            if not any(part in hf for part in _QWEN3_ONLY)
        }
        for proj in "qkv":
            self.from_hf_map[f"model.layers.{{}}.self_attn.{proj}_proj.bias"] = (
                f"layers.{{}}.attention.qkv_linear.w{proj}.bias"
            )
