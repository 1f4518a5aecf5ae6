"""Record formats: one data row -> a plain text or a list of chat turns.

SFT corpora come in a few shapes. Each is a ``Format`` in the ``FORMATS``
registry: the columns it needs and a normaliser turning a row into either a
string (plain text, trained on whole) or a list of ``{"role", "content"}``
turns with roles system / user / assistant (loss on the assistant's turns).
The chat template (skrull_ext/data/sources/chat_template.py) only ever sees
that normal form.

    messages        {"messages": [{"role": "user", "content": ...}, ...]}   (OpenAI)
    sharegpt        {"conversations": [{"from": "human", "value": ...}, ...]}
    prompt_response {"prompt": ..., "response": ..., "system"?: ...}
    alpaca          {"instruction": ..., "input"?: ..., "output": ..., "system"?: ...}
    text            {"text": ...}                      (column: dataloader.text_field)

``[dataloader] format = "auto"`` takes, per row, the first format in this
order whose required columns the row has (a null counts as absent, as in a
parquet row that lacks a key); a named format reads every row that way.
A row that fits several formats is read as the first: a chat beside a
``text`` column (many HF SFT sets ship the chat pre-rendered as ``text``)
trains on the chat, with the loss on the assistant's turns, and ignores
the text. That is what an SFT user expects, so it is not refused, but it is
logged once per process with the first such row's file:line and the ignored
columns (``format = "text"`` trains on the text instead).
``[dataloader] columns`` renames the canonical column and key names above
(``columns = { prompt = "question", response = "answer" }``). Rows that fit
no format, or hold an unknown role or an empty assistant turn, raise
``DataError`` naming the file and row. Full reference: docs/data.md.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from torchtitan.tools.logging import logger

from skrull_ext.errors import DataError

ROLES = ("system", "user", "assistant")

SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user",
                  "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant", "model": "assistant"}
"""ShareGPT ``from`` values and the roles they mean (the usual spellings in public ShareGPT dumps)."""

COLUMN_NAMES = ("messages", "role", "content", "conversations", "from", "value",
                "prompt", "response", "instruction", "input", "output", "system")
"""Canonical names ``dataloader.columns`` may rename (the text column is ``dataloader.text_field``)."""

Normal = str | list[dict]
"""A normalised record: plain text, or turns ``[{"role", "content"}, ...]``."""


@dataclass(frozen=True)
class Format:
    """A record format: the canonical columns it needs and its normaliser."""

    needs: tuple[str, ...]
    normalise: Callable[[Mapping, "Columns", str], Normal]
    """``(row, columns, where) -> Normal``; raises DataError naming ``where``."""


class Columns:
    """Canonical column name -> the dataset's name (identity unless mapped)."""

    def __init__(self, mapping: Mapping[str, str] | None = None, text_field: str = "text"):
        mapping = dict(mapping or {})
        unknown = sorted(set(mapping) - set(COLUMN_NAMES))
        if unknown:
            raise ValueError(f"dataloader.columns: unknown name(s) {unknown}; known: {list(COLUMN_NAMES)} "
                             "(the text column is dataloader.text_field)")
        for key, value in mapping.items():
            if not isinstance(value, str) or not value:
                raise ValueError(f"dataloader.columns.{key}: {value!r} must be a non-empty column name")
        self._map = {name: mapping.get(name, name) for name in COLUMN_NAMES} | {"text": text_field}

    def __getitem__(self, name: str) -> str:
        return self._map[name]

    def get(self, row: Mapping, name: str):
        """The row's value of canonical column ``name`` (None when absent)."""
        return row.get(self._map[name])


def _string(value, where: str, what: str, *, allow_empty: bool = True) -> str:
    if not isinstance(value, str):
        raise DataError(f"{where}: {what} must be a string, got {type(value).__name__}")
    if not allow_empty and not value.strip():
        raise DataError(f"{where}: {what} is empty (nothing to train on)")
    return value


def _turns(row: Mapping, cols: Columns, where: str, list_col: str, role_key: str, content_key: str,
           role_of: Callable[[object], str | None]) -> list[dict]:
    items = cols.get(row, list_col)
    name = cols[list_col]
    if not isinstance(items, list) or not items:
        raise DataError(f"{where}: {name!r} must be a non-empty list of turns")
    out = []
    for k, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise DataError(f"{where}: {name}[{k}] must be an object with {role_key!r} and {content_key!r}")
        role = role_of(item.get(role_key))
        if role is None:
            raise DataError(f"{where}: {name}[{k}] has unknown role {item.get(role_key)!r} "
                            f"(key {role_key!r}); allowed: {sorted(_allowed_roles(role_of))}")
        out.append({"role": role, "content": _string(item.get(content_key), where, f"{name}[{k}].{content_key}")})
    return out


def _allowed_roles(role_of) -> set[str]:
    return set(SHAREGPT_ROLES) if role_of is _sharegpt_role else set(ROLES)


def _openai_role(value) -> str | None:
    return value if value in ROLES else None


def _sharegpt_role(value) -> str | None:
    return SHAREGPT_ROLES.get(value) if isinstance(value, str) else None


