"""Every sample accounted for, read back from what a run wrote: its plan log
(``--skrull.plan_log``: the samples each step trained) against its run summary
(``read = trained whole + trained cut + skipped``), on the debug job's data
(synthetic, no skips; a sample longer than the 256 tokens of bucket_size 256 x cp 1
is cut)."""

import os
import re

from skrull_ext.data.steps.loader import SkrullDataLoader
from skrull_ext.train.plan_log import read_plan_log

GBS = 8
LIMIT = 256

SUMMARY = re.compile(r"Run summary: samples read (\d+) = trained whole (\d+) \+ trained cut (\d+) \+ skipped (\d+)")


def _lengths():
    """The debug job's source, read in-process (its lengths are those of the run)."""
    config = SkrullDataLoader.Config(length_scale=32.0, max_len=512, global_batch_size=GBS, vocab_size=2048)
    return config.build(dp_world_size=1, dp_rank=0).source


def trained(dump: str, steps) -> list[int]:
    """The samples rank 0's plan log says each of ``steps`` trained, in step order."""
    plans = read_plan_log(os.path.join(dump, "skrull_plans", "rank0.jsonl"))
    assert set(steps) <= set(plans), f"the plan log has steps {sorted(plans)}, not {list(steps)}"
    return [i for s in steps for i in plans[s]["samples"]]


def summary(output: str) -> tuple[int, int, int, int]:
    """(read, whole, cut, skipped) of the run summary (the whole run's, every launch)."""
    found = SUMMARY.findall(output)
    assert len(found) == 1, output[-3000:]
    return tuple(map(int, found[0]))


def check_exactly_once(samples: list[int], output: str, read_to: int, left: int = 0) -> None:
    """``samples``, the plan logs' trained samples over the whole run, are each trained once;
    with the ``left`` samples of the window the run stopped inside they are global batches
    1..``read_to``; and the summary counts exactly them, cut where longer than the limit."""
    assert len(samples) == len(set(samples)), "a sample trained twice"
    assert set(samples) <= set(range(read_to * GBS)) and len(samples) + left == read_to * GBS
    source = _lengths()
    cut = sum(source.length(i) > LIMIT for i in samples)
    assert summary(output) == (len(samples), len(samples) - cut, cut, 0)
