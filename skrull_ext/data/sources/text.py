"""Real text: JSONL records (or rows of HF ``datasets``) tokenized with a local tokenizer.

Each line is a JSON object in one of the record formats of
skrull_ext/data/sources/formats.py (plain text, OpenAI messages, ShareGPT,
prompt/response, alpaca). A ``RecordEncoder`` (records.py) turns it into
token ids and a loss mask: plain text is trained on whole, a chat through
the tokenizer's chat template (chat_template.py; ChatML pieces when the
tokenizer has none) with loss on the assistant's turns only (SFT).

Every record is tokenized once, before training: lengths are then known
exactly (the scheduler and the over-length pre-scan need them before any
token is built) and sample ``i`` is a pure function of ``(seed, i)``: record
``perm_e[i % n]`` of epoch ``e = i // n``, each epoch a fresh seeded
permutation. So a global batch is a function of its step, as with the
synthetic source, and a resume needs only the step. ``TokenizedRecords``
is that indexing; ``JsonlSequences`` keeps the tokens in memory,
token_store.StoreSequences memory-maps them from a store built once
(``dataloader.token_cache``, the default).

Records are kept whole: ``dataloader.max_len`` is a limit the over-length
policy applies per step (overlength.py), counted and reported with the
record's ``file:line`` (``location``), never a silent cut at load time.
"""

import json

import numpy as np
import torch

from skrull_ext.data.sources.formats import Columns, RecordReader
from skrull_ext.data.sources.json_array import array_error
from skrull_ext.data.sources.records import RecordEncoder
from skrull_ext.data.sources.synthetic import IGNORE_INDEX, Sample
from skrull_ext.errors import DataError

SKIP_HINT = " (dataloader.on_bad_record = 'skip' skips and counts such records)"


def jsonl_records(path: str, skip_bad: bool = False):
    """(where, record) of each non-blank line of a JSONL file; where is ``path:line``. A byte
    order mark before the first line is read past (``dataset = "hf"`` reads such a file too).

    A line that is not UTF-8 or not JSON raises DataError naming it, or, with
    ``skip_bad``, comes out in file order as ``(where, DataError)`` in place of
    the record, for the caller's ``BadRecords`` to count."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise DataError(f"{path}: cannot read the JSONL file: {e.strerror}") from e
    with f:
        for line_no, raw in enumerate(f, 1):
            where = f"{path}:{line_no}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                error = DataError(f"{where}: not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1}); "
                                  "JSONL files must be UTF-8")
            else:
                if line_no == 1:  # a UTF-8 byte order mark (Windows editors write one), as datasets reads it
                    line = line.removeprefix("\ufeff")
                if not line.strip():
                    continue
                try:  # without its newline: a cut line's error points into it, not at "line 2 column 1"
                    record = json.loads(line.rstrip("\r\n"))
                except json.JSONDecodeError as e:
                    if line_no == 1 and line.lstrip("\ufeff \t").startswith("["):  # a whole file, not a record
                        raise array_error(path, "dataloader.dataset = 'jsonl' (one JSON record a line)") from None
                    error = DataError(f"{where}: not valid JSON: {e}")
                else:
                    if line_no == 1 and isinstance(record, list):  # a one-line JSON array file
                        raise array_error(path, "dataloader.dataset = 'jsonl' (one JSON record a line)")
                    yield where, record
                    continue
            if not skip_bad:
                raise DataError(f"{error}{SKIP_HINT}")
            yield where, error


def encode_record(encode: RecordEncoder, where: str, record, min_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids int64, loss mask bool) of one record; DataError naming it if it cannot be trained."""
    if isinstance(record, DataError):  # a line jsonl_records could not read
        raise record
    ids, mask = encode(record, where)
    if len(ids) < min_len:
        raise DataError(f"{where}: {len(ids)} tokens, fewer than dataloader.min_len {min_len}")
    return np.asarray(ids, dtype=np.int64), np.asarray(mask, dtype=bool)


class BadRecords:
    """``dataloader.on_bad_record``: a record that cannot be trained (not UTF-8,
    not JSON, no recognised columns, an unknown role, an empty assistant turn,
    fewer than ``min_len`` tokens) raises DataError naming it ("error"), or is
    skipped and its message kept in ``messages`` ("skip")."""

    def __init__(self, mode: str):
        if mode not in ("error", "skip"):
            raise ValueError(f"dataloader.on_bad_record: {mode!r} is not 'error' or 'skip'")
        self.skip = mode == "skip"
        self.messages: list[str] = []

    def __call__(self, error: DataError) -> None:
        if not self.skip:
            raise DataError(f"{error}{SKIP_HINT}") from error
        self.messages.append(str(error))


