"""Look-ahead windows across resumes (data/steps/windows.py): exact cases, and on random
resume histories the invariants exactly-once rests on: the windows partition the
steps, and a resume never changes the window of a step the checkpoint's window
plan had already begun."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skrull_ext.data.steps.windows import Window, Windows


def spans(windows: Windows, last: int) -> list[tuple[int, int]]:
    """(first, last) of each window over steps 1..last."""
    out, s = [], 1
    while s <= last:
        w = windows.window(s)
        out.append((w.first, w.last))
        s = w.last + 1
    return out


def test_one_width_cuts_the_steps_in_blocks():
    w = Windows.of(4)
    assert [w.window(s) for s in (1, 4, 5, 9)] == [Window(0, 1, 4), Window(0, 1, 4), Window(1, 5, 4), Window(2, 9, 4)]
    assert Windows().window(7) == Window(6, 7, 1)


def test_where_a_run_stops_reading_is_the_end_of_its_last_window():
    # 5 steps of W 8 read global batches 1..8 and leave steps 6..8's share untrained.
    assert Windows.of(8).end(5) == 8 and list(Windows.of(8).left(5)) == [6, 7, 8]
    assert Windows.of(4).end(8) == 8 and not Windows.of(4).left(8)
    # Saved at step 4 with W 3, resumed with W 4 (issue 56): the window 4..6 is finished, then 7..10, 11..14.
    widened = Windows.of(3).switch(4, 4)
    assert widened.end(12) == 14 and list(widened.left(12)) == [13, 14]


def test_a_new_width_starts_after_the_window_the_checkpoint_stopped_in():
    # Stopped after step 6, inside window 5..8 of 4: that window keeps its width, 2 from step 9.
    w = Windows.of(4).switch(6, 2)
    assert w.regimes == ((1, 4), (9, 2))
    assert spans(w, 12) == [(1, 4), (5, 8), (9, 10), (11, 12)]
    assert w.window(11) == Window(3, 11, 2)
    # Stopped at a window's end: the new width starts at the next step.
    assert Windows.of(4).switch(8, 8).regimes == ((1, 4), (9, 8))
    # Before any step, or the same width: nothing to finish, nothing changes.
    assert Windows.of(4).switch(0, 2) == Windows.of(2)
    assert Windows.of(4).switch(6, 4) == Windows.of(4)


def test_a_width_not_yet_begun_is_replaced():
    # Switched to 2 from step 9, checkpointed at 7 (still in 5..8), resumed with 8: 2 never began.
    w = Windows.of(4).switch(6, 2)
    assert w.switch(7, 8).regimes == ((1, 4), (9, 8))
    assert w.switch(7, 4) == Windows.of(4)


def test_the_checkpoint_form_round_trips_and_bad_ones_are_named():
    w = Windows.of(4).switch(6, 2)
    assert Windows.from_json(w.to_json()) == w
    assert Windows.from_json("[]") == Windows() and Windows().to_json() == "[]"  # never regrouped, as
    # torchtitan's batching writes it
    with pytest.raises(ValueError, match=r"the checkpoint's dataloader.lookahead: '\[\[1, 4\], \[7, 2\]\]' is "):
        Windows.from_json("[[1, 4], [7, 2]]")  # 7 is inside window 5..8
    with pytest.raises(ValueError, match=r"'\{\"a\": 1\}' is not a list of \[first step, width\] regimes"):
        Windows.from_json('{"a": 1}')
    assert w.describe() == "of 4 steps from step 1, of 2 from step 9"


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 8), st.lists(st.tuples(st.integers(0, 12), st.integers(1, 8)), max_size=6))
def test_resumes_keep_the_windows_a_partition_and_never_move_a_begun_one(first, resumes):
    w, done = Windows.of(first), 0
    for advance, width in resumes:
        done += advance
        nxt = w.window(done + 1)
        begun = nxt.last if nxt.first <= done else done  # steps up to here are in windows already begun
        new = w.switch(done, width)
        assert all(new.window(s) == w.window(s) for s in range(1, begun + 1))
        assert new.window(begun + 1).width == width
        w = new
    last = done + 20
    blocks = spans(w, last)
    assert blocks[0][0] == 1 and all(b[0] == a[1] + 1 for a, b in zip(blocks, blocks[1:]))
    for s in range(1, last + 1):
        win = w.window(s)
        assert win.first <= s <= win.last and w.window(win.first) == win
    assert [w.window(f).index for f, _ in blocks] == list(range(len(blocks)))
