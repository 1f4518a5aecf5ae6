"""Small files shipped with the package so the real-text path runs with no
download: a JSONL fixture of short texts and chats written for this project
(``text/``) and a tiny byte-level BPE tokenizer trained on it
(``tokenizers/``, rebuilt by tools/build_tiny_tokenizer.py).

Job files name them by their short name; any existing path works too.
"""

from pathlib import Path

_DIR = Path(__file__).parent


def _resolve(name: str, folder: str, suffix: str, what: str) -> str:
    path = Path(name)
    if path.exists():
        return str(path)
    shipped = _DIR / folder / f"{name}{suffix}"
    if shipped.exists():
        return str(shipped)
    names = sorted(p.name.removesuffix(suffix) for p in (_DIR / folder).iterdir() if p.name.endswith(suffix))
    raise ValueError(f"{what} {name!r} is neither an existing path nor a shipped one {names}")


def text_path(name: str) -> str:
    """A JSONL file: an existing path, or a shipped name such as 'tiny_sft'."""
    return _resolve(name, "text", ".jsonl", "text data")


def tokenizer_path(name: str) -> str:
    """A tokenizer folder: an existing path, or a shipped name such as 'tiny_bpe'."""
    return _resolve(name, "tokenizers", "", "tokenizer")
