"""tools/gpu_ab_modes.txt: the A/B variants tools/gpu_checks.sh's --issue57 preset runs on a GPU.

The dry run in CI leaves them out (its time), so their flags are checked here, against the GPU job
file as the script runs it at one device: each line loads, and each of its flags changes the
setting it names (a flag that changes nothing would time the same run twice)."""

import shlex
from pathlib import Path

import pytest

from skrull_ext.train.job.job_checks import check_job
from skrull_ext.train.job.job_file import load_config

ROOT = Path(__file__).resolve().parents[2]
JOB = str(ROOT / "skrull_ext" / "jobs" / "qwen2_5_0_5b_gpu.toml")
ONE = ["--parallelism.data_parallel_shard_degree", "1", "--parallelism.context_parallel_degree", "1",
       "--dataloader.max_len", "16384", "--training.seq_len", "16384"]  # gpu_checks.sh's `one`


def variants() -> list[tuple[str, list[str]]]:
    out = []
    for line in (ROOT / "tools" / "gpu_ab_modes.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, *flags = shlex.split(line)
            out.append((name, flags))
    return out


def test_the_file_names_the_variants_the_preset_runs():
    names = [name for name, _ in variants()]
    assert names == ["skrull-head-recompute", "skrull-reshard-never", "skrull-cudnn", "skrull-cudnn-expanded"]
    script = (ROOT / "tools" / "gpu_checks.sh").read_text()
    assert all(f"[{name}]=" in script for name in names)  # each has its run limit in the preset


@pytest.mark.parametrize("name,flags", variants(), ids=[name for name, _ in variants()])
def test_each_variant_loads_and_changes_what_it_names(name, flags):
    # checked as on the GPU machine: the cuDNN kernels are refused on this CPU (test_cudnn_kernel.py)
    base = load_config(["--config-file", JOB, *ONE], world_size=1, check=False)
    varied = load_config(["--config-file", JOB, *ONE, *flags], world_size=1, check=False)
    for config in (base, varied):
        check_job(config, world_size=1, on_cpu=False)
    assert flags and len(flags) % 2 == 0, flags
    for key, value in zip(flags[::2], flags[1::2]):
        section, field = key.removeprefix("--").split(".")
        before, after = getattr(getattr(base, section), field), getattr(getattr(varied, section), field)
        assert str(after) == value and before != after, (name, key, before, after)


@pytest.mark.parametrize("trace, mix, mode, want", [
    ("1", "first", "skrull-bucket-profile", True),  # the traced run
    ("1", "first", "skrull-head-recompute", True),  # its variants under the same profiler (their traces dropped)
    ("1", "first", "skrull-reshard-never", True),
    ("1", "first", "skrull-cudnn", True),  # the kernel A/B's pick, when stage 3'' adds it
    ("1", "first", "torchtitan-documents", False),
    ("1", "second", "skrull-head-recompute", False),  # the first mix only
    ("0", "first", "skrull-bucket-profile", False),
])
def test_the_variants_train_under_the_traced_runs_profiler(trace, mix, mode, want):
    """GPU run 9 read its untraced variants against the traced Skrull run, whose optimizer phase alone
    took 4 ms more under the profiler: the script's ``traced`` predicate, run as the script defines it."""
    import subprocess

    script = (ROOT / "tools" / "gpu_checks.sh").read_text()
    body = script[script.index("\ntraced() {") + 1:]
    body = body[:body.index("\n}\n") + 3]
    names = " ".join(name for name, _ in variants())
    proc = subprocess.run(["bash", "-c", f'{body}\nTRACE={trace} mixes=(first second) trace_mode=skrull-bucket-profile '
                           f'variants=({names}); traced {mix} {mode}'], capture_output=True, text=True)
    assert proc.stderr == "" and (proc.returncode == 0) == want, proc


@pytest.mark.parametrize("kernel_mode, late, modes, want, says", [
    ("skrull-cudnn", "skrull-head-recompute torchtitan-stream", "",
     "skrull-cudnn skrull-head-recompute torchtitan-stream", ""),  # first in line: the budget cuts the last
    ("skrull-cudnn-expanded", "", "", "skrull-cudnn-expanded", ""),
    ("", "torchtitan-stream", "", "torchtitan-stream", ""),  # 3''' chose none
    ("skrull-cudnn", "torchtitan-stream skrull-cudnn", "", "torchtitan-stream skrull-cudnn", ""),  # named already
    ("skrull-cudnn", "torchtitan-stream", "skrull skrull-cudnn", "torchtitan-stream", ""),  # MODES runs it
    ("Traceback (most recent call last)", "torchtitan-stream", "", "torchtitan-stream",
     "kernel choice: Traceback (most recent call last) is not a mode of tools/gpu_ab_modes.txt, not trained"),
])
def test_the_kernel_ab_pick_goes_first_among_the_late_modes(kernel_mode, late, modes, want, says):
    """The script's ``with_kernel_mode``, run as the script defines it, on the variants of gpu_ab_modes.txt."""
    import subprocess

    script = (ROOT / "tools" / "gpu_checks.sh").read_text()
    body = script[script.index("\nwith_kernel_mode() {") + 1:]
    body = body[:body.index("\n}\n") + 3]
    names = " ".join(name for name, _ in variants())
    proc = subprocess.run(["bash", "-c", f'set -u\nsay() {{ echo "$*"; }}\n{body}\nvariants=({names}) late=({late}) '
                           f'kernel_mode="{kernel_mode}" MODES="{modes}"; with_kernel_mode; echo "late: ${{late[*]}}"'],
                          capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stderr == "", proc
    assert proc.stdout.splitlines() == [*([says] if says else []), f"late: {want}"], proc.stdout
