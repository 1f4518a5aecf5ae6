"""tools/gpu_checks.sh --dry-run: the GPU machine's command, run here on CPU.

GPU time is rare (a lent machine, about 15 minutes, no network), so the
command must work the first time it meets a GPU. Its dry run goes through
the same stages at toy sizes: the machine record, the core, the CUDA test
cases collected (they skip here), the profiled overlap runs on CPU, the
offline profiler, the trainer in its three modes (1 process: skrull, the whole-document
baseline, the stream) and their table with issue 48's document-aware columns.
A stage that breaks shows here as a summary line that is not a pass.
"""

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_gpu_checks_dry_run_passes_every_stage(tmp_path):
    out = tmp_path / "gpu"
    env = dict(os.environ, OUT=str(out), PYTHON=sys.executable)
    proc = subprocess.run(["bash", "tools/gpu_checks.sh", "--dry-run"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    summary = (out / "summary.txt").read_text()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = summary.splitlines()
    assert lines[0].startswith("torch ") and "devices 0" in lines[0]  # the machine record
    assert any(line.startswith("core: installed ") for line in lines), summary
    pytest_line = next(line for line in lines if line.startswith("pytest ("))
    assert pytest_line.startswith("pytest (rc 0)") and "skipped" in pytest_line, summary
    cases = [line.split() for line in lines if line.startswith("  ")]
    assert cases and all(state == "skipped" for state, *_ in cases), summary  # every CUDA case collected, none ran
    assert "overlap cp 2 kernel auto (rc 0)" in summary, summary  # auto is the dense kernel on CPU
    assert any(line.startswith("profile (rc 0): a_us_per_flop = ") for line in lines), summary
    modes = ("skrull", "torchtitan-documents", "torchtitan-stream")
    for mode in modes:
        assert any(line.startswith(f"train job {mode} (rc 0): step:  5 ") for line in lines), summary
        assert f"recompiles job {mode}: 0; guards: " in lines, summary  # eager: nothing compiles
    header = next(line for line in lines if line.startswith("| mode |"))
    columns = [c.strip() for c in header.split("|")[1:-1]]
    rows = {r[0]: dict(zip(columns, r)) for r in
            ([c.strip() for c in line.split("|")[1:-1]] for line in lines
             if line.startswith("| ") and line != header)}
    assert sorted(rows) == sorted(modes), summary
    for mode, r in rows.items():
        assert r["losses finite"] == "yes" and r["real tokens/s"] != "-", summary
        assert float(r["document-aware TFLOP/s a device"]) > 0, summary  # issue 48's columns, measured
        assert r["recompiles after warm-up"] == "0", summary
    assert rows["torchtitan-documents"]["cut documents"] == "0" == rows["skrull"]["cut documents"], summary
    phases = "step phases ms, median (outside the micro-batches)"  # issue 57: the whole step by phase
    assert rows["skrull"][phases].startswith("data ") and " mb " in rows["skrull"][phases], summary
    assert rows["torchtitan-stream"][phases] == "-", summary  # torchtitan's own batching is not timed by phase
    assert int(rows["torchtitan-stream"]["cut documents"].replace(",", "")) > 0, summary  # the stream cuts
    assert any(line.startswith("skrull / torchtitan-documents: real tokens/s x") for line in lines), summary
    with tarfile.open(out / "gpu_checks.tar.gz") as tar:
        names = set(tar.getnames())
    for name in ("logs/env.txt", "logs/pytest_cuda.xml", "overlap_cp2_auto/overlap.json",
                 "overlap_cp2_auto/rank1.trace.json.gz", "logs/profile.txt", "train/job/train_report.json",
                 "train/job/runs/skrull_0/log.txt", "train/job/runs/torchtitan-documents_0/log.txt"):
        assert f"./{name}" in names, sorted(names)
