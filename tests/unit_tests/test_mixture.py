"""Weighted mixtures (skrull_ext/data/sources/mixture.py): draws in proportion to the
weights, a pure function of (seed, index), epochs caps, per-source accounting, and
the job checks of [[dataloader.sources]]. The runs (resume, a run's per-source
summary) are tests/integration_tests/test_mixture_run.py."""

import os

import numpy as np
import pytest

from skrull_ext.data.steps.accounting import RunAccount
from skrull_ext.data.sources.mixture import MixtureSequences
from skrull_ext.data.steps.overlength import LengthLimit, decide_lengths, settle
from skrull_ext.errors import DataError, JobFileError
from skrull_ext.train.job.job_file import load_config

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
TEXT = os.path.join(ROOT, "skrull_ext", "jobs", "debug_cpu_text.toml")
TOLERANCE = 1
"""Most samples a source's count may be from ``draws * weight`` after any number of draws
(measured over seeds 0..9: at most 0.75 for weights 3:1, 1.0 for 5:3:2)."""


class Records:
    """A source of ``n`` records of lengths 10, 20, ..., every token a loss token."""

    def __init__(self, n: int, path: str = "x.jsonl"):
        self.n, self.path, self.bad = n, path, []

    def __len__(self):
        return self.n

    def length(self, i):
        return 10 * (1 + i % self.n)

    def loss_tokens(self, i, n, length):
        return n - 1

    def location(self, i):
        return f"{self.path}:{1 + i % self.n}"

    @property
    def max_length(self):
        return 10 * self.n


def _counts(mix: MixtureSequences, draws: int) -> np.ndarray:
    """Per source (columns), its samples among the first 1..draws draws (rows)."""
    src = np.asarray([mix.locate(i)[0] for i in range(draws)])
    return np.cumsum(src[:, None] == np.arange(len(mix.names))[None, :], axis=0)


@pytest.mark.parametrize("weights", [(3, 1), (5, 3, 2), (1, 1), (0.9, 0.1)])
@pytest.mark.parametrize("seed", [0, 1, 7])
def test_mixture_counts_follow_the_weights_after_every_draw(weights, seed):
    mix = MixtureSequences([f"s{k}" for k in range(len(weights))], [Records(50) for _ in weights],
                           list(weights), [None] * len(weights), seed=seed)
    draws = 5000
    counts = _counts(mix, draws)
    want = np.arange(1, draws + 1)[:, None] * (np.asarray(weights) / sum(weights))[None, :]
    worst = float(np.abs(counts - want).max())
    assert worst <= TOLERANCE, f"{weights}, seed {seed}: a source's count is {worst} from its share"
    # each source's own samples come in order 0, 1, 2, ... (its epochs shuffle them)
    for s in range(len(weights)):
        own = [j for i in range(draws) for k, j in [mix.locate(i)] if k == s]
        assert own == list(range(len(own)))


def test_mixture_is_a_function_of_the_seed():
    def order(seed):
        mix = MixtureSequences(["a", "b", "c"], [Records(5)] * 3, [2, 1, 1], [None] * 3, seed=seed)
        return [mix.locate(i) for i in range(3000)]

    assert order(3) == order(3)
    assert order(3) != order(4)
    # read from the end first (a resume), the same draws
    late = MixtureSequences(["a", "b", "c"], [Records(5)] * 3, [2, 1, 1], [None] * 3, seed=3)
    assert [late.locate(i) for i in range(2999, -1, -1)][::-1] == order(3)


def test_mixture_epochs_cap_a_source_and_the_others_fill_its_share():
    mix = MixtureSequences(["big", "small", "mid"], [Records(100), Records(4), Records(100)], [1, 1, 2],
                           [None, 8, None], seed=0)
    counts = _counts(mix, 400)
    assert counts[-1, 1] == 8  # 2 epochs of 4 records, then no more
    first = int(np.argmax(counts[:, 1] == 8))  # the draw that spent it
    assert first < 40
    later = counts[-1] - counts[first]
    assert abs(later[2] / later[0] - 2.0) < 0.05  # the others keep their relative weights


def test_mixture_spent_sources_fail_the_step_naming_training_steps():
    mix = MixtureSequences(["a", "b"], [Records(4), Records(6)], [1, 1], [4, 6], seed=0)
    assert mix.capacity == 10
    assert mix.global_batch(2, 5) == [5, 6, 7, 8, 9]
    with pytest.raises(DataError, match=r"step 3: the mixture's sources are spent \(10 samples: a 4, b 6; .*"
                                        r"lower training.steps to at most 2"):
        mix.global_batch(3, 5)


