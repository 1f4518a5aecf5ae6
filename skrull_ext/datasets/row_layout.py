"""How torchtitan's batching (``skrull.enable = false``) lays a global batch
out in rows: the registry behind ``[dataloader] packing``.

A layout maps the step's sample lengths (caller order) to rows over all DP
ranks, DP rank r taking an equal, contiguous share of them; each row is a
list of pieces ``(sample, first token, end token)``. What a row does not
fill is padding (packed.py). Pieces are separate documents under
torchtitan's document mask (positions restart at 0 at each piece).

- ``rows`` (torchtitan's default shape): ``dp * local_batch_size`` rows of
  ``seq_len``, whole samples placed first-fit. Short chats leave most of a
  row as padding, which CP still shards and exchanges.
- ``stream``: the samples concatenated and cut into rows of at most
  ``seq_len`` tokens (a multiple of ``dp`` rows), all of one length rounded
  up to ``multiple`` (torchtitan's CP shards a FlexAttention row in blocks:
  ``cp * 128``), the row count (up to twice the fewest) chosen for the
  fewest positions. No padding but that rounding; a sample cut at a row's end goes on at the
  next row's start, without the context before the cut. The strongest
  baseline torchtitan's CP can run on chat data: same tokens per step as
  Skrull, no padding, a document-causal mask.
"""

from collections.abc import Callable
from dataclasses import dataclass

Piece = tuple[int, int, int]
"""(sample index, first token, end token) of one document in a row."""


@dataclass(frozen=True)
class RowLayout:
    rows: list[list[Piece]]
    """Over all DP ranks; DP rank r holds rows [r * len(rows) // dp, (r + 1) * len(rows) // dp)."""
    row_len: int


def whole_rows(lengths: list[int], *, dp: int, local_batch_size: int, seq_len: int, multiple: int) -> RowLayout:
    """First-fit of whole samples into ``dp * local_batch_size`` rows of ``seq_len``.

    Raises ValueError when the batch does not fit, naming the sizes involved.
    """
    rows = dp * local_batch_size
    free = [seq_len] * rows
    out: list[list[Piece]] = [[] for _ in range(rows)]
    for k, n in enumerate(lengths):
        row = next((r for r in range(rows) if free[r] >= n), None)
        if row is None:
            raise ValueError(
                f"global batch ({sum(lengths)} tokens, longest {max(lengths)}) "
                f"does not fit {rows} rows of seq_len={seq_len}; raise "
                "training.seq_len or training.local_batch_size, lower "
                "dataloader.max_len / global_batch_size, or set dataloader.packing = 'stream'"
            )
        out[row].append((k, 0, n))
        free[row] -= n
    return RowLayout(out, seq_len)


def stream_rows(lengths: list[int], *, dp: int, local_batch_size: int, seq_len: int, multiple: int) -> RowLayout:
    """The samples as one stream cut into equal rows of at most ``seq_len``
    (``local_batch_size`` is not used: the tokens set the row count)."""
    if seq_len % multiple:
        raise ValueError(f"training.seq_len ({seq_len}) must be a multiple of {multiple} (CP degree x 128, the block CP shards)")
    total = sum(lengths)
    # The fewest positions (then the fewest rows) over row counts from the
    # fewest that hold the stream in rows of seq_len to twice that: more rows
    # shrink the rounding, but each row boundary may cut a sample.
    fewest = dp * max(1, _ceil(_ceil(total, seq_len), dp))
    rows, row_len = min(
        ((r, max(multiple, _ceil(_ceil(total, r), multiple) * multiple)) for r in range(fewest, 2 * fewest + 1, dp)),
        key=lambda c: (c[0] * c[1], c[0]),
    )
    out: list[list[Piece]] = [[] for _ in range(rows)]
    r, free = 0, row_len
    for k, n in enumerate(lengths):
        start = 0
        while start < n:
            take = min(free, n - start)
            out[r].append((k, start, start + take))
            start += take
            free -= take
            if free == 0:
                r, free = r + 1, row_len
    return RowLayout(out, row_len)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


PACKINGS: dict[str, Callable[..., RowLayout]] = {"rows": whole_rows, "stream": stream_rows}
