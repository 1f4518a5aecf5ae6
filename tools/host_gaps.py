"""The host's time between a step's phases, with the prefetch thread building at once, held, or off.

    nice -n 10 python tools/host_gaps.py [--steps 15] [job flags]
    # the docs' figures: --model.flavor host24 --skrull.cost_model h100-assumed --skrull.free_running false
    #                    --dataloader.global_batch_size 16

On a GPU a step's ``rest`` (the time no phase covers) is the device idle while the host does the
work between the phases (zero_grad, the learning rates, the step's prologue). The dataloader's
prefetch thread builds the next step in Python (17 ms a step on the H200 run), holding the GIL;
started as a step is handed out, that build runs exactly there. This runs the job three times, one
process each (a world of one rank), one thread for torch: the prefetch thread building at once
(``hold_builds`` off), held until the micro-batches are queued (the trainer's default), and no
thread (``dataloader.prefetch_steps 0``); it prints each run's median and max ``rest_host_ms``
(train/step_phases.py) over ``--steps`` steps after 3 of warm-up, and the ratios to the held run.
"""

import json
import os
import statistics
import subprocess
import sys

RUNS = (("at once", ["--hold", "off"]), ("held", []), ("no thread", ["--dataloader.prefetch_steps", "0"]))


def child(argv: list[str]) -> None:
    import torch

    from skrull_ext.bench.step_harness import build_trainer, run_steps

    steps, hold = 15, True
    if "--steps" in argv:
        i = argv.index("--steps")
        steps = int(argv[i + 1])
        del argv[i:i + 2]
    if "--hold" in argv:
        i = argv.index("--hold")
        hold = argv[i + 1] != "off"
        del argv[i:i + 2]
    torch.set_num_threads(1)  # no OpenMP spinning against the other load of a shared host
    trainer = build_trainer(["--training.steps", str(steps + 10), *argv])
    trainer.dataloader.hold_builds = hold
    try:
        run_steps(trainer, 3 + steps)
    finally:
        trainer.close()
    read = trainer.step_phases.read[3:]
    print("RESULT " + json.dumps([t.rest_host_ms for t in read]))


def main(argv: list[str]) -> None:
    if os.environ.get("HOST_GAPS_CHILD"):
        return child(argv)
    out = {}
    for name, flags in RUNS:
        done = subprocess.run([sys.executable, __file__, *argv, *flags], capture_output=True, text=True,
                              env={**os.environ, "HOST_GAPS_CHILD": "1"}, check=True)
        line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
        out[name] = json.loads(line[len("RESULT "):])
    held = statistics.median(out["held"])
    print("host ms between the phases a step (rest_host), median / max over the steps:")
    for name, v in out.items():
        med = statistics.median(v)
        print(f"  {name:10s} {med:6.2f} / {max(v):6.2f}  x{med / held:.2f} the held run's")


if __name__ == "__main__":
    main(sys.argv[1:])
