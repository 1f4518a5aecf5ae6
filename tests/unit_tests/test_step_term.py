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


def test_the_step_term_steps_float32_masters_of_a_bf16_profile_model():
    """The trainer's optimizer steps parameters in training.dtype (float32; FSDP casts them for
    compute), so a profile model built in bf16 is stepped through float32 copies under its own
    names, which torchtitan's optimizer builder matches, and its gradients copied in."""
    import types

    import torch
    from skrull_ext.profile.step import MasterParameters, stepped_parameters
    from skrull_ext.train.job.job_file import load_config

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3)).to(torch.bfloat16)
    jm = types.SimpleNamespace(model=model, config=types.SimpleNamespace(training=types.SimpleNamespace(dtype="float32")))
    stepped = stepped_parameters(jm)
    assert isinstance(stepped, MasterParameters)
    names = [n for n, _ in model.named_parameters()]
    assert [n for n, _ in stepped.named_parameters()] == names == ["0.weight", "0.bias", "1.weight", "1.bias"]
    assert all(p.dtype == torch.float32 for p in stepped.parameters()) and len(list(stepped.parameters())) == 4
    assert all(torch.equal(m, p.float()) for m, p in zip(stepped.parameters(), model.parameters()))
    model(torch.randn(2, 4, dtype=torch.bfloat16)).float().sum().backward()
    stepped.take_grads()
    assert all(m.grad.dtype == torch.float32 and torch.equal(m.grad, p.grad.float())
               for m, p in zip(stepped.parameters(), model.parameters()))
    job = load_config(["--config-file", os.path.join(JOBS, "debug_cpu.toml")], check=False)
    opt = job.optimizer.build(model_parts=[stepped])  # its param groups matched by name, as the profile builds it
    opt.step()  # the float32 copies move, the bf16 model does not
    assert not torch.equal(next(stepped.parameters()), model[0].weight.float())
    # a model already in training.dtype is stepped itself
    assert stepped_parameters(types.SimpleNamespace(model=model.float(), config=jm.config)) is model
