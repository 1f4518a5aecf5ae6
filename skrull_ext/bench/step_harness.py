"""A job's trainer built in this process and stepped as torchtitan's loop steps it.

For measurements of the step's host path on CPU (host_syncs.py, tools/host_syncs.py,
tools/host_overhead.py): one process, the job file's trainer (``config.build()``), the
checkpoint loaded as ``Trainer.train`` loads it (SkrullTrainer's start checks run there),
then each step the body of torchtitan 0.3.0's loop (``Trainer.train``): the GC handler,
``train_step``, the checkpoint save.
"""

from __future__ import annotations

import dataclasses
import os
import socket

from torchtitan_patches import compat

compat.install_import_shims()  # before torchtitan is imported (torch 2.11-2.12)

import torch  # noqa: E402

__all__ = ["DEBUG_JOB", "HOST_FLAVOR", "build_trainer", "device_tensors", "register_host_flavor", "run_steps"]

DEBUG_JOB = os.path.join(os.path.dirname(os.path.dirname(__file__)), "jobs", "debug_cpu.toml")


HOST_FLAVOR = "host24"
"""A llama3 flavor of the depth of Qwen2.5-0.5B (24 layers) and almost no width (dim 64, 4 heads,
the debug model's vocabulary 2048): its FLOPs are negligible on CPU, so a step's time is the
host's work, per layer as on the GPU job. ``--model.flavor host24 --skrull.cost_model h100-assumed``
(a preset: no measured profile is of this shape)."""


def register_host_flavor() -> None:
    """Add ``HOST_FLAVOR`` to torchtitan's llama3 flavors (this process only)."""
    from torchtitan.models import llama3

    configs = llama3.llama3_configs
    if HOST_FLAVOR in configs:
        return
    debug = configs["debugmodel"]

    def host24(attn_backend: str, tp_gemm_backend="default"):
        config = debug(attn_backend=attn_backend, tp_gemm_backend=tp_gemm_backend)
        dim, heads, layers = 64, 4, 24
        return dataclasses.replace(
            config, dim=dim,
            tok_embeddings=dataclasses.replace(config.tok_embeddings, embedding_dim=dim),
            norm=dataclasses.replace(config.norm, normalized_shape=dim),
            lm_head=dataclasses.replace(config.lm_head, in_features=dim),
            layers=llama3._build_llama3_layers(
                fuse_qkv=True, n_layers=layers, dim=dim, n_heads=heads,
                hidden_dim=llama3.compute_ffn_hidden_dim(dim, multiple_of=64),
                rope=dataclasses.replace(config.layers[0].attention.rope, dim=dim // heads),
                attn_backend=attn_backend, tp_gemm_backend=tp_gemm_backend))

    configs[HOST_FLAVOR] = host24


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_trainer(flags: list[str], job: str = DEBUG_JOB):
    """The trainer of ``job`` with ``flags`` (``--section.key value``), one process (a world of
    one rank, gloo), its checkpoint (if any) loaded and its data iterator ready."""
    from torchtitan.tools.logging import init_logger

    from skrull_ext.train import trainer as _registers  # noqa: F401  (config.build() finds the trainers)
    from skrull_ext.train.job.job_file import load_config

    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_WORLD_SIZE", "1"),
                       ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    init_logger()
    register_host_flavor()
    config = load_config(["--config-file", job, *flags], module="skrull_ext.train")
    trainer = config.build()
    trainer.checkpointer.load(step=config.checkpoint.load_step)
    trainer._harness_data = trainer.batch_generator(trainer.dataloader)
    return trainer


def run_steps(trainer, n: int) -> None:
    """``n`` steps, each the body of torchtitan's ``Trainer.train`` loop."""
    for _ in range(n):
        trainer.step += 1
        trainer.gc_handler.run(trainer.step)
        trainer.train_step(trainer._harness_data)
        trainer.checkpointer.save(trainer.step, last_step=(trainer.step == trainer.config.training.steps))


def device_tensors(trainer) -> list[torch.Tensor]:
    """What a GPU job keeps on the device before a step: parameters, gradients, optimizer states."""
    out = []
    for part in trainer.model_parts:
        for p in part.parameters():
            out.append(p)
            if p.grad is not None:
                out.append(p.grad)
    for opt in getattr(trainer.optimizers, "optimizers", [trainer.optimizers]):
        for state in getattr(opt, "state", {}).values():
            out.extend(v for v in state.values() if isinstance(v, torch.Tensor))
    return out
