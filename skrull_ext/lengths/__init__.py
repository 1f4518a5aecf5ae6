"""Real per-sample sequence lengths shipped with the package (see README.md here).

One integer per line, dataset order. Used by the benchmark, the simulator,
the embedded default training job and the tests. ``load`` also takes the
path of any file in that format (``dataloader.lengths``, ``bench simulate
--lengths``); a file that is not in it (a ``.npy`` array, binary bytes, a
word, a length below 1 or above the core's ``MAX_LENGTH``) is a DataError naming ``file:line``.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from skrull_ext._core import MAX_LENGTH
from skrull_ext.errors import DataError

_DIR = Path(__file__).parent
_SUFFIX = ".lengths.txt"


def names() -> list[str]:
    """Names of the shipped length files (without the suffix)."""
    return sorted(p.name[: -len(_SUFFIX)] for p in _DIR.glob(f"*{_SUFFIX}"))


NPY_MAGIC = b"\x93NUMPY"


def _path(name: str) -> Path | None:
    shipped = _DIR / f"{name}{_SUFFIX}"
    return shipped if shipped.is_file() else Path(name) if Path(name).is_file() else None


@cache
def _load(path: Path) -> tuple[int, ...]:
    with path.open("rb") as f:
        if f.read(len(NPY_MAGIC)) == NPY_MAGIC:
            raise DataError(f"{path}: a NumPy .npy file; a lengths file is text, one integer per line "
                            "(np.savetxt(path, lengths, fmt='%d') writes one)")
        f.seek(0)
        out = [v for v in (_length(path, i, raw) for i, raw in enumerate(f, 1)) if v is not None]
    if not out:
        raise DataError(f"{path}: no lengths in it (one positive integer per line)")
    return tuple(out)


def _length(path: Path, i: int, raw: bytes) -> int | None:
    """Line ``i`` of ``path`` as a length (None when blank); DataError naming it otherwise."""
    try:
        line = raw.decode("utf-8").strip()
    except UnicodeDecodeError as e:
        raise DataError(f"{path}:{i}: not text (byte 0x{raw[e.start]:02x} at column {e.start + 1}); "
                        "a lengths file holds one positive integer per line") from None
    if i == 1:  # a UTF-8 byte order mark (Windows editors write one)
        line = line.removeprefix("\ufeff")
    if not line:
        return None
    try:
        v = int(line)
    except ValueError:
        raise DataError(f"{path}:{i}: {line[:40]!r} is not an integer length") from None
    if v < 1:
        raise DataError(f"{path}:{i}: length {v} is not positive")
    if v > MAX_LENGTH:  # past int64 it was an OverflowError traceback on every rank
        raise DataError(f"{path}:{i}: length {v} is above the longest sequence the scheduler takes ({MAX_LENGTH:,})")
    return v


def load(name: str, key: str = "lengths") -> list[int]:
    """All lengths of one shipped file (by name) or of a file path, in order.

    ``key`` (the flag or config key that named the file) prefixes an error
    about the name; an error inside the file names ``file:line``. Both are
    DataError: one line, no traceback, from the command lines."""
    path = _path(name)
    if path is None:
        raise DataError(f"{key}: {name!r} is neither a shipped length file {names()} nor an existing file")
    return list(_load(path))
