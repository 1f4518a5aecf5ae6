"""Real sequence-length distributions shipped in the repo.

A run names one by key (see ``LENGTH_FILES``) or passes a path to any file
with one integer per line. Provenance of each shipped file is in
``lengths/README.md``; nothing is downloaded.
"""

import functools
import os

import numpy as np

_HERE = os.path.join(os.path.dirname(__file__), "lengths")

LENGTH_FILES: dict[str, str] = {
    "sharegpt_qwen": "sharegpt_v3_conversations.qwen.lengths.txt",
}
"""Shipped distributions by short name."""


def resolve_lengths_path(name_or_path: str) -> str:
    """Map a short name from ``LENGTH_FILES`` or a file path to a path."""
    if name_or_path in LENGTH_FILES:
        return os.path.join(_HERE, LENGTH_FILES[name_or_path])
    if os.path.isfile(name_or_path):
        return name_or_path
    raise ValueError(
        f"lengths: {name_or_path!r} is neither a shipped distribution "
        f"({sorted(LENGTH_FILES)}) nor an existing file"
    )


@functools.lru_cache(maxsize=8)
def load_lengths(name_or_path: str) -> np.ndarray:
    """Load a length file as a read-only int64 array (cached per path)."""
    path = resolve_lengths_path(name_or_path)
    arr = np.loadtxt(path, dtype=np.int64, ndmin=1)
    if arr.size == 0 or (arr <= 0).any():
        raise ValueError(f"lengths file {path} must hold positive integers")
    arr.setflags(write=False)
    return arr
