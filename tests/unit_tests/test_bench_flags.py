"""Every bench command refuses a bad flag in argparse's one usage line (exit 2), before any
work: a profile that is not one, a count below its floor, a preset or margin out of range.
Each case below was a traceback (or a run that could not end) before bench/args.py."""

import pytest

from skrull_ext.bench import adversarial, datawait, train_report

CASES = [
    (adversarial.main, ["--sizes", "0"], "argument --sizes: must be >= 1, got 0"),
    (adversarial.main, ["--reps", "0"], "argument --reps: must be >= 1, got 0"),
    (adversarial.main, ["--model", "nope"], "argument --model: invalid choice: 'nope'"),
    (datawait.main, ["--cpsat-margin", "-1"], "--cpsat-margin: skrull.cpsat_margin must be in [0.0, 100.0], got -1.0"),
    (datawait.main, ["--profile", "/nonexistent.toml"], "argument --profile: profile '/nonexistent.toml' is not a file"),
    (train_report.main, ["/tmp", "--profile", "/nonexistent.toml"], "argument --profile: profile '/nonexistent.toml'"),
    (train_report.main, ["/tmp", "--before", __file__], "argument --before: "),
    (train_report.main, ["/tmp", "--warmup", "-1"], "argument --warmup: must be >= 0, got -1"),
]


@pytest.mark.parametrize("main, argv, message", CASES, ids=[" ".join(c[1]) for c in CASES])
def test_bad_flag_is_one_usage_line(main, argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and "Traceback" not in err


@pytest.mark.parametrize("argv, message", [
    (["--sizes", "0"], "--sizes must be >= 1, got 0"),
    (["--length-scale", "0"], "--length-scale must be > 0, got 0.0"),
])
def test_bench_data_names_the_flag(argv, message, capsys):
    from skrull_ext.bench import data

    with pytest.raises(SystemExit) as e:
        data.parse_args(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_bench_data_refuses_unknown_lengths_before_writing(tmp_path):
    from skrull_ext.bench import data
    from skrull_ext.errors import DataError

    with pytest.raises(DataError, match=r"--lengths: 'nope' is neither a shipped length file"):
        data.parse_args(["--lengths", "nope", "--out", str(tmp_path)])
    assert not any(tmp_path.iterdir())
