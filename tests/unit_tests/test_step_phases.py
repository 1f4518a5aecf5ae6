"""The step's phases (train/step_phases.py): accounting on a clock the test drives, no timing."""

import math

import pytest

from skrull_ext.train.step_phases import PHASES, StepPhases, StepTimes, WallClock, phases_summary


class TickClock:
    """A clock the test moves: a mark is the time now; a mark is ready once ``done`` reaches it."""

    def __init__(self):
        self.now = 0.0
        self.done = math.inf
        self.waited = 0

    def mark(self):
        return self.now

    def ready(self, mark):
        return mark <= self.done

    def ms(self, start, end):
        return end - start

    def wait(self):
        self.waited += 1
        self.done = math.inf


def run_step(phases: StepPhases, clock: TickClock, step: int, work: list[tuple[str | None, float]],
             predicted_us: float = 100_000.0) -> None:
    """One step: each (phase, ms) in order; a None phase is untimed work."""
    phases.begin(step)
    for key, ms in work:
        if key is None:
            clock.now += ms
            continue
        with phases.phase(key):
            clock.now += ms
    phases.end(predicted_us)


def test_phases_and_rest_sum_to_the_step_in_the_registry_order():
    clock = TickClock()
    phases = StepPhases(clock)
    # checks runs twice (plan digests before, finiteness after); work outside any phase is the rest
    run_step(phases, clock, 7, [("data", 1), (None, 2), ("checks", 3), ("mb", 100), ("clip", 4), ("checks", 5),
                                ("opt", 6), (None, 1), ("log", 8)])
    t = phases.take()
    assert t.step == 7 and t.predicted_us == 100_000.0
    assert list(t.phases) == ["data", "checks", "mb", "clip", "opt", "log"]
    assert t.phases == {"data": 1, "checks": 8, "mb": 100, "clip": 4, "opt": 6, "log": 8}
    assert t.total_ms == 130 and t.rest_ms == 3
    assert sum(t.phases.values()) + t.rest_ms == t.total_ms
    assert t.step_ms == 130 - 1 - 8  # the data wait and the logging are not the step as run
    assert t.outside_ms == 8 + 4 + 6
    assert t.ratio == pytest.approx(121e3 / 100_000.0)
    m = t.metrics()
    assert "skrull/predicted_us" not in m  # the step's own, written with its other skrull/* scalars
    assert m["skrull/phase_mb_ms"] == 100 and m["skrull/phase_rest_ms"] == 3 and m["skrull/measured_us"] == 121e3
    assert "skrull/phase_chunk_ms" not in m
    assert t.clause() == "phases ms: data 1 checks 8 mb 100 clip 4 opt 6 log 8 rest 3"
    assert phases.take() is None  # read once


def test_a_phase_whose_work_is_absent_is_absent():
    clock = TickClock()
    phases = StepPhases(clock)
    run_step(phases, clock, 1, [("data", 0), ("mb", 50), ("chunk", 30), ("clip", 1), ("opt", 2)])
    run_step(phases, clock, 2, [("data", 0), ("mb", 50), ("clip", 1), ("opt", 2)])
    t = phases.take()
    assert t.step == 2 and "chunk" not in t.phases and "log" not in t.phases  # no chunked sample, not logged
    assert phases.dropped == 1  # step 1 was never read


def test_a_step_not_kept_is_not_read():
    clock = TickClock()
    phases = StepPhases(clock)
    phases.begin(1)
    with phases.phase("mb"):
        clock.now += 1
    phases.end(10.0, keep=False)  # a step not logged
    assert phases.take() is None and phases.dropped == 0


def test_marks_not_ready_are_not_read_until_they_are_or_the_device_is_waited_for():
    clock = TickClock()
    phases = StepPhases(clock)
    run_step(phases, clock, 3, [("mb", 10)])
    clock.done = 5.0  # the device has not reached the step's end
    assert phases.take() is None
    t = phases.take(wait=True)
    assert clock.waited == 1 and t.phases == {"mb": 10}


def test_phases_refuse_nesting_and_unknown_names():
    phases = StepPhases(TickClock())
    phases.begin(1)
    with pytest.raises(KeyError, match="unknown step phase 'optimizer'"):
        with phases.phase("optimizer"):
            pass
    with pytest.raises(RuntimeError, match="'clip' entered inside 'mb'"):
        with phases.phase("mb"):
            with phases.phase("clip"):
                pass


def test_a_phase_outside_a_step_is_not_recorded():
    phases = StepPhases(WallClock())
    with phases.phase("log"):  # validation at start-up, before any step
        pass
    assert phases.take() is None


def test_registry_keys_are_unique_and_the_per_step_term_is_inside_the_step():
    keys = [p.key for p in PHASES]
    assert len(set(keys)) == len(keys)
    assert all(p.in_step for p in PHASES if p.per_step)


def test_summary_is_the_median_after_the_first_step():
    times = [StepTimes(1, {"data": 50.0, "mb": 900.0, "opt": 100.0}, 1100.0, 0.0)] + [
        StepTimes(k, {"data": 1.0, "mb": 80.0 + k, "opt": 20.0}, 105.0 + k, 0.0) for k in range(2, 5)]
    line = phases_summary(times)
    assert line.startswith("step phases, median ms over 3 steps after the first: data 1.0 mb 83.0 opt 20.0;")
    assert "step as run 107.0 ms, 19% of it outside the micro-batches (checks, clip, opt); rest 4.0" in line
    assert phases_summary([]) is None


