"""The simulator and the latency benchmark run from the measured CPU profile
(profiles/cpu-debug-gloo2.toml, written by python -m skrull_ext.profile) and
from the built-in assumed H100, and their console output says which one
(issue 6). Tiny settings: a couple of batches each."""

import json
import os

import pytest

from skrull_ext.bench import latency, simulate

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MEASURED = os.path.join(REPO, "profiles", "cpu-debug-gloo2.toml")


@pytest.mark.parametrize("given, label, bucket", [
    (["--profile", MEASURED], "measured: cpu-debug-gloo2.toml", 3696),  # the profile's [memory] bucket_size
    ([], "assumed: h100_assumed.toml, planned at 1.5x the exchange", 26 * 1024),  # the paper's default BucketSize
    (["--plan-margin", "1"], "assumed: h100_assumed.toml", 26 * 1024),
])
def test_simulate_names_its_profile(tmp_path, capsys, given, label, bucket):
    out = tmp_path / "sim"
    rc = simulate.main(["--datasets", "wikipedia", "--models", "llama3-debug", "--dp", "1", "--cp", "2",
                        "--batch-size", "8", "--iterations", "2", "--policies", "skrull", *given,
                        "--out", str(out), "--no-plots", "--quiet"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert f"hardware profile: {label}" in printed, printed
    data = json.loads((out / "results.json").read_text())
    assert data["meta"]["profile"] == label
    assert {c["shape"] for c in data["cells"]} == {f"1x2x8, C={bucket}"}


def test_simulate_refuses_a_measured_profile_for_another_model(tmp_path, capsys):
    with pytest.raises(SystemExit):  # usage error: the file's [model] is the debug model's shape
        simulate.main(["--datasets", "wikipedia", "--models", "qwen2.5-0.5b", "--iterations", "1",
                       "--profile", MEASURED, "--out", str(tmp_path), "--no-plots", "--quiet"])
    assert "is not the shape of 'qwen2.5-0.5b'" in capsys.readouterr().err


@pytest.mark.parametrize("given, label", [
    (["--profile", MEASURED], f"cost model: measured profile {MEASURED}"),
    ([], "cost model: preset qwen2.5-0.5b on h100-assumed (assumed, not measured)"),
])
def test_latency_names_its_cost_model(tmp_path, capsys, given, label):
    out = tmp_path / "latency.json"
    rc = latency.main(["--settings", "paper", "--policies", "skrull", "--reps", "2", "--python-reps", "1",
                       "--facade-reps", "1", "--cpsat-batches", "0", "--lookahead-settings", *given,
                       "--json", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert label in printed, printed
    assert json.loads(out.read_text())["args"]["profile"] == (MEASURED if given else None)


def _simulate_cell(tmp_path, name: str, *extra: str) -> dict:
    out = tmp_path / name
    rc = simulate.main(["--datasets", "wikipedia", "--models", "llama3-debug", "--dp", "1", "--cp", "2",
                        "--batch-size", "8", "--iterations", "3", "--policies", "skrull", *extra,
                        "--out", str(out), "--no-plots", "--quiet"])
    assert rc == 0
    return next(c for c in json.loads((out / "results.json").read_text())["cells"] if c["policy"] == "skrull")


def test_simulate_reads_a_lora_profile_and_plans_with_its_larger_bucket(tmp_path, capsys):
    """The LoRA profile (frozen base: no gradients or optimizer state for it) is read like
    any other; its BucketSize is the file's and larger than full fine-tuning's."""
    from skrull_ext.scheduler.profile_file import Profile

    buckets, cells = {}, {}
    for name in ("cpu-debug-1proc", "cpu-debug-lora-1proc"):
        path = os.path.join(REPO, "profiles", f"{name}.toml")
        buckets[name] = Profile.load(path).bucket_size
        cells[name] = _simulate_cell(tmp_path, name, "--profile", path)
        assert f"hardware profile: measured: {name}.toml" in capsys.readouterr().out
        assert cells[name]["shape"] == f"1x2x8, C={buckets[name]}"
        assert cells[name]["peak_tokens"] <= buckets[name]
        assert 0 <= cells[name]["local_share"] <= 1
    assert buckets["cpu-debug-lora-1proc"] > buckets["cpu-debug-1proc"]
