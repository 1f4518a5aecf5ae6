"""The job's config picks its trainer: ``skrull.enable`` builds SkrullTrainer,
off it builds PackedTrainer, torchtitan's own batching and step; neither
branches on the flag (skrull_ext/train/trainer.py, packed_trainer.py,
job_trainer.py)."""

import os

import pytest
from torchtitan.trainer import Trainer

from skrull_ext.data.packed import PackedDataLoader
from skrull_ext.errors import JobFileError
from skrull_ext.train.job_file import JobConfigManager
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


def test_torchtitans_step_is_reused_where_it_fits():
    """PackedTrainer steps as torchtitan does; SkrullTrainer replaces the batch
    loop (batch_generator, train_step) and nothing else of torchtitan's step."""
    for name in ("batch_generator", "train_step", "forward_backward_step", "post_dataloading_process"):
        assert getattr(PackedTrainer, name) is getattr(Trainer, name), name
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
    from types import SimpleNamespace

    import torch

    from skrull_ext.scheduler.job import SchedulerJob
    from skrull_ext.scheduler.model_shape import job_shape
    from skrull_ext.train import trainer as trainer_module

    config = _config("--dump_folder", str(tmp_path), "--validation.enable", "--validation.samples", "8")
    monkeypatch.setattr(trainer_module, "install_dacp_attention", lambda *args, **kwargs: [])
    trainer = SkrullTrainer.__new__(SkrullTrainer)  # no process group, no model
    trainer.config, trainer.model_parts, trainer.device = config, [], torch.device("cpu")
    trainer.tokenizer = config.tokenizer.build(tokenizer_path=config.hf_assets_path)
    trainer.plan_log = trainer.validation = trainer.free_running = None
    trainer.parallel_dims = SimpleNamespace(cp_enabled=False, cp=1, tp=1, dp_shard=1, dp_replicate=1)
    trainer.dataloader = config.dataloader.build(dp_world_size=1, dp_rank=0, tokenizer=trainer.tokenizer)
    trainer.model_shape = job_shape(config)
    trainer._init_skrull()

    job = trainer.skrull_job
    assert isinstance(job, SchedulerJob) and job.policy.name == config.skrull.policy
    assert trainer.scheduler.job is job
    assert trainer.dataloader.scheduler.job is job and trainer.dataloader.builder.scheduler.job is job
    assert trainer.validation.build.scheduler.job is job
    assert trainer.dataloader.next_step().plan.timeline == job.timeline
    trainer.dataloader.close()