def test_on_the_host_clock_no_second_host_clock_is_said():
    """On CPU the phases are timed on the host's clock (WallClock): the closing line says the rest
    once, with no "on the host's clock" comparison (the same number again, read as a GPU's), and
    no ``skrull/phase_rest_host_ms`` is written."""
    phases = StepPhases(WallClock())
    phases.begin(1)
    with phases.phase("mb"):
        pass
    phases.end(0.0)
    t = phases.take()
    assert math.isnan(t.rest_host_ms) and "skrull/phase_rest_host_ms" not in t.metrics()
    line = phases_summary([t])
    assert line.endswith(f"(checks, clip, opt); rest {t.rest_ms:.1f}") and "host's clock" not in line


def test_the_host_clock_on_cpu():
    import torch

    from skrull_ext.train.step_phases import clock_for

    clock = clock_for(torch.device("cpu"))
    assert isinstance(clock, WallClock)
    a = clock.mark()
    assert clock.ready(a) and clock.ms(a, clock.mark()) >= 0


def test_enter_and_leave_time_a_phase_as_its_with_block_does():
    """A step whose code is not ours (PackedTrainer: torchtitan's train_step) marks where each phase
    starts and ends; the same accounting, the same refusals."""
    clock = TickClock()
    phases = StepPhases(clock)
    phases.begin(1)
    phases.enter("mb")
    clock.now += 10
    with pytest.raises(RuntimeError, match="'clip' entered inside 'mb'"):
        phases.enter("clip")
    phases.leave()
    phases.leave()  # none open: nothing
    phases.enter("clip")
    clock.now += 2
    phases.leave()
    phases.end(0.0)
    t = phases.take()
    assert t.phases == {"mb": 10, "clip": 2} and t.rest_ms == 0


def test_the_step_line_says_a_prediction_only_where_one_was_made():
    """Skrull's steps are predicted (the ratio and its spread); torchtitan's batching predicts
    nothing, so its line and scalars carry no ratio."""
    from skrull_ext.train.step_checks import measured_said

    skrull = StepTimes(4, {"mb": 90.0, "opt": 10.0}, 100.0, 50_000.0)
    said = measured_said(skrull, {"median": 2.1, "p10": 1.9, "p90": 2.3, "steps": 3.0})
    assert said == ("step 4 phases ms: mb 90 opt 10 rest 0: 100.0 ms as run, measured 2.00x the predicted step "
                    "(so far median 2.10x, p10-p90 1.90x-2.30x), 10% outside the micro-batches; ")
    first = measured_said(skrull, {"median": 2.0, "p10": 2.0, "p90": 2.0, "steps": 1.0})  # no spread of one yet
    assert first == ("step 4 phases ms: mb 90 opt 10 rest 0: 100.0 ms as run, measured 2.00x the predicted step, "
                     "10% outside the micro-batches; ")
    packed = StepTimes(4, {"mb": 90.0, "opt": 10.0}, 100.0, 0.0)
    assert measured_said(packed, {}) == ("step 4 phases ms: mb 90 opt 10 rest 0: 100.0 ms as run, "
                                         "10% outside the micro-batches; ")
    assert "skrull/measured_over_predicted" not in packed.metrics()
    assert skrull.metrics()["skrull/measured_over_predicted"] == 2.0


# torch 2.11's profiler warns at its first start in a process (torch >= 2.13 only on a second cycle); one
# cycle here, nothing cleared (profile/memory.py's CpuTensorPeak quiets the same line).
@pytest.mark.filterwarnings("ignore:.*Profiler clears events at the end of each cycle:UserWarning")
def test_each_phase_is_a_record_function_range_in_a_profiler_trace():
    """bench trace-report reads the phases off a trace: one ``skrull/phase_<key>`` range per phase entered,
    from ``enter`` to ``leave`` (packed_trainer.py's hooks) as from ``phase``, none left open."""
    import torch

    from skrull_ext.train.step_phases import RANGE

    clock = TickClock()
    phases = StepPhases(clock)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        run_step(phases, clock, 1, [("data", 1), ("checks", 1), ("mb", 1), ("checks", 1)])
        phases.begin(2)
        phases.enter("clip")
        torch.ones(3).sum()
        phases.leave()
        phases.leave()  # none open: nothing
        phases.end(0.0)
    names = [e.name for e in prof.events() if e.name.startswith("skrull/phase_")]
    assert sorted(names) == sorted(RANGE.format(key=k) for k in ("data", "checks", "mb", "checks", "clip"))
    clip = next(e for e in prof.events() if e.name == "skrull/phase_clip")
    assert any(e.name == "aten::sum" and e.time_range.start >= clip.time_range.start
               and e.time_range.end <= clip.time_range.end for e in prof.events())


def test_the_host_clock_times_the_gaps_between_phases_beside_the_device_clock(monkeypatch):
    """On a GPU the phases are CUDA events: ``rest_ms`` is the device's time between phases, and
    ``rest_host_ms`` the host's (perf_counter at the same marks), so a step line can say whether
    the device waited for host work there. Here the device clock (TickClock) and the host clock
    (one second a call) disagree on purpose."""
    from skrull_ext.train import step_phases

    calls = iter(range(100))
    monkeypatch.setattr(step_phases.time, "perf_counter", lambda: float(next(calls)))
    clock = TickClock()
    phases = StepPhases(clock)
    # host marks: begin 0, data 1-2, mb 3-4, opt 5-6, end 7: four 1 s gaps (0-1, 2-3, 4-5, 6-7)
    run_step(phases, clock, 3, [("data", 1), (None, 2), ("mb", 10), ("opt", 1)])
    t = phases.take()
    assert t.rest_ms == 2 and t.rest_host_ms == 4000.0
    assert t.metrics()["skrull/phase_rest_host_ms"] == 4000.0
    line = phases_summary([t])
    assert line.endswith("; rest 2.0, on the host's clock 4000.0 (where these match on a GPU, the device waited "
                         "for the host's work between the phases)")
