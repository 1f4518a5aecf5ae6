"""SkrullTrainer's start-up checks on the windows a launch trains (issue 56): run once the
checkpoint's windows are known, they cover every global batch the run reads, to where
``Windows`` says its last window ends, which a resume with another width may push past
``training.steps``."""

from types import SimpleNamespace

import pytest

from skrull_ext.data.steps.overlength import OverlengthError
from skrull_ext.data.steps.loader import SkrullDataLoader
from skrull_ext.scheduler import Scheduler, cost_model
from skrull_ext.train.job.skrull_config import SkrullConfig
from skrull_ext.train.trainer import SkrullTrainer

SEED, GBS = 3, 8
"""With this seed the debug lengths' only sample over 1,536 tokens in steps 1..14 is at step 13 (2,893)."""


def _loader(lookahead: int) -> SkrullDataLoader:
    section = SkrullConfig(bucket_size=768, cost_model="h100-assumed", lookahead=lookahead, overlength="error")
    config = SkrullDataLoader.Config(length_scale=32.0, max_len=4096, global_batch_size=GBS, vocab_size=2048,
                                     seed=SEED, prefetch_steps=0)
    out = config.build(dp_world_size=1, dp_rank=0)
    out.attach(Scheduler(section.scheduler_config(1, 2), cost_model.preset("llama3-debug")), 0, 2)
    return out


def _start_checks(loader: SkrullDataLoader, steps: int) -> None:
    trainer = SimpleNamespace(dataloader=loader, config=SimpleNamespace(training=SimpleNamespace(steps=steps)),
                              _left_line=lambda steps, start: None)
    SkrullTrainer._start_checks(trainer)


def test_a_resumed_runs_widened_window_is_checked_before_its_first_step():
    assert max(n for s in range(5, 13) for _, n in _loader(1).step_lengths(s)) <= 1536  # CP 2 x 768 holds them
    saved = _loader(3)
    for _ in range(4):
        saved.next_step()
    state = saved.state_dict()
    # The same 12-step run continued with W = 3 reads to step 12: nothing over the limit.
    same = _loader(3)
    same.load_state_dict(state)
    _start_checks(same, 12)
    # Continued with W = 4: windows 4..6, 7..10, 11..14; step 13's sample fails before step 5.
    widened = _loader(4)
    widened.load_state_dict(state)
    assert widened.windows.end(12) == 14
    with pytest.raises(OverlengthError, match=r"sample \d+ \(step 13\) has length 2893, longer than the 1536 tokens "
                                              r".*\(1 of \d+ sequences of steps 5\.\.14 are over-length\)"):
        _start_checks(widened, 12)


def test_a_run_ending_inside_a_window_names_the_samples_it_leaves():
    loader = _loader(4)
    trainer = SimpleNamespace(dataloader=loader)
    assert SkrullTrainer._left_line(trainer, 8, start=True) is None  # 8 steps end window 1
    left = loader.builder.window(6).samples[2] + loader.builder.window(6).samples[3]
    assert len(left) == 2 * GBS
    assert SkrullTrainer._left_line(trainer, 6, start=True) == (
        "training.steps 6 ends inside look-ahead window 1 (steps 5..8, skrull.lookahead 4): the 16 samples the "
        f"window regroups onto steps 7..8 will not be trained: {', '.join(map(str, left[:8]))} and 8 more. To train "
        "every sample read, set training.steps to 8 or 4 (whole windows), or resume from the last checkpoint with "
        "more steps (docs/design/lookahead.md)")
    assert SkrullTrainer._left_line(trainer, 7, start=False) == (
        "training.steps 7 ended inside look-ahead window 1 (steps 5..8): 8 samples it had regrouped onto step 8 "
        "were read ahead and not trained (named at start-up; not counted above)")
