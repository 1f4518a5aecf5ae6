"""Weighted dataset mixtures: several sources in one job, drawn in proportion.

    [dataloader]
    kind = "skrull"
    dataset = "mixture"

    [[dataloader.sources]]
    path = "chat.jsonl"               # each source: any jsonl/hf data the job could train on alone
    weight = 3

    [[dataloader.sources]]
    name = "docs"
    dataset = "hf"
    path = "long_docs.parquet"
    format = "text"
    weight = 1
    epochs = 2                         # at most 2 passes over it; afterwards the others share its draws

Each source is an ordinary ``jsonl``/``hf`` source (tokenized once into its
own token store, shuffled per epoch with ``dataloader.seed`` + its position),
read with the dataloader's options unless the source names its own ``format``
or ``split``. The mixture interleaves them by their weights with a
low-discrepancy rule: source ``s``'s ``k``-th sample sits at the point
``(k + u_s) / w_s`` on a common axis (``w_s`` its normalised weight, ``u_s``
in [0, 1) drawn from the seed), and the mixture's samples are those points in
order. After ``n`` draws each source has given ``n * w_s`` samples within
about one (no sampling noise to wait out), and mixture sample ``i`` is a pure
function of ``(seed, i)``, so a global batch is a function of its step and a
resume needs only the step, as for one source. A source with ``epochs`` stops
after that many passes over its records; the others keep their relative
weights and fill its share. When every source is spent, the step that needs
more samples fails naming the sources and ``training.steps``.

The accounting (accounting.py) counts every sample read by the source it came
from: ``read = whole + cut + skipped`` per source, in the run summary and in
TensorBoard (``skrull/source/<name>/samples_*``).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import Literal

import numpy as np

from skrull_ext.data.sources.formats import FORMATS
from skrull_ext.errors import DataError

NAME = re.compile(r"^[A-Za-z0-9_-]+$")


@dataclass(kw_only=True, slots=True)
class MixSource:
    """One ``[[dataloader.sources]]`` entry of a ``dataset = "mixture"`` job."""

    path: str = ""
    """The source's data: a JSONL file or shipped name (jsonl), or local files / a folder (hf)."""
    weight: float = 1.0
    """Its share of the draws, relative to the other sources' weights."""
    name: str = ""
    """What the accounting calls it (letters, digits, _ and -); '': the file's name without extension."""
    dataset: Literal["jsonl", "hf"] = "jsonl"
    """How its data is read (as dataloader.dataset)."""
    format: Literal[("", "auto", *FORMATS)] = ""  # pyrefly: ignore[invalid-literal]
    """Its record format (as dataloader.format); '': dataloader.format."""
    split: str = ""
    """hf: its split; '': dataloader.split."""
    epochs: float | None = None
    """At most this many passes over its records (0.5: half of them); None: as many as the run draws."""

    def display_name(self) -> str:
        if self.name:
            return self.name
        base = os.path.basename(os.path.normpath(self.path)).split(".")[0]
        return re.sub(r"[^A-Za-z0-9_-]", "_", base) or "source"


def check_sources(sources: list[MixSource], key: str = "dataloader.sources") -> None:
    """ValueError naming the first bad ``[[dataloader.sources]]`` key."""
    if not sources:
        raise ValueError(f"{key}: dataloader.dataset = 'mixture' needs at least one [[dataloader.sources]] entry")
    names = []
    for i, s in enumerate(sources):
        at = f"{key}[{i}]"
        if not s.path:
            raise ValueError(f"{at}.path: required (the source's file, shipped name or folder)")
        if not (math.isfinite(s.weight) and s.weight > 0):
            raise ValueError(f"{at}.weight = {s.weight!r}: must be a finite number > 0")
        if s.epochs is not None and not (math.isfinite(s.epochs) and s.epochs > 0):
            raise ValueError(f"{at}.epochs = {s.epochs!r}: must be a finite number > 0 (or unset: no limit)")
        if s.name and not NAME.match(s.name):
            raise ValueError(f"{at}.name = {s.name!r}: letters, digits, _ and - only (it names TensorBoard tags)")
        name = s.display_name()
        if name in names:
            raise ValueError(f"{at}.name = {name!r}: another source has this name; give each a distinct name")
        names.append(name)