def _messages(row, cols: Columns, where: str) -> list[dict]:
    return _turns(row, cols, where, "messages", cols["role"], cols["content"], _openai_role)


def _sharegpt(row, cols: Columns, where: str) -> list[dict]:
    return _turns(row, cols, where, "conversations", cols["from"], cols["value"], _sharegpt_role)


def _with_system(row, cols: Columns, where: str, turns: list[dict]) -> list[dict]:
    system = cols.get(row, "system")
    if system is None or system == "":
        return turns
    return [{"role": "system", "content": _string(system, where, f"{cols['system']!r}")}] + turns


def _prompt_response(row, cols: Columns, where: str) -> list[dict]:
    prompt = _string(cols.get(row, "prompt"), where, f"{cols['prompt']!r}")
    response = _string(cols.get(row, "response"), where, f"{cols['response']!r}")
    return _with_system(row, cols, where, [{"role": "user", "content": prompt},
                                           {"role": "assistant", "content": response}])


def _alpaca(row, cols: Columns, where: str) -> list[dict]:
    """Alpaca's convention: the input, when there is one, follows the instruction after a blank line."""
    instruction = _string(cols.get(row, "instruction"), where, f"{cols['instruction']!r}")
    extra = cols.get(row, "input")
    if extra not in (None, ""):
        instruction = f"{instruction}\n\n{_string(extra, where, repr(cols['input']))}"
    output = _string(cols.get(row, "output"), where, f"{cols['output']!r}")
    return _with_system(row, cols, where, [{"role": "user", "content": instruction},
                                           {"role": "assistant", "content": output}])


def _text(row, cols: Columns, where: str) -> str:
    return _string(cols.get(row, "text"), where, f"{cols['text']!r}")


FORMATS: dict[str, Format] = {
    "messages": Format(("messages",), _messages),
    "sharegpt": Format(("conversations",), _sharegpt),
    "prompt_response": Format(("prompt", "response"), _prompt_response),
    "alpaca": Format(("instruction", "output"), _alpaca),
    "text": Format(("text",), _text),
}
"""Record formats by ``dataloader.format``; ``auto`` tries them in this order."""


def _check_chat(turns: list[dict], where: str) -> list[dict]:
    if not any(t["role"] == "assistant" for t in turns):
        raise DataError(f"{where}: a chat needs at least one assistant message (nothing to train on)")
    for k, t in enumerate(turns):
        if t["role"] == "assistant" and not t["content"].strip():
            raise DataError(f"{where}: message {k} (assistant) is empty (nothing to train on)")
    return turns


_SAID: set[tuple[str, ...]] = set()
"""Sets of formats one row fitted that were already logged (RecordReader._say_ignored)."""


@dataclass(frozen=True)
class RecordReader:
    """Reads rows in one format (or ``auto``) into ``Normal`` records."""

    format: str = "auto"
    columns: Columns = Columns()
    system_prompt: str | None = None
    """Prepended as a system turn to chats that have none (a job's default)."""

    def __post_init__(self):
        if self.format != "auto" and self.format not in FORMATS:
            raise ValueError(f"dataloader.format: {self.format!r} is not one of {['auto', *FORMATS]}")

    def _pick(self, row: Mapping, where: str) -> Format:
        if self.format != "auto":
            fmt = FORMATS[self.format]
            missing = [self.columns[c] for c in fmt.needs if self.columns.get(row, c) is None]
            if missing:
                raise DataError(f"{where}: dataloader.format {self.format!r} needs column(s) {missing}, "
                                f"the row has {sorted(k for k, v in row.items() if v is not None)}")
            return fmt
        fits = [name for name, fmt in FORMATS.items() if all(self.columns.get(row, c) is not None for c in fmt.needs)]
        if fits:
            if len(fits) > 1:
                self._say_ignored(fits, where)
            return FORMATS[fits[0]]
        wanted = " | ".join("+".join(repr(self.columns[c]) for c in f.needs) for f in FORMATS.values())
        raise DataError(f"{where}: no recognised columns (the row has "
                        f"{sorted(k for k, v in row.items() if v is not None)}); expected {wanted} "
                        "(dataloader.columns renames them)")

    def _say_ignored(self, fits: list[str], where: str) -> None:
        """Log, once per process and set of formats, that a row fitting several is read as the first."""
        if tuple(fits) in _SAID:
            return
        _SAID.add(tuple(fits))
        used = set(FORMATS[fits[0]].needs)
        ignored = sorted({self.columns[c] for f in fits[1:] for c in FORMATS[f].needs if c not in used})
        logger.warning(f"{where}: the row fits dataloader.format {fits[0]!r} and {fits[1:]}; format = 'auto' reads "
                       f"it, and every such row, as {fits[0]!r} and ignores column(s) {ignored} (logged once; "
                       f"dataloader.format = {fits[1]!r} reads them that way instead)")

    def __call__(self, row, where: str) -> Normal:
        if not isinstance(row, Mapping):
            raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
        out = self._pick(row, where).normalise(row, self.columns, where)
        if isinstance(out, str):
            return out
        if self.system_prompt and not any(t["role"] == "system" for t in out):
            out = [{"role": "system", "content": self.system_prompt}] + out
        return _check_chat(out, where)