def test_mixture_accounting_per_source_adds_up_and_round_trips():
    mix = MixtureSequences(["a", "b"], [Records(30), Records(30)], [3, 1], [None, None], seed=0)
    limit = LengthLimit(100, "truncate", "max_len")
    run = RunAccount(mix.names)
    for step in range(1, 11):
        kept, _, _, account = decide_lengths(limit, mix.global_batch(step, 8), mix, step)
        settle(limit, account, run, step, len(kept), warn=False)  # as the scheduling loader counts a step
    t, by = run.totals, run.by_source
    assert t.read == 80 and sum(c.read for c in by.values()) == 80
    for c in by.values():
        c.check()  # read = whole + cut + skipped, per source
    assert sum(c.cut for c in by.values()) == t.cut > 0
    assert by["a"].read == 60 and by["b"].read == 20
    assert "per source: a read 60 = " in run.summary()
    again = RunAccount(mix.names)
    again.load_state_dict(run.state_dict())
    assert again.state_dict() == run.state_dict()


def _job(tmp_path, sources: str, dataset: str = "mixture") -> str:
    with open(TEXT) as f:
        text = f.read().replace('dataset = "jsonl"\n', f'dataset = "{dataset}"\n')
    text = text.replace('cost_model = "../../profiles/', f'cost_model = "{os.path.abspath(ROOT)}/profiles/')
    path = tmp_path / "job.toml"
    path.write_text(text + "\n" + sources)
    return str(path)


BAD = [
    ('[[dataloader.sources]]\npath = "tiny_sft"\nweight = 0\n', "mixture",
     "dataloader.sources[0].weight = 0.0: must be a finite number > 0"),
    ('[[dataloader.sources]]\npath = "tiny_sft"\n[[dataloader.sources]]\npath = "tiny_sft"\n', "mixture",
     "dataloader.sources[1].name = 'tiny_sft': another source has this name"),
    ('[[dataloader.sources]]\npath = "tiny_sft"\nepochs = -1\n', "mixture",
     "dataloader.sources[0].epochs = -1.0: must be a finite number > 0"),
    ('[[dataloader.sources]]\npath = "/nonexistent/chat.jsonl"\n', "mixture",
     "dataloader.sources[0].path = '/nonexistent/chat.jsonl'"),
    ('[[dataloader.sources]]\npath = "tiny_sft"\n', "jsonl", "dataloader.sources: set, but dataloader.dataset = 'jsonl'"),
    ("", "mixture", "dataloader.sources: dataloader.dataset = 'mixture' needs at least one [[dataloader.sources]]"),
    ('[[dataloader.sources]]\npath = "tiny_sft"\nwieght = 2\n', "mixture", "unknown key(s) ['wieght']"),
]


@pytest.mark.parametrize("sources, dataset, message", BAD, ids=[b[2][:40] for b in BAD])
def test_mixture_bad_sources_are_one_line_naming_the_key(tmp_path, monkeypatch, sources, dataset, message):
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(JobFileError) as info:
        load_config(["--config-file", _job(tmp_path, sources, dataset)])
    text = str(info.value)
    assert message in text and "\n" not in text, text


def test_mixture_prepare_builds_each_source_store_once(tmp_path, monkeypatch, capsys):
    """python -m skrull_ext.prepare on a mixture job: one store per source; a second
    prepare (or the training job) opens them as they are."""
    from skrull_ext.prepare import main

    monkeypatch.setenv("WORLD_SIZE", "1")
    job = _job(tmp_path, '[[dataloader.sources]]\npath = "tiny_sft"\nweight = 3\n'
                         f'[[dataloader.sources]]\nname = "notes"\npath = "{ROOT}/tests/fixtures/accounting.jsonl"\n')
    flags = [job, "--workers", "1", "--dataloader.token_cache_dir", str(tmp_path / "stores")]
    assert main(flags) == 0
    first = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in first] == ["tiny_sft", "notes"]
    assert len(os.listdir(tmp_path / "stores")) == 2 + 2  # two stores, and their lock files
    assert main(flags) == 0
    assert capsys.readouterr().out.splitlines() == first
