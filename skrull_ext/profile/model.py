# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""The job's own model, built the way torchtitan's Trainer builds it.

The profiler must time the layers the job trains, not a stand-in: this
follows ``torchtitan.trainer.Trainer.__init__`` (0.3.0) for one rank without
parallelism: ``update_from_config``, the config's ``--override.imports``
(on CPU, torchtitan_patches' dense-mask attention), ``build()`` under the compute
dtype, ``init_states``, then the job's activation checkpointing and
per-block ``torch.compile``, and, when the job trains with Skrull, the DACP
attention it will run (``[skrull] attention_kernel``; CP 1, every document
local, as the cost model's compute term means), installed as the trainer
installs it. FSDP/TP are left out on purpose: the profile
describes one rank's work on its tokens, and the sharding shows up in the
static-memory account (memory.py), not in the per-token numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torchtitan.components.loss import ChunkedLossWrapper

from skrull_ext._core import ModelShape
from skrull_ext.scheduler.model_shape import DTYPES, compute_dtype, fsdp_degree, model_compiled, spec_shape
from skrull_ext.train import head_loss  # (also wires [loss]'s build() to ChunkedHeadLoss, as the trainers do)

__all__ = ["DTYPES", "JobModel", "build_job_model", "compute_dtype", "fsdp_degree"]


@dataclass
class JobModel:
    """A built model plus what the profiler needs to feed and describe it."""

    config: Any
    model: nn.Module
    shape: ModelShape
    name: str
    device: torch.device
    dtype: torch.dtype
    loss_fn: Any
    vocab_size: int
    max_len: int
    dacp: bool = False
    """The attention is DACP's (buffers carry a DacpBatchMeta), not torchtitan's."""

    @property
    def layers(self) -> list[nn.Module]:
        return list(self.model.layers.values())

    def buffer(self, doc_lengths: list[int], seed: int = 0) -> dict[str, torch.Tensor]:
        """A packed buffer: random tokens, positions restarting at 0 per
        document (torchtitan's document mask reads boundaries from them),
        and the attention masks the job's backend needs."""
        n = sum(doc_lengths)
        if n > self.max_len:
            raise ValueError(f"buffer of {n} tokens is longer than the model was built for ({self.max_len})")
        g = torch.Generator().manual_seed(seed)
        tokens = torch.randint(1, self.vocab_size, (1, n), generator=g).to(self.device)
        labels = torch.randint(1, self.vocab_size, (1, n), generator=g).to(self.device)
        positions = torch.cat([torch.arange(s) for s in doc_lengths]).unsqueeze(0).to(self.device)
        if self.dacp:  # as the trainer hands them to the blocks (compiled: traced when all local)
            from skrull_ext.attention import build_meta
            from skrull_ext.attention.local_only import attention_input, local_only_kernel

            skrull = self.config.skrull
            kernel = local_only_kernel(skrull.attention_kernel, model_compiled(self.config), self.device, self.dtype)
            masks = attention_input(build_meta(doc_lengths, [0] * len(doc_lengths), 0, 1), kernel, self.device)
        elif hasattr(self.model, "get_attention_masks"):
            masks = self.model.get_attention_masks(positions=positions)
        else:
            masks = None
        return {"tokens": tokens, "labels": labels, "positions": positions, "attention_masks": masks}


def build_job_model(config: Any, device: torch.device, max_len: int) -> JobModel:
    """Build ``config.model_spec``'s model on ``device`` for buffers up to
    ``max_len`` tokens (its RoPE cache is sized from ``training.seq_len``)."""
    from torchtitan.config.override import apply_overrides
    from torchtitan.distributed import utils as dist_utils
    from torchtitan.models.common.config_utils import decoder_vocab_size

    from skrull_ext.lora import apply_lora

    apply_lora(config)  # the model the trainer builds: adapters on a frozen base
    spec = config.model_spec
    mc = spec.model
    intrinsic = mc.max_seq_len
    if max_len > intrinsic:
        raise ValueError(f"profiling needs {max_len}-token buffers; {spec.name} {spec.flavor} supports {intrinsic}")
    config.training.seq_len = max(config.training.seq_len, max_len)
    mc.update_from_config(config=config)
    if config.override.imports:
        apply_overrides(config.override, config)
    dist_utils.set_spmd_backend(config.parallelism.spmd_backend)

    dtype = compute_dtype(config)
    with torch.device(device):
        prev = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            model = mc.build()
        finally:
            torch.set_default_dtype(prev)
    model.init_states(buffer_device=device)
    model.to(device)
    if config.activation_checkpoint is not None:
        config.activation_checkpoint.build(dump_folder=config.dump_folder).apply(model)
    skrull = getattr(config, "skrull", None)
    dacp = skrull is not None and skrull.enable
    if model_compiled(config):
        if dacp:  # the fusions a compiled Skrull job trains with (train/compile_limit.py)
            from skrull_ext.train.compile_limit import length_free_fusion

            length_free_fusion(True)
        for block in model.layers.values():
            block.compile(backend=config.compile.backend, fullgraph=True)
    if dacp:  # after AC and compile, as SkrullTrainer does after torchtitan's parallelize
        from torchtitan_patches.dacp_attention import install_dacp_attention

        install_dacp_attention([model], None, kernel=skrull.attention_kernel, exchange=skrull.kv_exchange)

    shape = spec_shape(mc, dtype)
    assert shape.layers == len(model.layers)
    # compiled where the trainer compiles it (torchtitan's compile.components holds "loss"):
    # an eager loss materialises float32 logits and their gradient, 20 GB at 16K tokens of a
    # 152K vocabulary, which a compiled run never holds (GPU run 3, docs/results/gpu.md).
    loss_fn = config.loss.build(compile_config=config.compile)
    if isinstance(loss_fn, ChunkedLossWrapper):  # the head runs in the loss, as torchtitan's Trainer wires it
        loss_fn.set_lm_head(model.lm_head)
        model._skip_lm_head = True
    if isinstance(loss_fn, head_loss.ChunkedHeadLoss):  # its chunks' gradients as the job's (job_trainer.py)
        loss_fn.set_head_backward(head_loss.resolve_head_backward(
            config.loss, model.lm_head, loss_fn.loss_fn, config.parallelism.tensor_parallel_degree > 1,
            dacp and skrull.overlength == "chunk").mode)
    return JobModel(
        config=config,
        model=model,
        shape=shape,
        name=f"{spec.name}/{spec.flavor}",
        device=device,
        dtype=dtype,
        loss_fn=loss_fn,
        vocab_size=decoder_vocab_size(spec),
        max_len=config.training.seq_len,
        dacp=dacp,
    )
