"""The job's config picks its trainer: ``skrull.enable`` builds SkrullTrainer,
off it builds PackedTrainer, torchtitan's own batching and step; neither
branches on the flag (skrull_ext/train/trainer.py, packed_trainer.py,
job_trainer.py)."""

import os

import pytest
from torchtitan.trainer import Trainer

from skrull_ext.data.steps.packed import PackedDataLoader
from skrull_ext.errors import JobFileError
from skrull_ext.train.job.job_file import JobConfigManager
from skrull_ext.train.job_trainer import JobTrainer
from skrull_ext.train.packed_trainer import PackedTrainer
from skrull_ext.train.trainer import JobConfig, SkrullTrainer

DEBUG = os.path.join(os.path.dirname(__file__), "..", "..", "skrull_ext", "jobs", "debug_cpu.toml")


def _config(*flags: str) -> JobConfig:
    return JobConfigManager().parse_args(["--config-file", DEBUG, *flags])


def test_skrull_enable_names_the_trainer():
    on, off = _config(), _config("--skrull.no-enable")
    assert on.trainer_class is SkrullTrainer
    # the same config class either way (a Skrull checkpoint continues under --skrull.no-enable)
    assert isinstance(off, JobConfig) and off.trainer_class is PackedTrainer
    assert isinstance(off.dataloader, PackedDataLoader.Config)


def test_the_trainers_register_themselves_with_the_config_below_them(monkeypatch):
    """JobConfig (train/job/) names no trainer: trainer.py registers both, and a config whose
    trainer nobody registered says which module does, instead of building torchtitan's own."""
    from skrull_ext.train.job import job_config

    assert job_config.TRAINERS == {True: SkrullTrainer, False: PackedTrainer}
    monkeypatch.setattr(job_config, "TRAINERS", {False: PackedTrainer})
    with pytest.raises(RuntimeError, match=r"no trainer is registered for skrull.enable = True: import "
                                           r"train/trainer.py"):
        _config().build()


def test_torchtitans_step_is_reused_where_it_fits():
    """PackedTrainer steps as torchtitan does (its batch_generator, train_step and
    forward_backward_step only wrapped in the step's phases: test_packed_phases.py);
    SkrullTrainer replaces the batch loop (batch_generator, train_step) and nothing
    else of torchtitan's step."""
    import inspect

    assert PackedTrainer.post_dataloading_process is Trainer.post_dataloading_process
    for name in ("batch_generator", "train_step", "forward_backward_step"):
        assert f"super().{name}(" in inspect.getsource(getattr(PackedTrainer, name)), name
    for name in ("forward_backward_step", "post_dataloading_process", "state_dict", "load_state_dict"):
        assert getattr(SkrullTrainer, name) is getattr(Trainer, name), name
    assert SkrullTrainer.train is JobTrainer.train is PackedTrainer.train  # the heartbeat and HF outputs: shared
    assert {"batch_generator", "train_step"} <= set(vars(SkrullTrainer))


def test_a_trainer_built_for_the_other_batching_is_refused():
    """Before anything is built: a Skrull step on packed rows (or the reverse)
    would fail deep in the first step."""
    with pytest.raises(TypeError, match=r"SkrullTrainer cannot run a job with skrull.enable = False: "
                                        r"that job's trainer is PackedTrainer \(config.build\(\) builds it\)"):
        SkrullTrainer(_config("--skrull.no-enable"))
    with pytest.raises(TypeError, match=r"PackedTrainer cannot run a job with skrull.enable = True: "
                                        r"that job's trainer is SkrullTrainer"):
        PackedTrainer(_config())


@pytest.mark.parametrize("flags, built, not_built", [
    ((), "SkrullTrainer.__init__", "PackedTrainer.__init__"),
    (("--skrull.no-enable",), "PackedTrainer.__init__", "SkrullTrainer.__init__"),
])
def test_build_constructs_the_trainer_the_config_names(tmp_path, flags, built, not_built):
    """config.build() (both launchers call it) reaches the named trainer's
    constructor: seen here by the frames of a check that stops it before any
    model (a checkpoint step that does not exist)."""
    config = _config("--dump_folder", str(tmp_path), "--checkpoint.enable", "--checkpoint.load_step", "7", *flags)
    with pytest.raises(JobFileError, match=r"checkpoint.load_step = 7: there is no .*step-7") as e:
        config.build()
    frames = [entry.frame.code.raw.co_qualname for entry in e.traceback]
    assert built in frames and not_built not in frames and "JobTrainer.__init__" in frames


