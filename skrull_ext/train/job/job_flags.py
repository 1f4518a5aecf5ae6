"""Command-line flags, read as a job file's keys are.

``--section.key VALUE`` sets what ``[section] key = VALUE`` sets in a job
file, through the same code (``job_file.apply_tables``): the same ``kind``
switch (``--activation_checkpoint.kind full`` turns checkpointing on, ``none``
off), the same type checks and the same messages. Only the value's text is
read differently: by the annotation of the field it lands in (``Flag``), since
a command line has no TOML types. Before this, flags went through tyro, which
cannot build a parser for a section whose class a ``kind`` chooses (every
``--activation_checkpoint.*`` flag, and any ``--x.flag false``, failed with
"Could not create CLI parser"), and whose errors could only be read back out
of its printed box. This is the one flag parser, kept over tyro for those
reasons; ``--help`` is printed from the same fields it accepts (job_help.py),
so the help never offers a flag this parser refuses.

Forms: ``--a.b VALUE``, ``--a.b=VALUE``, ``--a.b V1 V2`` or ``--a.b V1,V2``
for a list, ``--a.b K1 V1 K2 V2`` for a table of values, a bare ``--a.flag`` for true and ``--a.no-flag`` (or
``--a.no_flag``) for false; ``-`` and ``_`` are the same in names. A name
without a dot sets a root field (``--dump-folder DIR``, a job file's
``[job]``; ``--job.dump_folder DIR``, as the file spells it, works too).
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any

from skrull_ext.errors import JobFileError

__all__ = ["Flag", "FlagText", "flag_tables"]

_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")
_NONE = ("none", "null")


class FlagText(str):
    """A flag's words that fit no member of a union, handed to the coercion to name: typed on a
    command line, so never "a quoted number" of a TOML file."""


@dataclasses.dataclass(frozen=True)
class Flag:
    """A flag's value as typed: its words, read once the field's type is known."""

    flag: str
    words: tuple[str, ...]

    def read(self, tp: Any, key: str) -> Any:
        """The value as the TOML value ``key = ...`` of type ``tp`` would be."""
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin is typing.Annotated:
            return self.read(args[0], key)
        if origin in (list, tuple):
            words = self.words
            if len(words) == 1 and "," in words[0]:
                words = tuple(w for w in words[0].split(",") if w)
            item = args[0] if args and (origin is list or args[-1] is Ellipsis or len(args) == 1) else Any
            if origin is tuple and args and args[-1] is not Ellipsis:
                if len(words) != len(args):
                    raise JobFileError(f"{self.flag}: expected {len(args)} values, got {len(words)}")
                return [Flag(self.flag, (w,)).read(t, f"{key}[{i}]") for i, (w, t) in enumerate(zip(words, args))]
            return [Flag(self.flag, (w,)).read(item, f"{key}[{i}]") for i, w in enumerate(words)]
        if origin is dict:  # KEY VALUE pairs, as tyro took them
            if len(self.words) % 2:
                raise JobFileError(f"{self.flag}: expected KEY VALUE pairs, got {len(self.words)} words")
            value_tp = args[1] if len(args) == 2 else Any
            pairs = zip(self.words[::2], self.words[1::2])
            return {k: Flag(self.flag, (v,)).read(value_tp, f"{key}.{k}") for k, v in pairs}
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            raise JobFileError(f"{self.flag}: {key} is a table; set it in the job file or set its keys as --{key}.KEY")
        if origin in (typing.Union, types.UnionType):
            if type(None) in args and len(self.words) == 1 and self.words[0].lower() in _NONE:
                return None
            if not self.words and bool not in args:  # a bare flag, as below (not a union's "got ''")
                raise JobFileError(f"{self.flag}: needs a value ({key} is not a true/false key)")
            for member in (m for m in args if m is not type(None)):  # the first reading that fits
                try:
                    return self.read(member, key)
                except JobFileError:
                    continue
            return FlagText(" ".join(self.words))  # let the coercion name what each member allows
        if not self.words:  # a bare flag
            if tp is bool:
                return True
            raise JobFileError(f"{self.flag}: needs a value ({key} is not a true/false key)")
        if len(self.words) != 1:
            raise JobFileError(f"{self.flag}: expected one value, got {len(self.words)} ({' '.join(self.words)})")
        text = self.words[0]
        if origin is typing.Literal:
            return next((a for a in args if str(a) == text), text)
        if tp is bool:
            if text.lower() in _TRUE + _FALSE:
                return text.lower() in _TRUE
            raise JobFileError(f"{key}: expected true or false, got {text!r}")
        if tp is int:
            try:
                return int(text)
            except ValueError:
                raise JobFileError(f"{key}: expected an integer, got {text!r}") from None
        if tp is float:
            try:
                return float(text)
            except ValueError:
                raise JobFileError(f"{key}: expected a number, got {text!r}") from None
        return text


def _split(args: list[str], kinds: dict[str, dict[str, Any]]) -> list[tuple[str, str, tuple[str, ...]]]:
    """``(flag as given, dotted name, words)`` per flag, in order."""
    out: list[list] = []
    for arg in args:
        section, colon, kind = arg.partition(":")
        if colon and section.replace("-", "_") in kinds:  # tyro's subcommand form, e.g. activation-checkpoint:full
            raise JobFileError(f"command line: {arg!r}: write --{section.replace('-', '_')}.kind {kind}")
        if arg.startswith("--"):
            name, eq, value = arg[2:].partition("=")
            out.append([f"--{name}", name.replace("-", "_"), [value] if eq else [], bool(eq)])
        elif out and not out[-1][3]:
            out[-1][2].append(arg)
        else:
            raise JobFileError(f"command line: {arg!r} is neither a --section.key flag nor a flag's value")
    return [(flag, name, tuple(words)) for flag, name, words, _ in out]


def _field_names(obj: Any) -> set[str]:
    return {f.name for f in dataclasses.fields(obj) if f.init and not f.name.startswith("_")}


def _check_name(config: Any, flag: str, parts: list[str], kinds: dict[str, dict[str, Any]]) -> bool:
    """Whether the flag names a field (False: the bare ``no_`` form of a bool);
    an unknown name fails naming the section and the closest key."""
    obj, where = config, ""
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        section = parts[i - 1] if i else ""
        if obj is None and section in kinds:  # a section a kind turns on: any of its classes' keys
            names = {"kind"} | {n for c in kinds[section].values() if c is not None for n in _field_names(c)}
        elif obj is None or not dataclasses.is_dataclass(obj):
            return True  # a dict or Any: its own coercion checks it
        else:
            names = _field_names(obj) | ({"kind"} if section in kinds else set())
        if part in names:
            obj, where = (getattr(obj, part, None) if obj is not None else None), ".".join(parts[: i + 1])
            continue
        if last and part.startswith("no_") and part[3:] in names:
            return False
        near = difflib.get_close_matches(part, names, n=1)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        raise JobFileError(f"unknown flag {flag}: {f'[{where}]' if where else 'the top level'} has no key {part!r}{hint}")
    return True


def flag_tables(config: Any, args: list[str], kinds: dict[str, dict[str, Any]]) -> tuple[dict, dict[str, list[str]]]:
    """The flags as a job file's tables (values are ``Flag``), and per section the
    flags given for it (for messages). ``kinds``: job_file.SECTION_KINDS."""
    tables: dict[str, Any] = {}
    given: dict[str, list[str]] = {}
    for flag, name, words in _split(args, kinds):
        parts = name.split(".")
        if len(parts) == 2 and parts[0] == "job" and "job" not in _field_names(config):
            parts = parts[1:]  # a job file's [job] table holds the root keys: --job.dump_folder is --dump_folder
        value: Any = Flag(flag, words)
        if not _check_name(config, flag, parts, kinds):
            if words:
                raise JobFileError(f"{flag} takes no value (it sets {'.'.join(parts[:-1] + [parts[-1][3:]])} false)")
            parts[-1], value = parts[-1][3:], Flag(flag, ("false",))
        table = tables
        for part in parts[:-1]:
            table = table.setdefault(part, {})
            if not isinstance(table, dict):
                raise JobFileError(f"{flag}: {part} is set as a value and as a section")
        table[parts[-1]] = value
        given.setdefault(parts[0], []).append(" ".join((flag, *words)))
    return tables, given
