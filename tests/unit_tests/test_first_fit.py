"""First-fit in O(log bins) (scheduler/first_fit.py) and the best fit of
torchtitan's 'documents' rows, each against the plain scan it replaced."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skrull_ext.data.steps.row_layout import best_fit_rows
from skrull_ext.scheduler.first_fit import FirstFit


def scan_first_fit(needs: list[int], bins: int, capacity: int) -> list[int | None]:
    """Reference: each item to the lowest bin with room, found by a scan."""
    room = [capacity] * bins
    out = []
    for n in needs:
        b = next((b for b in range(bins) if room[b] >= n), None)
        if b is not None:
            room[b] -= n
        out.append(b)
    return out


def test_first_fit_exact():
    fit = FirstFit(3, 10)
    assert [fit.place(n) for n in (6, 6, 4, 5, 3, 10, 1)] == [0, 1, 0, 2, 1, None, 1]
    assert fit.opened == 3 and [fit.room(b) for b in range(3)] == [0, 0, 5]
    assert FirstFit(0, 10).place(1) is None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 40), max_size=60), st.integers(1, 20), st.integers(1, 40))
def test_first_fit_equals_the_scan(needs, bins, capacity):
    fit = FirstFit(bins, capacity)
    placed = [fit.place(n) for n in needs]
    assert placed == scan_first_fit(needs, bins, capacity)
    assert fit.opened == max((b + 1 for b in placed if b is not None), default=0)


def scan_best_fit(carried, drawn, rows, row_len):
    """Reference: best_fit_rows as a scan of every row per piece (its code before the bisection)."""
    out = [[] for _ in range(rows)]
    free = [row_len] * rows
    given_ = carried + drawn
    left = []
    for first, group in ((0, carried), (len(carried), drawn)):
        for i in sorted(range(first, first + len(group)), key=lambda i: -(given_[i][2] - given_[i][1])):
            n = given_[i][2] - given_[i][1]
            fits = [r for r in range(rows) if free[r] >= n]
            if not fits:
                left.append(i)
                continue
            r = min(fits, key=lambda r: (free[r], r))
            out[r].append(given_[i])
            free[r] -= n
    return out, [given_[i] for i in sorted(left)]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 64), max_size=30), st.lists(st.integers(1, 64), max_size=40), st.integers(1, 8))
def test_best_fit_rows_equals_the_scan(carried, drawn, rows):
    carried = [(k, 0, n) for k, n in enumerate(carried)]
    drawn = [(100 + k, 0, n) for k, n in enumerate(drawn)]
    assert best_fit_rows(carried, drawn, rows, 64) == scan_best_fit(carried, drawn, rows, 64)


@pytest.mark.parametrize("bins", [1, 2, 5, 8, 9])
def test_first_fit_fills_every_bin(bins):
    fit = FirstFit(bins, 4)
    assert [fit.place(4) for _ in range(bins + 1)] == list(range(bins)) + [None]
