"""Checks of a data source's keys, at config time, before anything is read.

A dataloader config (``[dataloader]``, or the held-out ``[validation]``
source) is checked here for what its own ``__post_init__`` cannot see: files
that must exist, and keys that depend on one another. The job checks
(skrull_ext/train/job/job_checks.py) run it for the whole job; the prepare
command (``python -m skrull_ext.prepare``) runs it alone, ahead of any
launch. It lives in the data room so both can use it without the data code
importing the trainer's.
"""

from __future__ import annotations

import math
import os

from skrull_ext.errors import JobFileError

__all__ = ["check_data"]


def _bad(key: str, value, why: str) -> JobFileError:
    return JobFileError(f"{key} = {value!r}: {why}")


def _check_text_path(key: str, path: str) -> None:
    from skrull_ext import assets

    try:
        assets.text_path(path)
    except ValueError as e:
        raise _bad(key, path, str(e).split(" is ", 1)[-1]) from None


def check_data(d, key: str = "dataloader") -> None:
    """Raise ``JobFileError`` naming the first bad key of dataloader config ``d``.

    ``key``: the section its keys are named under (``validation`` for the
    held-out set). Any dataloader kind is taken; keys it lacks are skipped.
    """
    if hasattr(d, "min_len"):
        if d.min_len < 1:
            raise _bad(f"{key}.min_len", d.min_len, "must be >= 1")
        if d.max_len is not None and d.max_len < d.min_len:
            raise _bad(f"{key}.max_len", d.max_len, f"must be >= {key}.min_len ({d.min_len})")
    if getattr(d, "seed", 0) < 0:  # numpy's own words named no key ("expected non-negative integer")
        raise _bad(f"{key}.seed", d.seed, "must be >= 0 (it seeds the sample order and the synthetic tokens)")
    if getattr(d, "length_scale", 1.0) <= 0 or not math.isfinite(getattr(d, "length_scale", 1.0)):
        raise _bad(f"{key}.length_scale", d.length_scale, "must be a finite number > 0")
    if getattr(d, "vocab_size", None) is not None and d.vocab_size < 2:
        raise _bad(f"{key}.vocab_size", d.vocab_size, "must be >= 2 (ids are drawn from [1, vocab_size))")
    if getattr(d, "dataset", None) == "jsonl":
        _check_text_path(f"{key}.dataset_path", d.dataset_path)
    if getattr(d, "dataset", None) == "hf" and not os.path.exists(d.dataset_path):
        raise _bad(f"{key}.dataset_path", d.dataset_path, "is not a local file or folder (json/jsonl/parquet/arrow "
                                                           "files or a save_to_disk folder; docs/data.md)")
    for i, s in enumerate(getattr(d, "sources", None) or ()):  # a mixture's sources ([[dataloader.sources]])
        if s.dataset == "jsonl":
            _check_text_path(f"{key}.sources[{i}].path", s.path)
        elif not os.path.exists(s.path):
            raise _bad(f"{key}.sources[{i}].path", s.path, "is not a local file or folder (json/jsonl/parquet/arrow "
                                                           "files or a save_to_disk folder; docs/data.md)")
    if getattr(d, "lengths", None):  # read now: a bad file fails before the model is built, not after
        from skrull_ext import lengths

        lengths.load(d.lengths, f"{key}.lengths")
    template = getattr(d, "chat_template", "")
    if template and template != "chatml" and not os.path.isfile(template):
        raise _bad(f"{key}.chat_template", template, "is neither 'chatml' nor an existing .jinja file")
