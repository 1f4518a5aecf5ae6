"""What a loader's checkpointed state only makes sense for: the data and the seed.

A loader's state (its step, the samples read, the look-ahead windows, the
pieces it carries) is a cursor into one sequence of samples, and that
sequence is a function of ``dataloader.seed`` (the synthetic draws, each
epoch's shuffle, a mixture's interleaving) and of the data (the records,
as tokenized, and a mixture's weights and epochs). A run continued with
another seed or other data reads the same cursor in another sequence: it
trains some samples twice and others never, and nothing fails. So the state
records the data order it was written with (``DataOrder``, the loaders'
``data_order`` key) and a resume compares it with the job's
(``check``): a difference stops the job at load in one line naming the key,
the value the checkpoint was written with, the value now and the two ways on
(continue with the old value, or start a new run from its weights with
torchtitan's ``checkpoint.initial_load_path`` + ``initial_load_model_only``).

What identifies the data, and why it is cheap on a multi-GB file: per text
source (jsonl/hf, token store or not) its sample count and a hash of its
records' lengths (``record_lengths``: 8 bytes a record, already in memory; 30 ms
for 5M records, about 0.5 s for 50M, docs/data.md), never the file's bytes
(hashing 10-100 GB at every start costs about as much as tokenizing it), and
only once a checkpoint is saved or loaded. The lengths change with
any edit that adds, removes, reorders or re-sizes a record, with the
tokenizer, the chat template or the options that keep or drop records; a
record replaced by another of exactly the same token count is not seen. The
file's path is shown, not compared: the same data moved or copied is the
same sample sequence. A synthetic source is its length distribution (hashed)
and the keys that shape its draws. Not here: ``dataloader.max_len``, a limit
on the same samples (text: a cut per step, counted; synthetic: draws clipped
to it), and ``dataloader.global_batch_size`` (another size is warned, not
refused: accounting.batch_size_change).

A checkpoint written before this key existed has none: DCP loads exactly the
keys of the fresh loader's ``state_dict``, so the loader leaves the key out
when told the checkpoint lacks it (``expect_checkpoint``, the trainer reads
the checkpoint's keys first), and ``check`` warns in one line that the data
could not be checked.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import numpy as np

from skrull_ext.errors import DataError

KEY = "data_order"
"""The loaders' state key (a JSON string: the checkpoint's keys must not depend on the data)."""

VERSION = 1


@dataclass(frozen=True)
class Entry:
    """One thing the sample order depends on: the job key that sets it, its value as compared,
    and, for data, where it was read (shown in messages, not compared: module docstring)."""

    key: str
    value: str
    where: str = ""
    flag: bool = False
    """Whether ``--key value`` sets it back (a seed, a number; not a file, a mixture's share)."""

    def shown(self) -> str:
        return f"{self.where!r} ({self.value})" if self.where else self.value


@dataclass(frozen=True)
class DataOrder:
    """The entries a loader's sample order depends on, in the order a difference is named."""

    entries: tuple[Entry, ...]

    def to_json(self) -> str:
        return json.dumps({"version": VERSION, "entries": [[e.key, e.value, e.where, e.flag] for e in self.entries]})

    @classmethod
    def from_json(cls, text: str) -> DataOrder:
        blob = json.loads(text)
        return cls(tuple(Entry(*e) for e in blob["entries"]))

    def first_difference(self, other: DataOrder) -> tuple[Entry | None, Entry | None] | None:
        """(this entry, ``other``'s) of the first key whose value differs (None for a key one
        side lacks), or None when every value is the same."""
        mine, theirs = {e.key: e for e in self.entries}, {e.key: e for e in other.entries}
        for key in dict.fromkeys([*mine, *theirs]):
            a, b = mine.get(key), theirs.get(key)
            if a is None or b is None or a.value != b.value:
                return a, b
        return None


def lengths_hash(lengths) -> str:
    """16 hex digits of BLAKE2b over the lengths as little-endian int64 (no copy when they are)."""
    a = np.ascontiguousarray(np.asarray(lengths, dtype="<i8"))
    return hashlib.blake2b(a.data, digest_size=8).hexdigest()


def _records(key: str, source) -> Entry:
    return Entry(key, f"{len(source)} samples, lengths #{lengths_hash(source.record_lengths)}", str(source.path))


def data_order(config, source) -> DataOrder:
    """The data order of a loader's ``config`` over the ``source`` it built (base.DATASETS)."""
    out = [Entry("dataloader.seed", str(config.seed), flag=True), Entry("dataloader.dataset", config.dataset, flag=True)]
    if config.dataset == "mixture":
        out.append(Entry("dataloader.sources", ", ".join(source.names)))
        for k, (child, weight, cap) in enumerate(zip(source.children, source.weights, source.caps)):
            at = f"dataloader.sources[{k}]"
            out += [Entry(f"{at}.weight", f"{float(weight):.9g} of the draws"),
                    Entry(f"{at}.epochs", "no limit" if cap is None else f"at most {cap} samples"),
                    _records(f"{at}.path", child)]
    elif config.dataset == "synthetic":
        out += [Entry("dataloader.lengths", f"{len(source.lengths)} lengths #{lengths_hash(source.lengths)}",
                      str(config.lengths)),
                Entry("dataloader.length_scale", f"{source.length_scale:g}", flag=True),
                Entry("dataloader.min_len", str(source.min_len), flag=True),
                Entry("dataloader.vocab_size", str(source.vocab_size), flag=True)]
    else:
        out.append(_records("dataloader.dataset_path", source))
    return DataOrder(tuple(out))


def check(saved: str | None, now: DataOrder, step: int, path: str | None) -> str | None:
    """Raise DataError when the checkpoint of ``step`` (at ``path``; None: unknown here) was
    written with another data order than ``now``; the warning line when it records none
    (``saved`` None: written before this key), else None."""
    if saved is None:
        return (f"dataloader: the checkpoint of step {step} records no data order (written before "
                f"dataloader.{KEY} was saved), so this run cannot check that it reads the same data with the same "
                "dataloader.seed; if either changed, some samples are trained twice and others never")
    then = DataOrder.from_json(saved)
    diff = now.first_difference(then)
    if diff is None:
        return None
    new, old = diff
    key = (new or old).key
    was = "nothing" if old is None else old.shown()
    is_ = "nothing" if new is None else new.shown()
    keep = f"--{key} {old.value}" if old is not None and old.flag else f"{key} as it was written ({was})"
    folder = path or f"<its step-{step} folder>"
    raise DataError(
        f"{key} = {is_}: the checkpoint of step {step} was written with {key} = {was}, and a loader's state (the "
        "samples read, look-ahead windows, epoch order) only fits the data order it was written with, so "
        f"continuing would train some samples twice and others never; continue with {keep}, or train on from its "
        f"weights in a new run (another dump_folder) with --checkpoint.initial_load_path {folder} "
        "--checkpoint.initial_load_model_only")
