"""tools/gpu_checks.sh --dry-run: the GPU machine's command, run here on CPU.

GPU time is rare (a lent machine, about 15 minutes, no network), so the
command must work the first time it meets a GPU. Its dry run goes through
the same stages at toy sizes, in two calls: the attention stages
(``--skip-trainer``: the machine record, the core, the CUDA test cases
collected (they skip here), the profiled overlap runs on CPU) and the trainer
stages as the next GPU session runs them (``--issue57``: the trainer's CUDA
cases, a profile of two checkpointing modes, the trainer in its three modes
(1 process: skrull, the whole-document baseline, then the stream as a late
mode under a budget) and their table with issue 48's document-aware columns
and issue 57's phases, checkpointing mode, BucketSize and head chunk; the
skrull run's one step past its timed ones under torch.profiler and
``bench trace-report`` of it). A stage
that breaks shows here as a summary line that is not a pass.
"""

import itertools
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def dry_run(out: Path, *flags: str, **env: str) -> list[str]:
    """The script's summary lines after a dry run with ``flags`` (it must exit 0)."""
    proc = subprocess.run(["bash", "tools/gpu_checks.sh", "--dry-run", *flags], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env=dict(os.environ, OUT=str(out), PYTHON=sys.executable, **env))
    summary = (out / "summary.txt").read_text()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = summary.splitlines()
    assert lines[0].startswith("torch ") and "devices 0" in lines[0]  # the machine record
    assert any(line.startswith("core: installed ") for line in lines), summary
    return lines


def archived(out: Path) -> set[str]:
    with tarfile.open(out / "gpu_checks.tar.gz") as tar:
        return set(tar.getnames())


def skipped_cases(lines: list[str]) -> list[str]:
    """The CUDA cases the summary lists (``cuda_cases``' lines: two spaces, a state, the name), each checked
    skipped (collected, none ran)."""
    cases = [line.split() for line in lines if line.startswith(("  passed ", "  skipped ", "  FAILED "))]
    assert cases and all(state == "skipped" for state, *_ in cases), lines
    return [name for _, name, *_ in cases]


@pytest.mark.slow
def test_gpu_checks_dry_run_attention_stages(tmp_path):
    lines = dry_run(tmp_path, "--skip-trainer")
    summary = "\n".join(lines)
    pytest_line = next(line for line in lines if line.startswith("pytest ("))
    assert pytest_line.startswith("pytest (rc 0)") and "skipped" in pytest_line, summary
    skipped_cases(lines)
    assert "overlap cp 2 kernel auto (rc 0)" in summary, summary  # auto is the dense kernel on CPU
    assert not any(line.startswith(("profile", "train ")) for line in lines), summary  # no trainer stage
    names = archived(tmp_path)
    for name in ("logs/env.txt", "logs/pytest_cuda.xml", "overlap_cp2_auto/overlap.json",
                 "overlap_cp2_auto/rank1.trace.json.gz"):
        assert f"./{name}" in names, sorted(names)


