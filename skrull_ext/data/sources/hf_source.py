"""Rows of local data through HF ``datasets`` (``[dataloader] dataset = "hf"``).

``dataset_path`` names one of:

- a file: ``.jsonl`` / ``.json``, ``.parquet`` or ``.arrow``;
- a folder written by ``Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``
  (read with ``load_from_disk``; ``split`` picks the DatasetDict's split);
- any other folder of such files: ``data_files`` globs (relative to it)
  choose them, else ``datasets``' own split naming does (``train*.parquet``,
  ``data/test-00000-of-00002.parquet``, ...; a folder without split names
  is all ``train``), and ``split`` picks one.

Files are read one at a time, in sorted order, so a bad row is named by its
file and its 0-based row in that file. Bad bytes are named as the JSONL
source names them: a json file is checked for UTF-8 line by line before
``datasets`` parses it (``FILE:LINE``, 1-based), a string column of a
parquet/arrow file that is not UTF-8 is named by its row and column. An
empty file (0 bytes, or a json file of blank lines) is an error naming it:
it is usually a failed download or copy, not a shard meant to hold nothing.
Rows then go through the same
``RecordEncoder`` as JSONL lines (skrull_ext/data/sources/records.py): a
parquet file and a JSONL file of the same records give the same samples.
Hub names are not fetched: download the files first.
"""

import glob
import os

from skrull_ext.data.sources.json_array import array_error, is_json_array
from skrull_ext.data.sources.text import jsonl_records
from skrull_ext.errors import DataError

BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".arrow": "arrow"}
"""File extension -> the ``datasets`` packaged builder that reads it."""

BUILDER_OPTIONS = {"json": {"on_mixed_types": None}}
"""json: rows may differ in keys (texts beside chats); datasets 4.7's default
mixed-type probe raises KeyError on such files, and its fallback would turn
a column of mixed types into JSON strings. Off: missing keys read as null,
and a column of mixed types fails naming the file."""


def _check_json_bytes(path: str) -> None:
    """DataError naming ``path:line`` of the first line that is not UTF-8, or the
    file when it holds no line but blanks. ``datasets`` reports either far from
    the bytes (a pyarrow error deep in its builder, or at the first row read)."""
    blank = True
    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, 1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{path}:{line_no}: not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1}); "
                                "json files must be UTF-8") from None
            blank = blank and not text.strip()
    if blank:
        raise DataError(f"{path}: empty (no rows); remove it, or name the other files with dataloader.data_files")


def _bad_json_line(path: str) -> DataError | None:
    """``path:line: not valid JSON`` for the first line of a JSON Lines file that does not parse,
    as the JSONL source names it (``jsonl_records``; pyarrow says "in row N", counted from 0 and
    without the file's line); None when the file is not JSON Lines (its first line is not a record
    by itself, as in a pretty-printed object) or every line parses. Read only after ``datasets``
    failed."""
    for k, (_, record) in enumerate(jsonl_records(path, skip_bad=True)):
        if isinstance(record, DataError):
            return None if k == 0 else record
    return None


def _first_line(e: BaseException) -> str:
    return next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)


def _load(datasets, path: str):
    """One file as a ``datasets.Dataset``; DataError naming it when it cannot be read."""
    builder = _builder(path)
    if os.path.getsize(path) == 0:
        raise DataError(f"{path}: empty (0 bytes); remove it, or name the other files with dataloader.data_files")
    if builder == "json":
        _check_json_bytes(path)
    try:
        return datasets.load_dataset(builder, data_files=[path], split="train", **BUILDER_OPTIONS.get(builder, {}))
    except Exception as e:  # datasets raises many types for an unreadable file
        if builder == "json" and is_json_array(path):  # a cut tail or bad record, named by its byte and record
            raise array_error(path, "datasets") from e
        if builder == "json" and (bad := _bad_json_line(path)) is not None:  # a cut or broken line, by its line
            raise bad from e
        chain = [e]
        while chain[-1].__cause__ is not None or chain[-1].__context__ is not None:
            chain.append(chain[-1].__cause__ or chain[-1].__context__)
        # pyarrow's message names the column and row; datasets wraps it (and a pandas retry) around it
        root = next((x for x in chain if type(x).__module__.startswith("pyarrow")), chain[-1])
        raise DataError(f"{path}: datasets cannot read it: {type(root).__name__}: {_first_line(root)}") from e