class TokenizedRecords:
    """Tokenized records indexed like ``SyntheticSequences`` (module docstring).

    Subclasses hold the tokens: ``ids_of(r)``, ``mask_of(r)``, ``where_of(r)``
    of record ``r``, and set ``path``, ``seed``, ``bad`` (the messages of the
    records skipped as bad) and ``_lengths`` (int64, one per record)."""

    path: str
    seed: int
    bad: list[str]
    _lengths: np.ndarray
    _perm: tuple[int, np.ndarray] | None = None  # the last epoch's permutation

    def ids_of(self, r: int) -> np.ndarray:
        raise NotImplementedError

    def mask_of(self, r: int) -> np.ndarray:
        raise NotImplementedError

    def where_of(self, r: int) -> str:
        raise NotImplementedError

    def __len__(self) -> int:
        """Records in the source (one epoch)."""
        return len(self._lengths)

    def bad_summary(self) -> str:
        """One line: how many records were skipped as bad, of how many read, and the first few."""
        shown = "; ".join(self.bad[:3]) + ("; ..." if len(self.bad) > 3 else "")
        return (f"{len(self.bad)} of {len(self.bad) + len(self)} records skipped as bad "
                f"(dataloader.on_bad_record = 'skip'): {shown}")

    def _epoch(self, epoch: int) -> np.ndarray:
        perm = self._perm  # read once: the prefetch thread and the trainer's may both be here
        if perm is None or perm[0] != epoch:
            perm = (epoch, np.random.default_rng([self.seed, epoch]).permutation(len(self)))
            self._perm = perm
        return perm[1]

    def record(self, index: int) -> int:
        """The record behind sample ``index``."""
        epoch, pos = divmod(index, len(self))
        return int(self._epoch(epoch)[pos])

    def length(self, index: int) -> int:
        return int(self._lengths[self.record(index)])

    def has_loss_within(self, index: int, n: int) -> bool:
        """Whether sample ``index`` cut to ``n`` tokens keeps a loss token (label k predicts token k + 1)."""
        return bool(self.mask_of(self.record(index))[1 : n + 1].any())

    def loss_tokens(self, index: int, n: int, length: int) -> int:
        """Loss tokens of sample ``index`` trained as its first ``n`` tokens (``length``: its length, unused)."""
        return int(np.count_nonzero(self.mask_of(self.record(index))[1 : n + 1]))

    def location(self, index: int) -> str:
        """Where the record behind sample ``index`` is: ``path:line`` or ``path row N``."""
        return self.where_of(self.record(index))

    @property
    def max_length(self) -> int:
        return int(self._lengths.max())

    @property
    def record_lengths(self) -> np.ndarray:
        """Each record's length in tokens, in the file's order (what a resume's data order hashes)."""
        return self._lengths

    def __getitem__(self, index: int) -> Sample:
        r = self.record(index)
        ids = torch.from_numpy(np.asarray(self.ids_of(r), dtype=np.int64))
        labels = torch.full_like(ids, IGNORE_INDEX)
        keep = torch.from_numpy(np.asarray(self.mask_of(r)[1:], dtype=bool))
        labels[:-1] = torch.where(keep, ids[1:], IGNORE_INDEX)
        return Sample(input=ids, labels=labels)

    def global_batch(self, step: int, size: int) -> list[int]:
        """Sample indices of the global batch of 1-based training ``step``."""
        if step < 1:
            raise ValueError("steps are 1-based")
        return list(range((step - 1) * size, step * size))


class JsonlSequences(TokenizedRecords):
    """Tokenized JSONL records (or rows), kept in memory.

    ``records``: (where, row) pairs to tokenize instead of reading ``path`` as
    JSONL (the HF ``datasets`` source); ``encoder``: how a row becomes tokens
    (default: any record format, the tokenizer's chat template);
    ``on_bad_record``: ``BadRecords``.
    """

    def __init__(self, path: str, tokenizer, *, text_field: str = "text", seed: int = 0,
                 min_len: int = 2, encoder: RecordEncoder | None = None, records=None,
                 on_bad_record: str = "error"):
        on_bad = BadRecords(on_bad_record)
        self.path, self.seed = path, seed
        self.ids: list[np.ndarray] = []
        self.mask: list[np.ndarray] = []
        self.where: list[str] = []
        """``file:line`` (JSONL) or ``file row N`` (HF datasets) of each record."""
        self.bad = on_bad.messages
        encode = encoder or RecordEncoder(RecordReader(columns=Columns(text_field=text_field)), tokenizer)
        for where, record in (jsonl_records(path, on_bad.skip) if records is None else records):
            try:
                ids, mask = encode_record(encode, where, record, min_len)
            except DataError as e:
                on_bad(e)
                continue
            self.where.append(where)
            self.ids.append(ids)
            self.mask.append(mask)
        self._lengths = np.asarray([len(x) for x in self.ids], dtype=np.int64)
        if not self.ids:
            raise DataError(f"{path}: no records" + (f" left: {self.bad_summary()}" if self.bad else ""))

    def ids_of(self, r: int) -> np.ndarray:
        return self.ids[r]

    def mask_of(self, r: int) -> np.ndarray:
        return self.mask[r]

    def where_of(self, r: int) -> str:
        return self.where[r]
