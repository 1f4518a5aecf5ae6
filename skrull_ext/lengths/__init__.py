"""Real per-sample sequence lengths shipped with the package (see README.md here).

One integer per line, dataset order. Used by the benchmark, the simulator,
the embedded default training job and the tests. ``load`` also takes the
path of any file in that format.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

_DIR = Path(__file__).parent
_SUFFIX = ".lengths.txt"


def names() -> list[str]:
    """Names of the shipped length files (without the suffix)."""
    return sorted(p.name[: -len(_SUFFIX)] for p in _DIR.glob(f"*{_SUFFIX}"))


@cache
def _load(name: str) -> tuple[int, ...]:
    path = _DIR / f"{name}{_SUFFIX}"
    if not path.is_file():
        path = Path(name)
    if not path.is_file():
        raise ValueError(f"unknown length file {name!r}: neither a shipped one {names()} nor an existing file")
    out = []
    with path.open() as f:
        for i, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                v = int(line)
            except ValueError:
                raise ValueError(f"{path}:{i}: {line!r} is not an integer length") from None
            if v < 1:
                raise ValueError(f"{path}:{i}: length {v} is not positive")
            out.append(v)
    if not out:
        raise ValueError(f"{path}: no lengths in it")
    return tuple(out)


def load(name: str) -> list[int]:
    """All lengths of one shipped file (by name) or of a file path, in order."""
    return list(_load(name))
