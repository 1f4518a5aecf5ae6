"""The cost model's per-step term: a profile's [step] fixed_us (what a step pays outside its
micro-batches, profile/step.py) read into CostModel.step_fixed_us, written back, and a profile
without it still loading with one line that says what it assumes and how to add it."""

import math
import os

import pytest
import tomli_w

from skrull_ext.profile.step import PER_STEP, StepResult
from skrull_ext.scheduler.profile_file import Profile, fixed_costs, from_dict, to_dict
from skrull_ext.train.step_phases import PHASES

OLD = os.path.join(os.path.dirname(__file__), "..", "integration_tests", "cpu-debug-gloo2-2026-11-22.toml")
JOBS = os.path.join(os.path.dirname(__file__), "..", "..", "skrull_ext", "jobs")


def test_the_step_term_is_what_every_step_pays_and_free_running_adds_its_own(make_toy):
    d = to_dict(make_toy(comm_us=10.0, b_us=1.0))
    d["micro_batch"] = {"fixed_us": 100.0, "free_running_fixed_us": 30.0, "free_running_step_us": 50.0}
    assert from_dict(d).step_fixed_us == 0.0  # lockstep, no [step]: nothing outside the micro-batches
    assert from_dict(d, free_running=True).step_fixed_us == 50.0
    d["step"] = {"fixed_us": 7.0, "clip_us": 4.0, "opt_us": 3.0, "repeats": 11}
    assert from_dict(d).step_fixed_us == 7.0
    assert from_dict(d, free_running=True).step_fixed_us == 57.0
    assert fixed_costs(d["micro_batch"], False, step=d["step"]) == {"micro_batch_fixed_us": 100.0,
                                                                     "step_fixed_us": 7.0}


def test_the_step_term_round_trips_through_a_file(make_toy, tmp_path):
    d = to_dict(make_toy(comm_us=10.0, b_us=1.0))
    result = StepResult({"checks": 9000.0, "clip": 9800.5, "opt": 3200.25}, repeats=11)
    d["step"] = result.section()
    assert d["step"] == {"fixed_us": 22000.75, "checks_us": 9000.0, "clip_us": 9800.5, "opt_us": 3200.25,
                         "repeats": 11}
    path = tmp_path / "p.toml"
    path.write_text(tomli_w.dumps(d))
    loaded = Profile.load(path)
    assert loaded.step_fixed_us == 22000.75 and loaded.step_term_note("p") is None
    cm = loaded.cost_model()
    assert cm.step_fixed_us == 22000.75
    assert to_dict(cm)["step"] == {"fixed_us": 22000.75}  # read back as lockstep: the same cost model
    assert from_dict(to_dict(cm)).step_fixed_us == cm.step_fixed_us


def test_the_step_term_prices_each_plan_once(make_toy):
    from skrull_ext import Scheduler, SchedulerConfig

    cfg = SchedulerConfig(dp=1, cp=2, bucket_size=10, policy="skrull", cpsat=False)
    d = to_dict(make_toy(comm_us=10.0, b_us=1.0))
    without = Scheduler(cfg, from_dict(d)).schedule([6, 6, 7])
    d["step"] = {"fixed_us": 1000.0}
    with_term = Scheduler(cfg, from_dict(d)).schedule([6, 6, 7])
    assert [mb.seqs for mb in with_term.micro_batches] == [mb.seqs for mb in without.micro_batches]
    assert with_term.makespan_us == without.makespan_us + 1000.0


def test_a_profile_without_it_loads_and_says_what_it_assumes():
    old = Profile.load(OLD)
    assert old.step_fixed_us is None and old.cost_model().step_fixed_us == 0.0
    note = old.step_term_note("'old.toml'")
    assert note.startswith("skrull: the cost model 'old.toml' has no [step] fixed_us")
    assert "predicted steps assume 0 there" in note
    assert note.endswith("re-profile: torchrun --standalone --nproc_per_node 2 -m skrull_ext.profile --config-file "
                         "skrull_ext/jobs/debug_cpu.toml --memory-limit 1GiB --out profiles/cpu-debug-gloo2.toml")