def test_trainer_step_builder_and_scheduler_share_one_resolved_job(monkeypatch, tmp_path):
    """Issue 37's bar: the job's [skrull] section is resolved once (SkrullConfig.resolve) into
    one SchedulerJob, and the trainer, the Scheduler and the dataloader's step builder (training
    and validation) hold that same object; the plans are made on its timeline. The setup runs
    on a stand-in trainer (one CPU rank, no model: the DACP attention's install is skipped)."""
    from skrull_ext.scheduler.job import SchedulerJob

    config = _config("--dump_folder", str(tmp_path), "--validation.enable", "--validation.samples", "8")
    trainer = _stand_in(monkeypatch, config)
    trainer._init_skrull()

    job = trainer.skrull_job
    assert isinstance(job, SchedulerJob) and job.policy.name == config.skrull.policy
    assert trainer.scheduler.job is job
    assert trainer.dataloader.scheduler.job is job and trainer.dataloader.builder.scheduler.job is job
    assert trainer.validation.build.scheduler.job is job
    assert trainer.dataloader.next_step().plan.timeline == job.timeline
    trainer.dataloader.close()


def _stand_in(monkeypatch, config) -> SkrullTrainer:
    """A SkrullTrainer whose ``_init_skrull`` can run: one CPU rank, no process group, no model
    (the DACP attention's install is skipped)."""
    from types import SimpleNamespace

    import torch

    from skrull_ext.scheduler.model_shape import job_shape
    from skrull_ext.train import trainer as trainer_module

    monkeypatch.setattr(trainer_module, "install_dacp_attention", lambda *args, **kwargs: [])
    trainer = SkrullTrainer.__new__(SkrullTrainer)
    trainer.config, trainer.model_parts, trainer.device = config, [], torch.device("cpu")
    trainer.tokenizer = config.tokenizer.build(tokenizer_path=config.hf_assets_path)
    trainer.plan_log = trainer.validation = trainer.free_running = None
    trainer.parallel_dims = SimpleNamespace(cp_enabled=False, cp=1, tp=1, dp_shard=1, dp_replicate=1)
    trainer.dataloader = config.dataloader.build(dp_world_size=1, dp_rank=0, tokenizer=trainer.tokenizer)
    trainer.model_shape = job_shape(config)
    return trainer


@pytest.mark.parametrize("width", ["auto", "3", "1"])
def test_one_scheduler_per_run_attached_once_with_the_settled_width(monkeypatch, tmp_path, width):
    """Issue 56's bar: start-up settles the job once (train/settle.py), the look-ahead width
    included (under "auto" priced from the lengths with no loader attached), then builds one
    Scheduler and attaches the dataloader once; the job, not the section, holds the width."""
    from skrull_ext.data.steps.loader import SkrullDataLoader
    from skrull_ext.scheduler import scheduler as scheduler_module
    from skrull_ext.train import trainer as trainer_module

    built, attached = [], []
    real_init, real_attach = scheduler_module.Scheduler.__init__, SkrullDataLoader.attach
    monkeypatch.setattr(scheduler_module.Scheduler, "__init__",
                        lambda self, *a, **k: (built.append(self), real_init(self, *a, **k))[1])
    monkeypatch.setattr(SkrullDataLoader, "attach",
                        lambda self, *a, **k: (attached.append(a[0]), real_attach(self, *a, **k))[1])
    from skrull_ext.data.steps import lookahead_choice

    monkeypatch.setattr(lookahead_choice, "pick", lambda gains: 4)  # auto's widest re-plan: a width > 1
    config = _config("--dump_folder", str(tmp_path), "--skrull.lookahead", width, "--training.steps", "6")
    trainer = _stand_in(monkeypatch, config)
    lines = []
    monkeypatch.setattr(trainer_module.logger, "info", lines.append)
    trainer._init_skrull()
    assert built == attached == [trainer.scheduler] and trainer.scheduler.job is trainer.skrull_job
    w = trainer.skrull_job.lookahead
    assert isinstance(w, int) and trainer.dataloader.windows.width == w
    auto = [line for line in lines if line.startswith("skrull.lookahead auto: ")]
    if width == "auto":
        assert len(auto) == 1 and auto[0].startswith("skrull.lookahead auto: 4 (") and w == 4
    else:
        assert auto == [] and w == int(width)
    assert any(f"look-ahead {w}" in line for line in lines)
    trainer.dataloader.close()


def test_an_unsettled_lookahead_is_refused_not_defaulted():
    """SchedulerJob.of takes "auto" only with the width the data was priced at."""
    from skrull_ext._core import Timeline
    from skrull_ext.scheduler import cost_model
    from skrull_ext.scheduler.job import SchedulerJob
    from skrull_ext.train.job.skrull_config import SkrullConfig

    section = SkrullConfig(lookahead="auto", bucket_size=256, cost_model="h100-assumed")
    with pytest.raises(ValueError, match=r'lookahead = "auto" is not settled'):
        SchedulerJob.of(section, dp=1, cp=1, timeline=Timeline.LOCKSTEP, cost_model=cost_model.preset(),
                        bucket_size=256)
    job = SchedulerJob.of(section, dp=1, cp=1, timeline=Timeline.LOCKSTEP, cost_model=cost_model.preset(),
                          bucket_size=256, lookahead=4)
    assert job.lookahead == 4
