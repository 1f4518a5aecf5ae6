"""List every call of a Skrull training step that would wait for a GPU, found on CPU.

    python tools/host_syncs.py [--steps 3] [--stacks] [--json OUT] [--local-only dense] [job flags, e.g. --loss.chunk_tokens 64]

Builds the job (default skrull_ext/jobs/debug_cpu.toml, one process) in this process, runs
``--steps`` steps as torchtitan's loop does (gc, train_step, checkpoint save), and records
the last one under skrull_ext/bench/host_syncs.py's HostSyncs: each call site, how often,
and whether the value read is the device's (a wait on CUDA) or a host-built tensor's.

torch.compile refuses to trace under a TorchDispatchMode (``fullgraph=True`` fails), so a
compiled job is audited eager; ``--local-only dense`` then sends its all-local micro-batches
down the path a compiled job takes (attention_input's LocalOnlyBatch, local_only.py).
"""

import json
import sys

from skrull_ext.bench.host_syncs import HostSyncs
from skrull_ext.bench.step_harness import build_trainer, device_tensors, run_steps


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
    trainer = build_trainer(argv)
    if local_only is not None:
        trainer.local_only_kernel = local_only
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