def test_a_hardware_preset_says_how_to_measure_the_machine():
    from skrull_ext.scheduler import cost_model

    note = cost_model.hardware("h100-assumed").step_term_note("'h100-assumed'")
    assert note is not None and "measure this machine: torchrun" in note
    # the job's file, flags and ranks when the trainer knows them (usage.job_args), not placeholders
    job = "--config-file skrull_ext/jobs/debug_cpu.toml --parallelism.context_parallel_degree 2"
    note = cost_model.hardware("h100-assumed").step_term_note("'h100-assumed'", job, 2)
    assert note.endswith("measure this machine: torchrun --standalone --nproc_per_node 2 -m skrull_ext.profile "
                         f"{job} --out <profile.toml> (docs/profile.md)")
    one = cost_model.hardware("h100-assumed").step_term_note("'h100-assumed'", job, 1)
    assert f"measure this machine: python -m skrull_ext.profile {job} --out" in one


def test_step_keys_are_checked(make_toy):
    d = to_dict(make_toy(comm_us=10.0, b_us=1.0))
    d["step"] = {"fixed_us": 1.0, "optimizer_us": 2.0}
    with pytest.raises(ValueError, match=r"unknown field step.optimizer_us"):
        from_dict(d)
    d["step"] = {"fixed_us": "5 ms"}
    with pytest.raises(ValueError, match=r"\[step\] fixed_us must be a number, got '5 ms'"):
        from_dict(d)


def test_the_profiled_phases_are_the_registrys_per_step_ones():
    assert PER_STEP == tuple(p.key for p in PHASES if p.per_step) == ("checks", "clip", "opt")
    assert math.isclose(StepResult(dict.fromkeys(PER_STEP, 1.5), 3).fixed_us, 4.5)


def test_the_step_term_steps_the_float32_parameters_of_a_bf16_profile_model():
    """The trainer's optimizer steps FSDP's sharded parameters in training.dtype (float32), cast to
    mixed_precision_param (bf16) only in the unsharded copies the units compute with. The profile's
    model is wrapped the same way (profile/model.py), so its step term steps the same float32
    parameters, gradients reduced into them in float32, and needs no float32 copies of its own."""
    import torch
    from torch.distributed.fsdp import FSDPModule

    from skrull_ext.profile.model import build_job_model
    from skrull_ext.profile.options import ProfileOptions
    from skrull_ext.profile.step import profile_step
    from skrull_ext.train.job.job_file import load_config

    torch.manual_seed(0)
    job = load_config(["--config-file", os.path.join(JOBS, "debug_cpu.toml"), "--training.mixed_precision_param",
                       "bfloat16", "--skrull.cost_model", "h100-assumed"], module="skrull_ext.profile")
    jm = build_job_model(job, torch.device("cpu"), 64)
    try:
        assert isinstance(jm.model, FSDPModule) and jm.dtype == torch.bfloat16  # computes in bf16
        before = {n: p.detach().to_local().clone() for n, p in jm.model.named_parameters()}
        assert {p.dtype for p in before.values()} == {torch.float32}
        result = profile_step(jm, ProfileOptions(warmup=0, micro_batch_repeats=2, micro_batch_doc=8), lambda _: None)
        assert result.repeats == 2 and set(result.phases_us) == set(PER_STEP)
        after = dict(jm.model.named_parameters())
        assert {p.dtype for p in after.values()} == {torch.float32}  # the masters stayed float32 ...
        assert all(not torch.equal(after[n].detach().to_local(), before[n]) for n in before)  # ... and moved
    finally:
        jm.close()


@pytest.mark.parametrize("device, queued", [("cuda", [100_000_000]), ("cpu", [])])
def test_the_phases_start_behind_queued_device_work_on_a_gpu(monkeypatch, device, queued):
    """On a GPU the profile queues device work ahead of the step's phases, as a step's last backward
    does in training, so that their CUDA events time the device's work and not the host launching
    it (GPU run 9: 12.2 ms profiled against 6 ms of phases a step in training); nothing on CPU."""
    import torch

    from skrull_ext.profile import step

    calls = []
    monkeypatch.setattr(torch.cuda, "_sleep", calls.append)
    step.backlog(torch.device(device))
    assert calls == queued and step.BACKLOG_CYCLES == 100_000_000
