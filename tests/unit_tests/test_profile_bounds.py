"""The profiler's exit conditions, its option help and its plot titles (no nan)."""

import copy
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest

from skrull_ext.profile.cli import _parser, failures

COMMITTED = Path(__file__).resolve().parents[2] / "profiles" / "cpu-debug-gloo2.toml"


def _compute(held_out: float, packed: float):
    return SimpleNamespace(held_out_max_rel_error=held_out, packed_max_rel_error=packed)


def test_each_missed_bound_is_one_failure_naming_its_option():
    assert failures(_compute(0.05, 0.10), None, 0.15, 0.15) == []
    (only,) = failures(_compute(0.05, 0.31), None, 0.15, 0.15)
    assert "packed buffer misses by 31.0%, more than --max-packed-error 15%" in only
    (only,) = failures(_compute(0.20, 0.0), SimpleNamespace(ok=True), 0.15, 0.15)
    assert "held-out length misses by 20.0%, more than --max-held-out-error 15%" in only
    assert len(failures(_compute(0.2, 0.2), SimpleNamespace(ok=False), 0.15, 0.15)) == 3


def test_micro_batch_fit_fails_past_its_bound_and_never_prices_below_zero():
    from skrull_ext.profile.micro_batch import fixed_from_fit

    mb = lambda worst: SimpleNamespace(fit=SimpleNamespace(max_rel_error=worst))  # noqa: E731
    assert failures(_compute(0.0, 0.0), None, 0.15, 0.15, mb(0.10), 0.15) == []
    (only,) = failures(_compute(0.0, 0.0), None, 0.15, 0.15, mb(0.22), 0.15)
    assert "misses the line over micro-batch counts by 22.0%, more than --max-micro-batch-error 15%" in only
    # One more micro-batch costs the slope; layers * b_us of it is priced already.
    assert fixed_from_fit(slope_us=20_000.0, calls_us=6 * 2_000.0) == 8_000.0
    assert fixed_from_fit(slope_us=10_000.0, calls_us=12_000.0) == 0.0


def test_every_option_has_help_and_names_its_default():
    for action in _parser()._actions:
        if action.dest in ("help",):
            continue
        assert action.help, action.option_strings
        assert "default" in action.help or action.required, action.option_strings
        assert "issue" not in action.help.lower()


@pytest.mark.skipif(not COMMITTED.exists(), reason="no committed CPU profile")
@pytest.mark.parametrize("measured_comm", [True, False])
def test_plot_titles_never_say_nan(tmp_path, monkeypatch, measured_comm):
    import matplotlib.figure

    from skrull_ext.profile.plot import plot

    d = tomllib.loads(COMMITTED.read_text())
    if not measured_comm:  # what a one-process profile holds: a preset's table, no fit quality
        d = copy.deepcopy(d)
        d["meta"].pop("comm", None)
        for key in ("r2", "max_rel_error", "points", "threshold_bytes", "floor_us"):
            d["comm"].pop(key, None)
        d["comm"]["backend"] = "assumed:h100-assumed"
    titles = []
    save = matplotlib.figure.Figure.savefig

    def spy(fig, *args, **kwargs):
        titles.extend(ax.get_title() for ax in fig.axes)
        titles.append(fig._suptitle.get_text())
        return save(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", spy)
    plot(d, tmp_path / "p.png")
    assert len(titles) == 4 and not any("nan" in t.lower() for t in titles), titles
    assert ("R^2" in titles[2]) == measured_comm


@pytest.mark.parametrize("argv, message", [
    (["--lengths", "0:128"], "argument --lengths: the range '0:128' must run from a first value >= 1"),
    (["--lengths", "512:128"], "argument --lengths: the range '512:128' must run from a first value >= 1"),
    (["--lengths", "abc"], "argument --lengths: not a list of positive integers: 'abc'"),
    (["--held-out", "-5"], "argument --held-out: not a list of positive integers: '-5'"),
    (["--packed", "256+x"], "argument --packed: not a list of positive integers: '256,x'"),
    (["--memory-limit", "lots"], "argument --memory-limit: not a byte size: 'lots'"),
    (["--comm-from", "nope"], "argument --comm-from: invalid choice: 'nope'"),
])
def test_a_bad_flag_is_one_usage_line_naming_it(argv, message, capsys):
    """'0:128' doubled 0 forever (the profiler hung), '512:128' was an empty ladder silently derived
    from the job, a bad list read "invalid <lambda> value", and a bad --comm-from was refused only
    when the file was written, after the whole measurement."""
    with pytest.raises(SystemExit) as e:
        _parser().parse_known_args(["--config-file", "job.toml", *argv])
    assert e.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("flag, value", [("--max-held-out-error", "nan"), ("--max-packed-error", "-0.1"),
                                         ("--max-micro-batch-error", "inf")])
def test_error_bounds_are_finite_fractions(flag, value):
    from skrull_ext.profile.cli import _check_args

    args, _ = _parser().parse_known_args(["--config-file", "job.toml", flag, value])
    with pytest.raises(ValueError, match=f"{flag}: must be a finite fraction >= 0, got {value}"):
        _check_args(args)
