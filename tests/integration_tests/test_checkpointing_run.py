"""The debug job with ``[skrull] activation_checkpoint = "auto"`` as a user runs it, one
process: the mode chosen from a profile's per-mode fits is the one torchtitan applies to the
model, said in one start-up line, and a bucket_size no mode holds is refused in one line."""

from pathlib import Path

import pytest
import tomli_w
import tomllib

from skrull_ext.scheduler import checkpointing
from skrull_ext.scheduler.checkpointing import ModeCost
from tests.integration_tests.launch import REPO, torchrun
from tests.integration_tests.test_cli_refusals import DEBUG, one_line_error, train

MODES = {  # none holds 200 tokens: the debug data's first steps have longer sequences
    "none": ModeCost("none", 1.0e-5, 100.0, 1.0, 100_000.0, 0.0, 0.0, 200),
    "selective": ModeCost("selective", 1.3e-5, 100.0, 1.0, 50_000.0, 0.0, 0.0, 4000),
    "full": ModeCost("full", 1.6e-5, 100.0, 1.0, 25_000.0, 0.0, 0.0, 8000),
}


def _profile(tmp_path: Path) -> str:
    data = tomllib.loads((Path(REPO) / "profiles" / "cpu-debug-gloo2.toml").read_text())
    data[checkpointing.SECTION] = checkpointing.section(MODES, "none")
    path = tmp_path / "modes.toml"
    path.write_text(tomli_w.dumps(data))
    return str(path)


@pytest.mark.slow
def test_auto_runs_the_mode_it_chose(tmp_path):
    """One forked rank (launch.torchrun, forked.py): the trainer's lines are the claim, not the
    CLI's (the refusal below is the command as typed)."""
    proc = torchrun(1, "skrull_ext.train", ["--config-file", DEBUG, "--skrull.cost_model", _profile(tmp_path),
                                            "--skrull.bucket_size", "profile", "--training.steps", "2",
                                            "--dump_folder", str(tmp_path / "out")], cwd=str(tmp_path))
    out = proc.stdout + proc.stderr
    line = next(x for x in out.splitlines() if "Skrull activation checkpointing:" in x)
    assert "Skrull activation checkpointing: selective (skrull.activation_checkpoint = 'auto'" in line
    assert "none out: bucket_size 200 cannot hold the longest sequence" in line
    assert "the job's kind 'none' is its fallback only" in line
    assert "Applied SelectiveAC activation checkpointing to the model" in out
    assert "bucket_size 4000 (the profile's)" in out  # the profile read under the chosen mode
    assert "step:  2  loss:" in out


@pytest.mark.slow
def test_a_bucket_size_no_mode_holds_is_one_line(tmp_path):
    proc = train("--config-file", DEBUG, "--skrull.cost_model", _profile(tmp_path), "--skrull.bucket_size", "9000",
                 "--training.steps", "1", "--dump_folder", str(tmp_path / "out"), cwd=tmp_path)
    error = one_line_error(proc)
    assert error.startswith("error: skrull.activation_checkpoint = 'auto': no mode the profile ")
    assert error.endswith("fits skrull.bucket_size 9000: none out: bucket_size 9000 over its 200; selective out: "
                          "bucket_size 9000 over its 4000; full out: bucket_size 9000 over its 8000; lower "
                          "skrull.bucket_size or set it to 'profile'")
