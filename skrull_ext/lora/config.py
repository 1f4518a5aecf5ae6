# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""``LoRAConfig``: the ``[lora]`` section of a job.

Users name target modules as peft and HF do (``q_proj`` ... ``down_proj``),
because the adapter they get back is a peft folder with those names. The
torchtitan decoders skrull-ext trains (llama3, qwen2_5, qwen3; see
``skrull_ext.models.decoders``) fuse q, k and v into one ``wqkv`` linear, so one
LoRA pair on ``wqkv`` serves all three: q, k and v are targeted together or
not at all. That pair exports exactly to peft's three (one shared
``lora_A``, ``lora_B`` split by rows; ``skrull_ext.lora.peft_io``).

Values are checked when the config is made, naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass, field

HF_TO_TITAN: dict[str, str] = {
    "q_proj": "wqkv",
    "k_proj": "wqkv",
    "v_proj": "wqkv",
    "o_proj": "wo",
    "gate_proj": "w1",
    "down_proj": "w2",
    "up_proj": "w3",
}
"""peft/HF module name -> the torchtitan linear it lives in (decoder layers only)."""

QKV = ("q_proj", "k_proj", "v_proj")

HEAD = "lm_head"
"""The head (output projection): its peft/HF name, torchtitan's too. A target only when named
(not in the default): the merged folder and the adapter folder then carry it too, so it is
refused where either could not (``layers``; a head tied to the embedding: converter.py)."""

ALLOWED = (*HF_TO_TITAN, HEAD)
"""Every name ``target_modules`` takes."""


@dataclass(kw_only=True, slots=True)
class LoRAConfig:
    enable: bool = False
    """Train LoRA adapters on a frozen base model. A ``[lora]`` table in a job file turns this on."""

    rank: int = 8
    """Rank r of each adapter pair (lora_A: r x in, lora_B: out x r)."""

    alpha: float = 16.0
    """Adapter output scale is alpha / rank (as torchtitan and peft)."""

    dropout: float = 0.0
    """Dropout on the adapter's input while training (peft's lora_dropout). 0 keeps runs
    reproducible across parallel layouts: each layout draws different masks."""

    target_modules: list[str] = field(default_factory=lambda: list(HF_TO_TITAN))
    """peft/HF names of the linears to adapt; q_proj, k_proj, v_proj go together (fused wqkv).
    lm_head, the head, only when named (not with layers, nor on a model whose head is its embedding)."""

    layers: list[int] | None = None
    """Decoder layer indices to adapt (peft's layers_to_transform); None: every layer."""

    save_adapter: bool = True
    """After training, write the adapter as a peft folder to <dump_folder>/lora_adapter."""

    save_merged: bool = False
    """After training, also write the merged model as a HF folder to <dump_folder>/lora_merged
    (config.json, tokenizer files and chat template too; weights in checkpoint.export_dtype)."""

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank <= 0:
            raise ValueError(f"lora.rank: must be a positive integer, got {self.rank!r}")
        if not self.alpha > 0:
            raise ValueError(f"lora.alpha: must be positive, got {self.alpha!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"lora.dropout: must be in [0, 1), got {self.dropout!r}")
        targets = list(self.target_modules)
        unknown = sorted(set(targets) - set(ALLOWED))
        if unknown:
            raise ValueError(f"lora.target_modules: {unknown} unknown; allowed: {list(ALLOWED)}")
        if not targets:
            raise ValueError("lora.target_modules: empty; name at least one of " f"{list(ALLOWED)}")
        qkv = [t for t in QKV if t in targets]
        if qkv and len(qkv) != 3:
            raise ValueError(
                f"lora.target_modules: {qkv} without {[t for t in QKV if t not in qkv]}: the decoders fuse "
                "q, k and v into one linear (wqkv), so q_proj, k_proj and v_proj are adapted together"
            )
        if self.layers is not None:
            bad = [i for i in self.layers if isinstance(i, bool) or not isinstance(i, int) or i < 0]
            if bad or not self.layers:
                raise ValueError(f"lora.layers: expected non-negative layer indices, got {self.layers!r}")
            if len(set(self.layers)) != len(self.layers):
                raise ValueError(f"lora.layers: repeated indices in {self.layers!r}")
            if HEAD in targets:
                raise ValueError(
                    f"lora.layers: {self.layers!r} with {HEAD!r} in lora.target_modules: peft's layers_to_transform "
                    f"adapts only modules inside the listed layers, so the adapter folder would load without the "
                    f"head's adapter; adapt the head with every layer (no lora.layers) or leave {HEAD!r} out")

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    def titan_targets(self) -> list[str]:
        """The torchtitan linear names to convert (last FQN segment; the head's is its own)."""
        return sorted({HF_TO_TITAN.get(t, t) for t in self.target_modules})

    def hf_targets(self) -> list[str]:
        """peft's ``target_modules``, in ``ALLOWED`` order (q/k/v always together, the head last)."""
        chosen = set(self.target_modules)
        return [t for t in ALLOWED if t in chosen]
