"""List every call of a Skrull training step that would wait for a GPU, found on CPU.

    python tools/host_syncs.py [--steps 3] [--stacks] [--json OUT] [--local-only dense] [--cuda-sync-debug] [job flags, e.g. --loss.chunk_tokens 64]

Builds the job (default skrull_ext/jobs/debug_cpu.toml, one process) in this process, runs
``--steps`` steps as torchtitan's loop does (gc, train_step, checkpoint save), and records
the last one under skrull_ext/bench/host_syncs.py's HostSyncs: each call site, how often,
and whether the value read is the device's (a wait on CUDA) or a host-built tensor's.

torch.compile refuses to trace under a TorchDispatchMode (``fullgraph=True`` fails), so a
compiled job is audited eager; ``--local-only dense`` then sends its all-local micro-batches
down the path a compiled job takes (attention_input's LocalOnlyBatch, local_only.py).
On a GPU, ``--cuda-sync-debug`` checks the same step as the job runs it (compiled included) with
torch's CUDA sync debug mode instead, each synchronising call with its call site.
"""

import json
import sys

from skrull_ext.bench.host_syncs import HostSyncs
from skrull_ext.bench.step_harness import build_trainer, device_tensors, run_steps


def cuda_sync_debug(trainer, steps: int) -> None:
    """On a GPU, the job as it is (compiled too): the last of ``steps`` steps under torch's own
    CUDA sync debug mode ("warn": every synchronising CUDA call warns), each warning with the call
    site it came from (skrull_ext/bench/host_syncs.py call_site). Not yet run on a GPU."""
    import collections
    import warnings

    import torch

    from skrull_ext.bench.host_syncs import call_site

    if trainer.device.type != "cuda":
        raise SystemExit("--cuda-sync-debug needs a CUDA job")
    seen: collections.Counter = collections.Counter()

    def record(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" in str(message):
            site, via, n, _ = call_site()
            seen[(f"{site}:{n}", via, str(message).split(".")[0])] += 1

    try:
        run_steps(trainer, steps - 1)
        torch.cuda.synchronize()
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = record
            torch.cuda.set_sync_debug_mode("warn")
            try:
                run_steps(trainer, 1)
            finally:
                torch.cuda.set_sync_debug_mode("default")
    finally:
        trainer.close()
    print(f"step {trainer.step}: {sum(seen.values())} synchronising CUDA calls (torch.cuda sync debug mode)")
    for (site, via, message), n in sorted(seen.items()):
        print(f"{n:4d} x {message} at {site}" + (f" (via {via})" if via else ""))


def main(argv: list[str]) -> None:
    steps = 3
    stacks = "--stacks" in argv
    if stacks:
        argv.remove("--stacks")
    out = None
    if "--json" in argv:
        i = argv.index("--json")
        out = argv[i + 1]
        del argv[i:i + 2]
    if "--steps" in argv:
        i = argv.index("--steps")
        steps = int(argv[i + 1])
        del argv[i:i + 2]
    local_only = None
    if "--local-only" in argv:  # the compiled job's all-local path, eager (a dispatch mode stops torch.compile)
        i = argv.index("--local-only")
        local_only = argv[i + 1]
        del argv[i:i + 2]
    cuda_debug = "--cuda-sync-debug" in argv
    if cuda_debug:
        argv.remove("--cuda-sync-debug")
    trainer = build_trainer(argv)
    if local_only is not None:
        trainer.local_only_kernel = local_only
    if cuda_debug:
        return cuda_sync_debug(trainer, steps)
    try:
        run_steps(trainer, steps - 1)
        with HostSyncs(device_tensors(trainer), stacks=stacks) as rec:
            run_steps(trainer, 1)
    finally:
        trainer.close()
    print(f"step {trainer.step}: {len(rec.waits())} waits for the device, {len(rec.syncs)} reads in all")
    for line in rec.lines():
        print(line)
    if out is not None:
        with open(out, "w") as f:
            json.dump([{"op": op, "site": site, "via": via, "count": n,
                        "device": any(s.device for s in rec.syncs if (s.op, s.site, s.via) == (op, site, via))}
                       for (op, site, via), n in rec.counted(waits_only=False).items()], f, indent=1)
    if stacks:  # one stack per call site
        seen = set()
        for s in rec.syncs:
            if (s.op, s.site, s.via) not in seen:
                seen.add((s.op, s.site, s.via))
                print(f"\n{s.said()}:\n  " + "\n  ".join(s.stack[-8:]))


if __name__ == "__main__":
    main(sys.argv[1:])