class MixtureSequences:
    """The samples of several sources interleaved by weight (module docstring).

    ``children``: sources indexed like TokenizedRecords (``length``, ``__getitem__``,
    ``loss_tokens``, ``location``, ``__len__``); ``caps``: the most samples each may give
    (None: unlimited)."""

    def __init__(self, names: list[str], children: list, weights: list[float], caps: list[int | None],
                 seed: int = 0) -> None:
        self.names, self.children = list(names), list(children)
        total = float(sum(weights))
        self.weights = np.asarray([w / total for w in weights], dtype=np.float64)
        self.caps = list(caps)
        self.offsets = np.random.default_rng([seed, 0x6D1C]).random(len(children))
        self.path = ", ".join(f"{n} ({getattr(c, 'path', '?')})" for n, c in zip(names, children))
        self.bad = [m for c in children for m in getattr(c, "bad", [])]
        self._order: tuple[float, np.ndarray, np.ndarray] = (0.0, np.zeros(0, np.int32), np.zeros(0, np.int64))

    # ------------------------------------------------------------ the draw
    @property
    def capacity(self) -> int | None:
        """Samples the mixture holds when every source has ``epochs`` (else None: unlimited)."""
        return None if any(c is None for c in self.caps) else int(sum(self.caps))

    def _draws(self, horizon: float) -> tuple[np.ndarray, np.ndarray]:
        """(source, its sample index) of every point at most ``horizon``, in mixture order."""
        src, pos, idx = [], [], []
        for s, (w, u, cap) in enumerate(zip(self.weights, self.offsets, self.caps)):
            n = max(0, math.floor(horizon * w - u) + 1)
            if cap is not None:
                n = min(n, cap)
            k = np.arange(n, dtype=np.int64)
            src.append(np.full(n, s, dtype=np.int32))
            idx.append(k)
            pos.append((k + u) / w)
        src, pos, idx = np.concatenate(src), np.concatenate(pos), np.concatenate(idx)
        order = np.lexsort((src, pos))  # by point, ties by source: a prefix of any longer horizon's order
        return src[order], idx[order]

    def locate(self, index: int) -> tuple[int, int]:
        """(source, the source's sample index) of mixture sample ``index``."""
        horizon, src, idx = self._order  # read once: the prefetch thread may extend it meanwhile
        if index >= len(src):
            cap = self.capacity
            if cap is not None and index >= cap:
                raise IndexError(index)
            horizon = max(horizon, 1024.0)
            while True:
                src, idx = self._draws(horizon)
                if index < len(src):
                    break
                horizon *= 2
            self._order = (horizon, src, idx)
        return int(src[index]), int(idx[index])

    def source_name(self, index: int) -> str:
        return self.names[self.locate(index)[0]]

    def global_batch(self, step: int, size: int) -> list[int]:
        """Sample indices of the global batch of 1-based training ``step``."""
        if step < 1:
            raise ValueError("steps are 1-based")
        cap = self.capacity
        if cap is not None and step * size > cap:
            spent = ", ".join(f"{n} {c}" for n, c in zip(self.names, self.caps))
            raise DataError(f"step {step}: the mixture's sources are spent ({cap} samples: {spent}; epochs x "
                            f"records each), step {step} needs {step * size}; lower training.steps to at most "
                            f"{cap // size}, or raise or unset a source's dataloader.sources[].epochs")
        return list(range((step - 1) * size, step * size))

    # ------------------------------------------------------- the source API
    def _child(self, index: int):
        s, j = self.locate(index)
        return self.children[s], j

    def __getitem__(self, index: int):
        child, j = self._child(index)
        return child[j]

    def length(self, index: int) -> int:
        child, j = self._child(index)
        return child.length(j)

    def loss_tokens(self, index: int, n: int, length: int) -> int:
        child, j = self._child(index)
        return child.loss_tokens(j, n, length)

    def has_loss_within(self, index: int, n: int) -> bool:
        child, j = self._child(index)
        return child.has_loss_within(j, n)

    def location(self, index: int) -> str:
        child, j = self._child(index)
        return child.location(j)

    @property
    def max_length(self) -> int:
        return max(c.max_length for c in self.children)

    def bad_summary(self) -> str:
        return "; ".join(f"{n}: {c.bad_summary()}" for n, c in zip(self.names, self.children) if getattr(c, "bad", None))
