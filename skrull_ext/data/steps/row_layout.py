"""How torchtitan's batching (``skrull.enable = false``) lays samples out in
its ``[B, seq_len]`` rows: the three ``[dataloader] packing`` modes.

A row is a list of pieces ``(sample, first token, end token)``; each piece
is a document under torchtitan's document mask (positions restart at 0 at
each piece) and what a row does not fill is padding (packed.py).

- ``rows`` (torchtitan's SFT shape): each step's global batch, whole samples
  placed first-fit into ``dp * local_batch_size`` rows. Short chats leave
  most of a row as padding, which CP still shards, computes and exchanges.
- ``stream`` (torchtitan's pretraining shape): the global batches, in order,
  as one stream of tokens cut into full rows; a sample cut at a row's end
  goes on at the next row's start, without the context before the cut, and
  what the step's rows do not hold is carried to the next step. No padding
  at all and one shape for every step (torchtitan's CP compiles its block
  mask per shape), so a step trains ``dp * local_batch_size * seq_len``
  tokens rather than one global batch: compare it per token.
- ``documents`` (what a fine-tuning user otherwise runs: TRL's best-fit
  packing, say): whole samples, never cut, placed best-fit decreasing into
  the step's rows from the global batches in order; what does not fit is
  carried to the next step and placed there first. One shape for every
  step, no document loses its context, and only the rows' unfilled ends
  are padding (counted: ``packed.py``'s ``last_tokens`` holds real tokens).
"""

import bisect

from skrull_ext.scheduler.first_fit import FirstFit

PACKINGS = ("rows", "stream", "documents")

Piece = tuple[int, int, int]
"""(sample, first token, end token) of one document in a row."""


def whole_rows(lengths: list[int], rows: int, seq_len: int) -> list[list[Piece]]:
    """First-fit of whole samples (``sample`` = index into ``lengths``) into
    ``rows`` rows of ``seq_len``. Raises ValueError naming the sizes when the
    batch does not fit."""
    fit = FirstFit(rows, seq_len)
    out: list[list[Piece]] = [[] for _ in range(rows)]
    for k, n in enumerate(lengths):
        row = fit.place(n)
        if row is None:
            raise ValueError(
                f"global batch ({sum(lengths)} tokens, longest {max(lengths)}) "
                f"does not fit {rows} rows of seq_len={seq_len}; raise "
                "training.seq_len or training.local_batch_size, lower "
                "dataloader.max_len / global_batch_size, or set dataloader.packing = 'stream'"
            )
        out[row].append((k, 0, n))
    return out


def cut_stream(pieces: list[Piece], rows: int, row_len: int) -> tuple[list[list[Piece]], list[Piece]]:
    """The first ``rows * row_len`` tokens of a stream of pieces, cut into full
    rows, and the pieces left over. The stream must hold that many tokens."""
    out: list[list[Piece]] = [[] for _ in range(rows)]
    r, free = 0, row_len
    for i, (k, start, end) in enumerate(pieces):
        while start < end:
            if r == rows:
                return out, [(k, start, end)] + pieces[i + 1:]
            take = min(free, end - start)
            out[r].append((k, start, start + take))
            start += take
            free -= take
            if free == 0:
                r, free = r + 1, row_len
    if r < rows:
        raise ValueError(f"the stream holds {sum(e - s for _, s, e in pieces)} tokens, "
                         f"fewer than {rows} rows of {row_len}")
    return out, []


def best_fit_rows(carried: list[Piece], drawn: list[Piece], rows: int, row_len: int
                  ) -> tuple[list[list[Piece]], list[Piece]]:
    """Whole pieces best-fit decreasing into ``rows`` rows of ``row_len``: the
    carried ones first (longest first), then the drawn ones (longest first), each
    into the row it leaves least room in (the lowest such row on a tie). Returns
    the rows (each in placement order) and what did not fit, carried ones first,
    each group in its given order. Every piece must fit an empty row."""
    out: list[list[Piece]] = [[] for _ in range(rows)]
    by_room = [(row_len, r) for r in range(rows)]  # (room left, row), sorted: the best fit is a bisection
    given = carried + drawn
    left: list[int] = []
    for first, group in ((0, carried), (len(carried), drawn)):
        for i in sorted(range(first, first + len(group)), key=lambda i: -(given[i][2] - given[i][1])):
            n = given[i][2] - given[i][1]
            if n > row_len:
                raise ValueError(f"a piece of {n} tokens does not fit a row of {row_len}")
            at = bisect.bisect_left(by_room, (n, -1))
            if at == len(by_room):
                left.append(i)
                continue
            room, r = by_room.pop(at)
            out[r].append(given[i])
            bisect.insort(by_room, (room - n, r))
    return out, [given[i] for i in sorted(left)]


def context_cuts(layout: list[list[Piece]]) -> tuple[int, int]:
    """(documents, tokens) of a layout's pieces that start mid-document: each a
    document cut at a row's end, trained without the context before the cut."""
    cut = [(k, e - s) for row in layout for k, s, e in row if s > 0]
    return len({k for k, _ in cut}), sum(n for _, n in cut)
