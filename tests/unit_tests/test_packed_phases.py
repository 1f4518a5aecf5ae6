"""PackedTrainer's step timed by phase (train/packed_trainer.py): torchtitan's train_step is not
restated, so each phase starts at a call the trainer can see. Here a stand-in trainer runs a
stand-in of torchtitan's step that calls those points in torchtitan 0.3.0's order on a clock the
test drives (tests/unit_tests/test_step_phases.py's TickClock): exact phases, no timing. The
real step through them: tests/integration_tests/test_packed_phases_run.py."""

from types import SimpleNamespace

import pytest
from torchtitan.trainer import Trainer

from skrull_ext.train.packed_trainer import PackedTrainer
from skrull_ext.train.step_phases import StepPhases
from tests.unit_tests.test_step_phases import TickClock

MS = {"data": 1.0, "rest": 2.0, "mb": 100.0, "clip": 4.0, "wait": 0.5, "checks": 3.0, "opt": 6.0, "lr": 0.25,
      "log": 8.0}
"""What each piece of the stand-in step takes on the test's clock."""


def _stand_in(monkeypatch, clock: TickClock, accumulation: int, log_freq: int,
              params: list = ()) -> tuple[PackedTrainer, list]:
    """A PackedTrainer with only what its phase marks touch, and torchtitan's train_step,
    batch_generator and forward_backward_step replaced by stand-ins that move the clock."""
    written = []  # (metrics, step) written to TensorBoard

    def tick(key):
        clock.now += MS[key]

    def titan_batches(self, data_iterable):
        for batch in data_iterable:
            tick("data")
            yield batch

    def titan_train_step(self, data_iterator):  # torchtitan 0.3.0's order (trainer.py train_step)
        should_log = self.metrics_processor.should_log(self.step)
        for _ in range(self.gradient_accumulation_steps):
            next(data_iterator)
        tick("rest")  # the label count's all-reduce, the copies to the device
        for _ in range(self.gradient_accumulation_steps):
            self.forward_backward_step(input_dict={}, labels=None, global_valid_tokens=None)
        tick("clip")  # dist_utils.clip_grad_norm_
        self.checkpointer.maybe_wait_for_staging()
        self._stop_on_non_finite_grads(None, (), {})  # the optimizers' pre-step hook
        tick("opt")
        self.lr_schedulers.step()
        if should_log:
            tick("log")
            self.metrics_processor.log(self.step, 1.0, 1.0, 1.0)

    monkeypatch.setattr(Trainer, "batch_generator", titan_batches)
    monkeypatch.setattr(Trainer, "train_step", titan_train_step)
    monkeypatch.setattr(Trainer, "forward_backward_step", lambda self, **kwargs: tick("mb"))
    def parameters():  # read by the finiteness check: its time
        tick("checks")
        return params

    trainer = PackedTrainer.__new__(PackedTrainer)
    trainer.step, trainer.gradient_accumulation_steps = 0, accumulation
    trainer.model_parts = [SimpleNamespace(parameters=parameters)]
    trainer.step_phases = StepPhases(clock)
    # not torchtitan's packed loader (no sample counts); what a non-finite step names
    trainer.dataloader = SimpleNamespace(config=SimpleNamespace(global_batch_size=2), source=None, last_samples=[3, 4])
    trainer.metrics_processor = SimpleNamespace(
        should_log=lambda step: step % log_freq == 0, log=lambda *args, **kwargs: None,
        logger=SimpleNamespace(log=lambda metrics, step: written.append((metrics, step))))
    trainer.checkpointer = SimpleNamespace(maybe_wait_for_staging=lambda: tick("wait"))
    trainer.lr_schedulers = SimpleNamespace(step=lambda: tick("lr"))
    trainer._step_batches, trainer._step_logged = 0, False
    trainer._mark_phases()
    trainer._log_beside_torchtitans_metrics()
    return trainer, written


def _train(trainer: PackedTrainer, steps: int) -> None:
    batches = trainer.batch_generator(iter(range(100)))
    for _ in range(steps):
        trainer.step += 1
        trainer.train_step(batches)


def test_each_phase_is_torchtitans_piece_of_the_step(monkeypatch):
    """Two micro-batches a step: data twice, mb twice, clip to the staging wait, the check inside
    opt, log after the learning-rate step; the label count between data and mb is the rest."""
    clock = TickClock()
    trainer, written = _stand_in(monkeypatch, clock, accumulation=2, log_freq=1)
    _train(trainer, 1)
    t = trainer.step_phases.take()
    assert t.step == 1 and t.predicted_us == 0.0
    assert t.phases == {"data": 2.0, "checks": 3.0, "mb": 200.0, "clip": 4.0, "opt": 0.5 + 6.0 + 0.25, "log": 8.0}
    assert t.rest_ms == 2.0 and t.total_ms == 2 + 2 + 200 + 4 + 0.5 + 3 + 6 + 0.25 + 8
    assert t.step_ms == t.total_ms - 2.0 - 8.0 and t.outside_ms == 3.0 + 4.0 + 6.75
    assert trainer.step_phases._in is None  # nothing left open after the step
    assert written == []  # read at the next logged step


def test_a_logged_step_writes_the_previous_logged_steps_phases(monkeypatch):
    """log_freq 2: steps 2 and 4 are kept; step 4's log writes step 2's scalars at step 2 and
    says them on its line; steps 1 and 3 are never read. Nothing predicted: no ratio."""
    from skrull_ext.train import packed_trainer

    lines = []
    monkeypatch.setattr(packed_trainer.logger, "info", lines.append)
    clock = TickClock()
    trainer, written = _stand_in(monkeypatch, clock, accumulation=1, log_freq=2)
    _train(trainer, 4)
    assert [step for _, step in written] == [2]
    metrics = written[0][0]
    assert metrics["skrull/phase_mb_ms"] == 100.0 and metrics["skrull/phase_log_ms"] == 8.0
    assert metrics["skrull/step_outside_ms"] == 3.0 + 4.0 + 6.75
    assert metrics["skrull/measured_us"] == (2 + 100 + 4 + 0.5 + 3 + 6 + 0.25) * 1e3  # no data wait, no log
    assert "skrull/measured_over_predicted" not in metrics
    assert lines == ["step 4: step 2 phases ms: data 1 checks 3 mb 100 clip 4 opt 7 log 8 rest 2: "
                     "115.8 ms as run, 12% outside the micro-batches"]
    assert trainer.step_phases.dropped == 0 and trainer.step_phases.take().step == 4


def test_a_failed_step_leaves_no_phase_open(monkeypatch):
    """A non-finite gradient stops the step inside its checks (NonFiniteLossError): the phase is
    closed and the step not kept; the step before it still reads whole."""
    import torch

    from skrull_ext.train.job_trainer import NonFiniteLossError

    p = torch.nn.Parameter(torch.zeros(2))
    p.grad = torch.ones(2)
    clock = TickClock()
    trainer, _ = _stand_in(monkeypatch, clock, accumulation=1, log_freq=1, params=[p])
    _train(trainer, 1)
    p.grad = torch.tensor([1.0, float("nan")])
    with pytest.raises(NonFiniteLossError, match="step 2: the gradients are not finite"):
        _train(trainer, 1)
    assert trainer.step_phases._in is None
    t = trainer.step_phases.take()
    assert t.step == 1 and t.phases["checks"] == 3.0