def _bad_row(ds, start: int, where: str) -> DataError:
    """The error of the first row from ``start`` whose strings are not UTF-8.

    ``datasets`` decodes rows a batch at a time, so the row that failed is
    found again one row and one column at a time, still as Arrow data."""
    table = ds.with_format("arrow")
    for i in range(start, len(ds)):
        row = table[i:i + 1]
        for name in row.column_names:
            try:
                row.column(name).to_pylist()
            except UnicodeDecodeError as e:
                return DataError(f"{where} row {i}: column {name!r} is not UTF-8 ({e.reason} at byte {e.start})")
    return DataError(f"{where} row {start}: cannot be read as Python values")


def _is_saved(folder: str) -> bool:
    return any(os.path.isfile(os.path.join(folder, f)) for f in ("dataset_dict.json", "state.json"))


def _builder(path: str) -> str:
    ext = os.path.splitext(path)[1].lower()
    if ext not in BUILDERS:
        raise DataError(f"{path}: unsupported file type {ext or '(none)'!r}; dataset = 'hf' reads {sorted(BUILDERS)}")
    return BUILDERS[ext]


def data_files(path: str, split: str = "train", patterns: list[str] | tuple = ()) -> list[str]:
    """The files of ``split`` under ``path`` (a file or a folder), sorted."""
    if os.path.isfile(path):
        if patterns:
            raise DataError(f"dataloader.data_files: {list(patterns)} needs dataloader.dataset_path to be a "
                            f"folder, {path!r} is a file")
        return [path]
    if not os.path.isdir(path):
        raise DataError(f"dataloader.dataset_path: {path!r} is not a local file or folder "
                        "(dataset = 'hf' reads local files; download hub datasets first)")
    if patterns:
        files = []
        for pattern in patterns:
            found = sorted(f for f in glob.glob(os.path.join(path, pattern), recursive=True) if os.path.isfile(f))
            if not found:
                raise DataError(f"dataloader.data_files: {pattern!r} matches no file under {path}")
            files += found
        return list(dict.fromkeys(files))
    from datasets.data_files import DataFilesDict, get_data_patterns

    try:
        by_split = DataFilesDict.from_patterns(get_data_patterns(path), base_path=path,
                                               allowed_extensions=list(BUILDERS))
    except FileNotFoundError:
        by_split = {}
    found = {str(k): sorted(v) for k, v in by_split.items() if v}
    if split not in found:
        raise DataError(f"dataloader.split: {split!r} has no {sorted(BUILDERS)} files under {path} "
                        f"(splits there: {sorted(found)}); dataloader.data_files names them")
    return found[split]


def hf_rows(path: str, split: str = "train", patterns: list[str] | tuple = ()):
    """(where, row) of every row, file by file; where is ``FILE row N`` (0-based)."""
    import datasets

    datasets.disable_progress_bars()  # one bar per shard file would flood the training log
    if os.path.isdir(path) and _is_saved(path):
        if patterns:
            raise DataError(f"dataloader.data_files: a save_to_disk folder ({path}) takes none")
        ds = datasets.load_from_disk(path)
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise DataError(f"dataloader.split: {split!r} is not in {path} (splits: {sorted(ds)})")
            ds = ds[split]
        yield from _rows(ds, path)
        return
    files = data_files(path, split, patterns)
    builders = {_builder(f) for f in files}
    if len(builders) > 1:
        raise DataError(f"{path}: mixed file types {sorted(builders)} in one split; name one with dataloader.data_files")
    for f in files:
        yield from _rows(_load(datasets, f), f)


def _rows(ds, where: str):
    """(``where row N``, row) of every row of ``ds``; a row whose bytes are not
    UTF-8 raises DataError naming it instead of a pyarrow traceback."""
    i = 0
    try:
        for row in ds:
            yield f"{where} row {i}", row
            i += 1
    except UnicodeDecodeError:
        raise _bad_row(ds, i, where) from None