@pytest.mark.slow
def test_gpu_checks_dry_run_issue57_preset(tmp_path):
    # a BUDGET the late stream fits: the gate is evaluated, nothing cut
    lines = dry_run(tmp_path, "--issue57", BUDGET="100000")
    summary = "\n".join(lines)
    assert next(line for line in lines if line.startswith("trainer CUDA tests (")).startswith(
        "trainer CUDA tests (rc 0)"), summary
    assert {"test_bf16_head_loss_on_cuda_equals_unchunked[recompute]", "test_bf16_head_loss_on_cuda_equals_unchunked"
            "[in_forward]", "test_real_trace_on_cuda"} <= set(skipped_cases(lines))  # both loss.head_backward modes
    assert not any(line.startswith(("pytest (", "overlap ")) for line in lines), summary  # trainer stages only
    # KERNEL_AB: both shapes ran, each backend agreeing with the float64 oracle before its one row (CPU: the oracle)
    for shape in ("heads 14/2 x 64", "--heads 4 --kv-heads 2 --head-dim 8"):
        at = lines.index(f"attention backends, {shape} (rc 0):")
        assert lines[at + 1].startswith("agreement reference: max |error| / max |value| ") and lines[at + 2].startswith(
            "| 256 | "), summary
    # 3''': no flash row on CPU, so no cuDNN kernel joins the late modes (tools/kernel_choice.py)
    assert "kernel choice: none: no flash attention time at the largest buffer (256 tokens)" in lines, summary
    assert any(line.startswith("profile (rc 0): a_us_per_flop = ") for line in lines), summary
    # the micro-batch's two fixed costs and the one the scheduler got (CPU: no host floor, the short one)
    assert any(line.startswith("profile  micro-b  fixed ") for line in lines), summary
    assert any(line.startswith("profile  device-b fixed ") and "the scheduler gets the short one" in line
               for line in lines), summary
    modes = ("skrull", "torchtitan-documents", "torchtitan-stream")
    trained = [line for line in lines if line.startswith("train job ")]
    assert [line.split()[2] for line in trained] == list(modes), summary  # the stream last: a late mode
    for mode, line in zip(modes, trained):
        last = 6 if mode == "skrull" else 5  # TRACE: the skrull run's one traced step past its 5 timed ones
        assert line.startswith(f"train job {mode} (rc 0): step:  {last} "), summary
        assert f"recompiles job {mode}: 0; guards: " in lines, summary  # eager: nothing compiles
    assert not any(line.startswith("cut: ") for line in lines), summary
    header = next(line for line in lines if line.startswith("| mode |"))
    columns = [c.strip() for c in header.split("|")[1:-1]]
    table_lines = itertools.takewhile(lambda line: line.startswith("| "), lines[lines.index(header) + 2:])
    rows = {r[0]: dict(zip(columns, r)) for r in ([c.strip() for c in line.split("|")[1:-1]] for line in table_lines)}
    assert sorted(rows) == sorted(modes), summary
    for mode, r in rows.items():
        assert r["losses finite"] == "yes" and r["real tokens/s"] != "-", summary
        assert float(r["document-aware TFLOP/s a device"]) > 0, summary  # issue 48's columns, measured
        assert r["recompiles after warm-up"] == "0", summary
    assert rows["torchtitan-documents"]["cut documents"] == "0" == rows["skrull"]["cut documents"], summary
    assert int(rows["torchtitan-stream"]["cut documents"].replace(",", "")) > 0, summary  # the stream cuts
    phases = "step phases ms, median (outside the micro-batches)"  # issue 57: the whole step by phase
    skrull = rows["skrull"]
    assert skrull[phases].startswith("data ") and " mb " in skrull[phases], summary
    for mode in ("torchtitan-documents", "torchtitan-stream"):  # torchtitan's own batching, timed the same way
        assert rows[mode][phases].startswith("data ") and " mb " in rows[mode][phases], summary
    # issue 57: the mode chosen among the profile's two (the debug job's none and selective), the BucketSize
    # the script names, the head's chunk; the table's whole step and memory measured against the prediction
    assert skrull["activation checkpointing"] in ("none", "selective") and skrull["BucketSize"] == "512", summary
    assert skrull["head chunk tokens"] != "-", summary
    assert skrull["measured / predicted step"].startswith("x") and skrull["reserved / predicted"].startswith("x")
    assert rows["torchtitan-documents"]["activation checkpointing"] == "-", summary  # not a Skrull run
    from skrull_ext.scheduler.profile_file import Profile

    old = Profile.load(ROOT / "profiles" / "cpu-debug-1proc.toml").bucket_size  # the script's --before in a dry run
    bucket = next(line for line in lines if line.startswith("BucketSize before: "))
    assert bucket.startswith(f"BucketSize before: {old:,} (profiles/cpu-debug-1proc.toml"), bucket
    assert " none " in bucket and " selective " in bucket, bucket  # the fresh profile's two modes
    assert f"skrull as run: 512 (x{512 / old:.2f}), {skrull['activation checkpointing']}" in bucket, bucket
    assert any(line.startswith("skrull / torchtitan-documents: real tokens/s x") for line in lines), summary
    # each other mode against the traced Skrull run (train-report --against: the A/B variants' lines on a GPU)
    assert any(line.startswith("torchtitan-stream / skrull: median step x") for line in lines), summary
    # TRACE (the preset's): the skrull run's step 6 recorded by torchtitan's profiler, read by bench trace-report
    # (torch.profiler's ProfilerStep#5: torchtitan steps the profiler at a step's end), before the late stream;
    # the table reads steps up to 5 only (train-report --until)
    at = lines.index("trace-report job skrull (rc 0), steps 6-6 past the 5 timed:")
    assert at < lines.index(trained[-1]), summary
    assert lines[at + 1] == "# Trace report", summary
    assert lines[at + 3].startswith("- rank0_trace.json.gz: ProfilerStep#5: span ") and lines[at + 3].endswith(
        "no device events in this trace (a CPU trace): the host's ranges only"), summary
    assert "| skrull/micro_batch_0 | 1 |" in summary, summary
    with tarfile.open(tmp_path / "gpu_checks.tar.gz") as tar:
        table = json.load(tar.extractfile("./train/job/train_report.json"))
    assert table["skrull"]["steps"] == 5 == table["torchtitan-documents"]["steps"], table  # the traced step 6 not read
    names = archived(tmp_path)
    assert "./train/job/runs/skrull_0/profiling/traces/iteration_6/rank0_trace.json.gz" in names, sorted(names)
    for name in ("logs/pytest_trainer.xml", "logs/profile.txt", "train/job/train_report.json",
                 "logs/trace_report.md",
                 "train/job/runs/skrull_0/log.txt", "train/job/runs/torchtitan-stream_0/log.txt"):
        assert f"./{name}" in names, sorted(names)
