# Copyright (c) skrull-ext contributors.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""The job's own model, built the way torchtitan's Trainer builds it.

The profiler must time the model the job trains, not a stand-in: this
follows ``torchtitan.trainer.Trainer.__init__`` (0.3.0) for the profile's
launch: ``update_from_config``, the config's ``--override.imports`` (on CPU,
torchtitan_patches' dense-mask attention), ``build()`` on the meta device in
``training.dtype``, then the model spec's own ``parallelize_fn`` (the job's
activation checkpointing, per-block ``torch.compile``, and FSDP with the
job's ``MixedPrecisionPolicy`` and reshard policy), ``to_empty`` and
``init_weights``; and, when the job trains with Skrull, the DACP attention
it will run (``[skrull] attention_kernel``; CP 1, every document local, as
the cost model's compute term means), installed after it as SkrullTrainer
installs it.

FSDP is applied at every world size, one process included, because
torchtitan's llama3/qwen3 ``parallelize_fn`` applies it there too
(``apply_fsdp_to_decoder`` over the always-present "fsdp" mesh, "for the
MixedPrecisionPolicy"): the trainer's parameters are ``training.dtype``
(float32) DTensors, cast to ``mixed_precision_param`` by FSDP's unshard
copy before each unit runs, its gradients reduced in
``mixed_precision_reduce``. Those copies and hooks are in every layer,
micro-batch and head the profile times (``wrapping`` describes a model's,
to compare the two). The FSDP mesh is every rank of this launch and nothing else: the
profile describes one rank's work on whole documents (no CP, TP or PP mesh);
the job's sharding shows in the static-memory account (memory.py).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torchtitan.components.loss import ChunkedLossWrapper

from skrull_ext._core import ModelShape
from skrull_ext.scheduler.model_shape import DTYPES, compute_dtype, fsdp_degree, model_compiled, spec_shape
from skrull_ext.train import head_loss  # (also wires [loss]'s build() to ChunkedHeadLoss, as the trainers do)

__all__ = ["DTYPES", "JobModel", "build_job_model", "compute_dtype", "fsdp_degree", "profile_dims", "wrapping", "wrapping_line"]


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
    owns_group: bool = False
    """The build made this process's one-rank process group (``close`` destroys it)."""

    def close(self) -> None:
        """Destroy the one-rank process group the build made, if it made one."""
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()
        self.owns_group = False

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


def wrapping(model: nn.Module) -> dict[str, Any]:
    """How a model is wrapped for training, to compare the profile's with the trainer's: per
    FSDP unit (module name; "" the root) its mixed-precision policy, whether it reshards after
    forward and the size of its mesh; per parameter its dtype, whether FSDP holds it as a
    DTensor shard, and whether it is frozen (a LoRA base). A model without FSDP has no units."""
    from torch.distributed.fsdp import FSDPModule

    units = {}
    for name, module in model.named_modules():
        if not isinstance(module, FSDPModule):
            continue
        state = module._get_fsdp_state()
        group = state._fsdp_param_group
        mp = state._mp_policy
        units[name] = {
            "param_dtype": str(mp.param_dtype), "reduce_dtype": str(mp.reduce_dtype),
            "output_dtype": str(mp.output_dtype), "cast_forward_inputs": mp.cast_forward_inputs,
            "reshard_after_forward": None if group is None else group.post_forward_mesh_info is not None,
            "mesh_size": None if group is None else group.mesh_info.mesh.size(),
        }
    params = {name: f"{p.dtype}{' DTensor' if hasattr(p, 'to_local') else ''}{'' if p.requires_grad else ' frozen'}"
              for name, p in model.named_parameters()}
    return {"units": units, "params": params}


def wrapping_line(model: nn.Module) -> str:
    """One line of ``wrapping``: the profile's meta and report say what was timed."""
    w = wrapping(model)
    if not w["units"]:
        return "no FSDP"
    root = w["units"].get("", next(iter(w["units"].values())))
    size = next((u["mesh_size"] for u in w["units"].values() if u["mesh_size"]), 1)  # the root may hold none
    return (f"FSDP x{size} ({len(w['units'])} units), parameters "
            f"{'/'.join(sorted({v.split()[0].removeprefix('torch.') for v in w['params'].values()}))}, "
            f"compute {root['param_dtype'].removeprefix('torch.')}, reduce {root['reduce_dtype'].removeprefix('torch.')}")


def profile_dims(config: Any, world: int):
    """The trainer's ``ParallelDims`` for the profile's launch of ``world`` ranks: FSDP over
    all of them (dp_shard = world), no CP, TP, PP or EP (the profile times one rank's work
    on whole documents), the job's ``spmd_backend``."""
    from torchtitan.distributed import ParallelDims

    return ParallelDims(dp_replicate=1, dp_shard=world, cp=1, tp=1, pp=1, ep=1, world_size=world,
                        spmd_backend=config.parallelism.spmd_backend)


def _process_group(device: torch.device) -> bool:
    """A process group for FSDP's mesh: this launch's, else one of this process alone (the
    trainer's world of one). True when it made one (the caller's to destroy: JobModel.close)."""
    if dist.is_initialized():
        return False
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=dist.HashStore(), rank=0,
                            world_size=1)
    return True


def build_job_model(config: Any, device: torch.device, max_len: int) -> JobModel:
    """Build ``config.model_spec``'s model on ``device`` for buffers up to
    ``max_len`` tokens (its RoPE cache is sized from ``training.seq_len``),
    parallelized as the trainer parallelizes it (module docstring)."""
    from torchtitan.config import TORCH_DTYPE_MAP
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
    owns_group = _process_group(device)

    dtype = compute_dtype(config)
    with torch.device("meta"):
        prev = torch.get_default_dtype()
        torch.set_default_dtype(TORCH_DTYPE_MAP[config.training.dtype])  # the trainer's: FSDP casts to dtype
        try:
            model = mc.build()
        finally:
            torch.set_default_dtype(prev)
    skrull = getattr(config, "skrull", None)
    dacp = skrull is not None and skrull.enable
    if model_compiled(config) and dacp:  # the fusions a compiled Skrull job trains with (train/compile_limit.py)
        from skrull_ext.train.compile_limit import length_free_fusion

        length_free_fusion(True)
    # AC, per-block compile, FSDP (at one rank too): the trainer's own parallelize function
    model = spec.parallelize_fn(model, parallel_dims=profile_dims(config, dist.get_world_size()),
                                training=config.training, parallelism=config.parallelism,
                                compile_config=config.compile, ac_config=config.activation_checkpoint,
                                dump_folder=config.dump_folder)
    model.to_empty(device=device)
    with torch.no_grad(), warnings.catch_warnings():
        # drawn on FSDP's DTensors; on a CPU mesh torch warns that its random ops "may not have
        # complete support": the trainer's logs drop it (torchtitan_patches/logs.py says why)
        warnings.filterwarnings("ignore", message=r"DTensor random operators may not have complete support")
        model.init_weights(buffer_device=None)
    model.train()
    # The root runs first in training; the profile calls blocks and the head's parts alone,
    # so FSDP's root is settled here (else the first unit called would take it).
    model._get_fsdp_state()._lazy_init()
    if dacp:  # after AC and compile, as SkrullTrainer does after torchtitan's parallelize
        from torchtitan_patches.dacp_attention import install_dacp_attention

        install_dacp_attention([model], None, kernel=skrull.attention_kernel, exchange=skrull.kv_exchange)
        if model_compiled(config):  # the blocks' token dimension dynamic from the first call, as the trainer's
            from skrull_ext.train.dynamic_tokens import mark_blocks

            mark_blocks([model])

    shape = spec_shape(mc, dtype)
    assert shape.layers == len(model.layers)
    # compiled where the trainer compiles it (torchtitan's compile.components holds "loss"):
    # an eager loss materialises float32 logits and their gradient, 20 GB at 16K tokens of a
    # 152K vocabulary, which a compiled run never holds (GPU run 3, docs/results/gpu.md).
    loss_fn = config.loss.build(compile_config=config.compile)
    if isinstance(loss_fn, ChunkedLossWrapper):  # the head runs in the loss, as torchtitan's Trainer wires it
        loss_fn.set_lm_head(model.lm_head)
        model._skip_lm_head = True
    if isinstance(loss_fn, head_loss.ChunkedHeadLoss):  # its chunks as the job's run them (job_trainer.py)
        # the head module called in the model's forward (its FSDP unit's hooks there), its weight per chunk
        loss_fn.pass_head_through([model])
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
        owns_group=owns_group,
    )
