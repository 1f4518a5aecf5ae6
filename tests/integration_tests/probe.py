"""Test-side wrapper of a training entry point that saves gradients.

    torchrun ... -m tests.integration_tests.probe torchtitan.train --module ... --config ...
    torchrun ... -m tests.integration_tests.probe skrull_ext.train --config-file JOB.toml ...

With ``SKRULL_PROBE_GRADS=STEP:PATH`` (or several, comma-separated) in the environment, right before the
optimizer step of training step STEP (after accumulation and clipping),
every rank gathers the full gradient of each parameter (FSDP shards are
DTensors; ``full_tensor()`` is a collective, so all ranks take part) and
rank 0 saves ``{parameter name: gradient}`` to PATH with ``torch.save``.
With ``SKRULL_PROBE_NAN=STEP:PATH``, the model's output at training step
STEP is made NaN, and every optimizer step that ran is appended to PATH (one
line from a post-step hook: the training step, then "changed" or "unchanged",
whether it changed the weights), which shows whether the NaN step changed them.
With ``SKRULL_PROBE_PASSES=DIR``, each rank counts the forward passes of
its model (calls of its first model part) in every training step and
appends ``{"step": S, "passes": N}`` to ``DIR/passes.rank<R>.jsonl`` right
before that step's optimizer step: what the trainer really ran, pads included.

With ``SKRULL_PROBE_DYNAMO=DIR``, each rank appends to ``DIR/dynamo.rank<R>.jsonl`` one line per call
of the trainer's chunked samples (``SkrullTrainer._chunked_samples``: their forwards and backwards,
recomputation included), ``{"step": S, "graphs": G, "frames": F}``: the graphs dynamo compiled (a recompile is one
more) and the frames it compiled during the call (``torch._dynamo.utils.counters``), and one line
``{"step": S, "total": {...}}`` of the run's so far right before each optimizer step. TORCH_LOGS
cannot say it here: the ranks fork from a process that imported torch before it was set.
It hooks torch's global optimizer pre-step hook, the global module forward
hook and torchtitan's Trainer constructor, so the product code carries no test switch and torchtitan's
own trainer can be probed the same way.
"""

import os
import runpy
import sys

import torch
import torch.distributed as dist


def _install_grad_probe(step: int, path: str) -> None:
    from torch.optim.optimizer import register_optimizer_step_pre_hook
    from torchtitan.components.optimizer import OptimizersContainer

    from torchtitan_patches.cp_probe import record_trainers

    trainers = record_trainers()

    def hook(optimizer, args, kwargs):
        # Fires for the container and for each optimizer inside it; once is enough.
        if not isinstance(optimizer, OptimizersContainer) or trainers[-1].step != step:
            return
        grads = {}
        for part in trainers[-1].model_parts:
            for name, p in part.named_parameters():
                if p.grad is None:
                    continue
                g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
                # Names as without activation checkpointing (its wrapper adds a level).
                grads[name.replace("_checkpoint_wrapped_module.", "")] = g.detach().to("cpu", copy=True)
        if not dist.is_initialized() or dist.get_rank() == 0:
            torch.save(grads, path)

    register_optimizer_step_pre_hook(hook)


def _install_nan_probe(step: int, path: str) -> None:
    from torch.nn.modules.module import register_module_forward_hook
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
    from torchtitan.components.optimizer import OptimizersContainer

    from torchtitan_patches.cp_probe import record_trainers

    trainers = record_trainers()

    def poison(module, args, output):
        if trainers and trainers[-1].step == step and module is trainers[-1].model_parts[0]:
            return output * float("nan")
        return None

    before = []

    def weights(optimizer):
        return [p.detach().clone() for group in optimizer.param_groups for p in group["params"]]

    def about_to_step(optimizer, args, kwargs):
        if isinstance(optimizer, OptimizersContainer):
            before[:] = weights(optimizer)

    def stepped(optimizer, args, kwargs):
        if isinstance(optimizer, OptimizersContainer):
            changed = any(not torch.equal(a, b) for a, b in zip(before, weights(optimizer)))
            with open(path, "a") as f:
                f.write(f"{trainers[-1].step} {'changed' if changed else 'unchanged'}\n")

    register_module_forward_hook(poison)
    register_optimizer_step_pre_hook(about_to_step)
    register_optimizer_step_post_hook(stepped)


def _install_pass_probe(folder: str) -> None:
    import json

    from torch.nn.modules.module import register_module_forward_hook
    from torch.optim.optimizer import register_optimizer_step_pre_hook
    from torchtitan.components.optimizer import OptimizersContainer

    from torchtitan_patches.cp_probe import record_trainers

    trainers = record_trainers()
    passes: dict[int, int] = {}

    def count(module, args, output):
        if trainers and module is trainers[-1].model_parts[0]:
            passes[trainers[-1].step] = passes.get(trainers[-1].step, 0) + 1
        return None

    def stepped(optimizer, args, kwargs):
        if not isinstance(optimizer, OptimizersContainer):
            return
        step = trainers[-1].step
        rank = dist.get_rank() if dist.is_initialized() else 0
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"passes.rank{rank}.jsonl"), "a") as f:
            f.write(json.dumps({"step": step, "passes": passes.pop(step, 0)}) + "\n")

    register_module_forward_hook(count)
    register_optimizer_step_pre_hook(stepped)


def _install_dynamo_probe(folder: str) -> None:
    import json

    from torch.optim.optimizer import register_optimizer_step_pre_hook
    from torchtitan.components.optimizer import OptimizersContainer

    from skrull_ext.train.trainer import SkrullTrainer
    from torchtitan_patches.cp_probe import record_trainers

    trainers = record_trainers()

    def counts() -> dict[str, int]:
        c = torch._dynamo.utils.counters
        return {"graphs": c["stats"]["unique_graphs"], "frames": c["frames"]["total"]}

    def write(record: dict) -> None:
        rank = dist.get_rank() if dist.is_initialized() else 0
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"dynamo.rank{rank}.jsonl"), "a") as f:
            f.write(json.dumps(record) + "\n")

    inner = SkrullTrainer._chunked_samples

    def chunked_samples(self, step, global_valid_tokens):
        before = counts()
        out = inner(self, step, global_valid_tokens)
        after = counts()
        write({"step": self.step, **{k: after[k] - before[k] for k in after}})
        return out

    def stepped(optimizer, args, kwargs):
        if isinstance(optimizer, OptimizersContainer):
            write({"step": trainers[-1].step, "total": counts()})

    SkrullTrainer._chunked_samples = chunked_samples
    register_optimizer_step_pre_hook(stepped)


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit("usage: python -m tests.integration_tests.probe ENTRY_MODULE [ARGS...]")
    entry, args = sys.argv[1], sys.argv[2:]
    spec = os.environ.get("SKRULL_PROBE_GRADS")
    for one in spec.split(",") if spec else ():
        step, path = one.split(":", 1)
        _install_grad_probe(int(step), path)
    nan = os.environ.get("SKRULL_PROBE_NAN")
    if nan:
        step, path = nan.split(":", 1)
        _install_nan_probe(int(step), path)
    passes = os.environ.get("SKRULL_PROBE_PASSES")
    if passes:
        _install_pass_probe(passes)
    dynamo = os.environ.get("SKRULL_PROBE_DYNAMO")
    if dynamo:
        _install_dynamo_probe(dynamo)
    sys.argv = [entry, *args]
    runpy.run_module(entry, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
