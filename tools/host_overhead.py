"""Host time of a Skrull micro-batch against the bare model's forward and backward, side by side.

    nice -n 10 python tools/host_overhead.py [--rounds 20] [--ops] [job flags, e.g. --loss.chunk_tokens 64]

A micro-batch's fixed cost on a GPU is host time (the profile's 128-token steps: wall = process
CPU). On CPU, with a tiny model (the debug job's by default: 6 layers of dim 256) and one thread,
most of a micro-batch's time is the host's too, so what the trainer's path adds around the model
shows here. Builds the job in this process (skrull_ext/bench/step_harness.py), trains 2 steps, then
takes the next step's micro-batches and times, alternating, ``--rounds`` times each:

- ``skrull``: the trainer's own micro-batch loop, ``step_passes`` (train/passes.py: the layers'
  counters reset, attention_input, the copies, ``fwd_bwd_fn`` with the job's loss, the
  accumulation), over the step's micro-batches;
- ``bare``: for each micro-batch, the model called on the same buffer with its meta
  (``model(tokens, positions, meta)``), the head applied where the model skips it, a plain
  summed cross-entropy, ``backward``.

Both on this thread's CPU clock (``time.thread_time``: other processes' load does not count),
gradients zeroed (set to None) before each. Prints the median per micro-batch of each, the
difference and the ratio; ``--ops`` also counts the aten ops each dispatches (exact, no noise).
"""

import statistics
import sys
import time

import torch
import torch.nn.functional as F

from skrull_ext.bench.step_harness import build_trainer, run_steps
from skrull_ext.train.passes import step_passes


def _bare(trainer, step) -> None:
    model, loss_fn = trainer.model_parts[0], trainer.loss_fn
    head = getattr(loss_fn, "lm_head", None)
    for mb in step.micro_batches:
        out = model(mb.input, mb.positions, mb.meta)
        if not getattr(loss_fn, "head_in_model", True):  # the model stopped before its head's computation
            out = F.linear(out, head.weight, head.bias)
        loss = F.cross_entropy(out.flatten(0, 1).float(), mb.labels.flatten(0, 1), reduction="sum") / step.loss_tokens
        loss.backward()


def _skrull(trainer, step) -> None:
    step_passes(trainer, step, torch.full((), step.loss_tokens, device=trainer.device))


class _Count(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def _timed(trainer, fn, step) -> float:
    trainer.optimizers.zero_grad(set_to_none=True)
    start = time.thread_time()
    fn(trainer, step)
    return time.thread_time() - start


def main(argv: list[str]) -> None:
    rounds, ops = 20, "--ops" in argv
    if ops:
        argv.remove("--ops")
    if "--rounds" in argv:
        i = argv.index("--rounds")
        rounds = int(argv[i + 1])
        del argv[i:i + 2]
    torch.set_num_threads(1)  # the host's work on this thread's clock
    trainer = build_trainer(["--training.steps", "1000", *argv])
    try:
        run_steps(trainer, 2)
        step = next(trainer._harness_data)
        n = len(step.micro_batches)
        times = {"skrull": [], "bare": []}
        for _ in range(rounds):
            for name, fn in (("skrull", _skrull), ("bare", _bare)):
                times[name].append(_timed(trainer, fn, step) * 1e3 / n)
        counts = {}
        if ops:
            for name, fn in (("skrull", _skrull), ("bare", _bare)):
                trainer.optimizers.zero_grad(set_to_none=True)
                with _Count() as c:
                    fn(trainer, step)
                counts[name] = c.n / n
        trainer.optimizers.zero_grad(set_to_none=True)
    finally:
        trainer.close()
    tokens = [mb.num_tokens for mb in step.micro_batches]
    print(f"{n} micro-batches of {tokens} tokens, {rounds} rounds each, alternating; "
          f"thread CPU ms per micro-batch (median, min):")
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in times.items():
        extra = f", {counts[k]:.0f} aten ops" if k in counts else ""
        print(f"  {k:7s} {med[k]:8.3f}  {min(v):8.3f}{extra}")
    print(f"  skrull - bare {med['skrull'] - med['bare']:.3f} ms a micro-batch, skrull / bare x{med['skrull'] / med['bare']:.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
