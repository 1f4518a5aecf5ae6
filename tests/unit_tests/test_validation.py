"""[validation] (skrull_ext/train/validation.py): when a step is evaluated, how the held-out
set is batched, and the job checks that refuse a validation that cannot run, each one
line naming the key. The 2-process runs are tests/integration_tests/test_validation_run.py."""

import os

import pytest

from skrull_ext.errors import JobFileError
from skrull_ext.train.job.job_file import load_config
from skrull_ext.train.validation import HeldOut, ValidationConfig

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
DEBUG = os.path.join(ROOT, "skrull_ext", "jobs", "debug_cpu.toml")
TEXT = os.path.join(ROOT, "skrull_ext", "jobs", "debug_cpu_text.toml")
HELD_OUT = os.path.join(ROOT, "tests", "fixtures", "held_out.jsonl")


def test_validation_is_due_every_freq_steps_and_at_the_last():
    every = ValidationConfig(enable=True, freq=3)
    assert [s for s in range(1, 11) if every.due(s, 10)] == [3, 6, 9, 10]
    last = ValidationConfig(enable=True)
    assert [s for s in range(1, 11) if last.due(s, 10)] == [10]
    assert not ValidationConfig(freq=1).due(10, 10)  # off


def test_validation_batches_cover_the_held_out_samples_once():
    class Source:
        def length(self, i):
            return 10 + i

    held = HeldOut(Source(), 10)
    batches = [held.global_batch(k, 4) for k in (1, 2, 3)]
    assert batches == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert held.length(9) == 19  # the rest is the source's


BAD = [
    (TEXT, ["--validator.enable"], "validator.enable = True: torchtitan's validator feeds batches the DACP "
                                   "attention cannot take; a Skrull job sets [validation] enable = true"),
    (TEXT, ["--validation.enable"], "validation.dataset_path = '': the held-out data"),
    (TEXT, ["--validation.enable", "--validation.dataset_path", "/nonexistent/held.jsonl"],
     "validation.dataset_path = '/nonexistent/held.jsonl'"),
    (TEXT, ["--validation.enable", "--validation.dataset", "hf", "--validation.dataset_path", "/nonexistent/d"],
     "validation.dataset_path = '/nonexistent/d': is not a local file or folder"),
    (TEXT, ["--validation.enable", "--validation.dataset_path", HELD_OUT, "--skrull.no-enable"],
     "validation.enable = True: needs skrull.enable = true"),
    (DEBUG, ["--validation.enable"], "validation.samples = 0: a synthetic held-out set needs a sample count"),
    (TEXT, ["--validation.freq", "-1"], "validation.freq: -1 must be an integer >= 0"),
]


@pytest.mark.parametrize("job, flags, message", BAD, ids=[" ".join(b[1]) for b in BAD])
def test_validation_bad_config_is_one_line_naming_the_key(job, flags, message, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(JobFileError) as info:
        load_config(["--config-file", job, *flags])
    text = str(info.value)
    assert message in text and "\n" not in text


def test_validation_config_passes_with_a_held_out_file(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "1")
    config = load_config(["--config-file", TEXT, "--validation.enable", "--validation.dataset_path", HELD_OUT])
    assert config.validation.enable and config.validation.dataset_path == HELD_OUT
