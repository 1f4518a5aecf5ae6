"""``--config-file JOB --help``: every key this job can set, from the parser's own list.

The flags are read by ``job_flags`` into the tables ``job_file.apply_tables``
applies, which accept a section's settable fields only (``job_file.settable_fields``:
``init`` fields not named ``_x``), the ``kind`` switches of ``SECTION_KINDS``
and ``--model.KEY``; job_file hands these to ``job_help``. This listing walks the same fields of the job's config,
so the help cannot offer a flag the parser refuses: tyro's listing showed
internal fields (``--skrull.policy-spec.*``, a ``skrull._profile``
subcommand) that the parser then refused as unknown, in 911 lines. Each key
shows its value for this job (the file's, its flags', or the default) and the
first sentence of its docstring, as tyro would read it.
"""

from __future__ import annotations

import dataclasses
import textwrap
from typing import Any

from tyro._docstrings import get_field_docstring

__all__ = ["job_help"]

WIDTH = 100


def _first_sentence(text: str | None) -> str:
    """The docstring's first sentence (to its first '. ' or blank line), on one line."""
    if not text:
        return ""
    head = " ".join(text.split("\n\n", 1)[0].split())
    cut = head.find(". ")
    return head if cut < 0 else head[: cut + 1]


def _shown(value: Any) -> str:
    """A value as a job file would spell it, shortened to one line."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        text = repr(value)
    elif isinstance(value, (list, tuple)) and value and dataclasses.is_dataclass(value[0]):
        text = f"[{len(value)} table(s)]"
    else:
        text = repr(value)
    return text if len(text) <= 48 else text[:45] + "..."


def _lines(key: str, value: Any, cls: type, name: str) -> list[str]:
    """One key: its flag (both forms for a bool), its value here, its docstring's first sentence."""
    section = key.rsplit(".", 1)[0] + "." if "." in key else ""
    flag = f"--{key} / --{section}no-{name}" if isinstance(value, bool) else f"--{key}"
    about = _first_sentence(get_field_docstring(cls, name, ()))
    wrapped = textwrap.wrap(about, WIDTH, initial_indent="      ", subsequent_indent="      ") if about else []
    return [f"  {flag}  ({_shown(value)})", *wrapped]


def _section(key: str, obj: Any, kinds: dict[str, Any] | None, settable) -> list[str]:
    out = [f"[{key}]"]
    if kinds is not None:
        current = next((k for k, c in kinds.items() if c is not None and type(obj) is c), "none")
        out.append(f"  --{key}.kind {{{'|'.join(kinds)}}}  ({current!r})")
    if obj is None:  # off; a kind turns it on, with that class's keys
        for kind, cls in (kinds or {}).items():
            if cls is not None:
                out += [f"  with kind {kind!r}:", *_section(key, cls(), None, settable)[1:]]
        return out
    nested = []
    for name in settable(type(obj)):
        value = getattr(obj, name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            nested.append((f"{key}.{name}", value))
            continue
        out += _lines(f"{key}.{name}", value, type(obj), name)
    for sub, value in nested:
        out += ["", *_section(sub, value, None, settable)]
    return out


def job_help(config: Any, job: str, *, sections: set[str], scalars: set[str], kinds: dict[str, dict[str, Any]],
             model_keys: tuple[str, ...], settable, module: str) -> str:
    """The listing ``--help`` prints for ``config``, the job ``job`` with its flags applied, under
    ``python -m module`` (the entry point's own name).
    The parser's own facts come from job_file: its root ``sections`` and ``scalars``, the
    ``kinds`` switches, the ``[model]`` keys and ``settable`` (a class's settable fields)."""
    out = [
        f"usage: python -m {module} --config-file {job} [--SECTION.KEY VALUE ...] [--traceback]",
        "",
        "Every key this job can set, as a flag (--SECTION.KEY VALUE; a bool: --SECTION.KEY or",
        "--SECTION.no-KEY) or in the file ([SECTION] KEY = VALUE), with its value for this job in",
        "parentheses. docs/training.md says more; a bad key or value fails naming it.",
        "",
        "[model] (read from the job file; --model.KEY VALUE replaces one)",
        "  " + ", ".join(f"--model.{k}" for k in model_keys),
        "",
        "[job] (no section name in the flag)",
    ]
    for name in sorted(scalars):
        out += _lines(name, getattr(config, name), type(config), name)
    for name in sorted(sections):
        out += ["", *_section(name, getattr(config, name), kinds.get(name), settable)]
    return "\n".join(out) + "\n"
