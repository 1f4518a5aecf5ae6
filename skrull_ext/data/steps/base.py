"""Shared config and base of the dataloaders, and the data sources they draw from.

Every skrull-ext dataloader (torchtitan-style packed rows, Skrull-scheduled
buffers) draws the same global batches from the same source, which is what
makes a Skrull run comparable token for token with a torchtitan run. A
source maps a sample index to a ``Sample`` as a pure function of the index,
gives lengths without building tokens, and a global batch is a function of
its step; a loader checkpoints the step and what it carries over (its
counts, look-ahead windows, carried pieces).

Sources are a registry (``DATASETS``): ``synthetic`` (tokens whose lengths
follow a shipped distribution), ``jsonl`` (real text tokenized with the
job's tokenizer, once, into a memory-mapped store: token_store.py) and ``hf`` (local json/parquet/arrow files or save_to_disk
folders through HF ``datasets``; docs/data.md).
"""

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from torchtitan.components.dataloader import BaseDataLoader
from torchtitan.components.tokenizer import BaseTokenizer
from torchtitan.tools.logging import logger

from skrull_ext import assets
from skrull_ext import lengths as shipped_lengths
from skrull_ext.data.sources.formats import FORMATS, Columns
from skrull_ext.data.sources.hf_source import hf_rows
from skrull_ext.data.sources.mixture import MixSource, MixtureSequences, check_sources
from skrull_ext.data.sources.prepare import cached_sequences
from skrull_ext.data.sources.records import RecordEncoder
from skrull_ext.data.steps.row_layout import PACKINGS
from skrull_ext.data.sources.synthetic import SyntheticSequences
from skrull_ext.data.sources.text import JsonlSequences, TokenizedRecords
from skrull_ext.data.steps import data_order as orders


def _synthetic(config, tokenizer: BaseTokenizer | None) -> SyntheticSequences:
    vocab = config.vocab_size
    if vocab is None:
        if tokenizer is None:
            raise ValueError("dataloader.vocab_size is unset and there is no tokenizer")
        vocab = tokenizer.get_vocab_size()
    return SyntheticSequences(
        lengths=np.asarray(shipped_lengths.load(config.lengths, "dataloader.lengths"), dtype=np.int64),
        vocab_size=vocab,
        seed=config.seed,
        length_scale=config.length_scale,
        min_len=config.min_len,
        max_len=config.max_len,
    )


def _records(config, tokenizer: BaseTokenizer | None, path: str, rows=None) -> TokenizedRecords:
    if tokenizer is None:
        raise ValueError(f"dataloader.dataset = {config.dataset!r} needs a tokenizer")
    if config.token_cache:  # tokenize once, memory-map (token_store.py)
        return cached_sequences(config, tokenizer)
    return JsonlSequences(
        path,
        tokenizer,
        seed=config.seed,
        min_len=config.min_len,
        encoder=RecordEncoder.from_config(config, tokenizer),
        records=rows,
        on_bad_record=config.on_bad_record,
    )


def _jsonl(config, tokenizer: BaseTokenizer | None) -> TokenizedRecords:
    return _records(config, tokenizer, assets.text_path(config.dataset_path))


def _hf(config, tokenizer: BaseTokenizer | None) -> TokenizedRecords:
    rows = hf_rows(config.dataset_path, config.split, config.data_files)
    return _records(config, tokenizer, config.dataset_path, rows)


def mixture_configs(config) -> list:
    """(entry, the dataloader's config pointed at it) per ``[[dataloader.sources]]`` entry:
    the source reads its own path with the dataloader's options (its format and split
    where it names them) and shuffles with ``seed + its position``."""
    return [(s, dataclasses.replace(config, dataset=s.dataset, dataset_path=s.path, format=s.format or config.format,
                                    split=s.split or config.split, seed=config.seed + k, sources=[]))
            for k, s in enumerate(config.sources)]


def _mixture(config, tokenizer: BaseTokenizer | None) -> MixtureSequences:
    children, caps = [], []
    for entry, child_config in mixture_configs(config):
        child = DATASETS[entry.dataset](child_config, tokenizer)
        children.append(child)
        caps.append(None if entry.epochs is None else max(1, int(entry.epochs * len(child))))
    return MixtureSequences([e.display_name() for e in config.sources], children,
                            [e.weight for e in config.sources], caps, seed=config.seed)


DATASETS: dict[str, Callable] = {"synthetic": _synthetic, "jsonl": _jsonl, "hf": _hf, "mixture": _mixture}
"""Source builders by ``dataloader.dataset``: ``(config, tokenizer) -> source``."""


class SourceDataLoaderBase(BaseDataLoader):
    """Base of the loaders over a ``DATASETS`` source; holds the step counter."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseDataLoader.Config):
        dataset: Literal[tuple(DATASETS)] = "synthetic"  # pyrefly: ignore[invalid-literal]
        """Where samples come from: synthetic tokens, a JSONL file or HF datasets files (dataset_path), or a
        weighted mixture of several (``mixture``: [[dataloader.sources]], data/sources/mixture.py)."""
        sources: list[MixSource] = field(default_factory=list)
        """mixture: the sources, each with its path, weight and optional name, dataset, format, split, epochs."""
        lengths: str = "sharegpt_v3_conversations.qwen"
        """synthetic: a shipped length distribution (skrull_ext/lengths, README there) or a file path."""
        length_scale: float = 1.0
        """synthetic: divide drawn lengths by this; keeps the distribution's shape smaller."""
        text_field: str = "text"
        """jsonl/hf: the column holding a plain-text record."""
        format: Literal[("auto", *FORMATS)] = "auto"  # pyrefly: ignore[invalid-literal]
        """jsonl/hf: the record format (messages, sharegpt, prompt_response, alpaca, text); auto: per row."""
        columns: dict[str, str] = field(default_factory=dict)
        """jsonl/hf: rename canonical columns, e.g. {prompt = "question", from = "speaker"} (docs/data.md)."""
        system_prompt: str = ""
        """jsonl/hf: a system turn added to chats that have none ('' adds none)."""
        chat_template: str = ""
        """jsonl/hf: '' the tokenizer's chat template (ChatML without one), 'chatml', or a .jinja file."""
        split: str = "train"
        """hf: the split of a folder or DatasetDict."""
        data_files: list[str] = field(default_factory=list)
        """hf: globs under dataset_path (a folder) naming the files to read; empty: the split's files."""
        min_len: int = 2
        """Shorter samples are an error (jsonl, naming file:line) or drawn no shorter (synthetic)."""
        on_bad_record: Literal["error", "skip"] = "error"
        """jsonl/hf: a record that cannot be trained (not UTF-8, not JSON, no recognised columns, unknown
        role, empty assistant turn, under min_len tokens) stops the job naming file:line or row ('error'),
        or is skipped: counted, and the count and the first few named in one line at load ('skip')."""
        max_len: int | None = None
        """Longest sample trained (an SFT max-length cut); None: what a CP group (or a row) holds.
        jsonl: applied per step by skrull.overlength (error, truncate, drop), counted and reported,
        never at load time; synthetic: lengths are drawn at most this long (nothing is cut)."""
        vocab_size: int | None = None
        """synthetic: token ids are drawn from [1, vocab_size); None: the tokenizer's (the model's)."""
        token_cache: bool = True
        """jsonl/hf: tokenize once into a memory-mapped store (built on first use or by `python -m
        skrull_ext.prepare`, docs/data.md); false: tokenize into memory at every start."""
        token_cache_dir: str = ""
        """jsonl/hf: where token stores go; '' .skrull_tokens/ beside the data (a per-user cache if read-only)."""
        seed: int = 0
        """Draws synthetic samples; shuffles each epoch of a JSONL file."""
        global_batch_size: int = 8
        """Sequences per optimizer step, over all DP ranks."""
        packing: Literal[tuple(PACKINGS)] = "rows"  # pyrefly: ignore[invalid-literal]
        """torchtitan's batching (skrull.enable = false) only: 'rows' places each step's samples whole
        in local_batch_size rows of seq_len (padding the rest); 'stream' cuts the global batches, as one
        stream, into full rows (a sample cut at a row's end goes on in the next row, without the context
        before the cut): no padding, but a step is a fixed number of tokens, not a global batch;
        'documents' places whole samples best-fit decreasing into the rows, never cut, what does not
        fit carried to the next step (data/steps/row_layout.py). Skrull's loader neither pads nor cuts."""

        def __post_init__(self):
            if self.dataset not in DATASETS:
                raise ValueError(f"dataloader.dataset: {self.dataset!r} is not one of {sorted(DATASETS)}")
            if self.dataset in ("jsonl", "hf") and not self.dataset_path:
                raise ValueError(f"dataloader.dataset = {self.dataset!r} needs dataloader.dataset_path "
                                 "(a file or a shipped name; for hf also a folder)")
            if self.dataset == "mixture":
                check_sources(self.sources)
            elif self.sources:
                raise ValueError(f"dataloader.sources: set, but dataloader.dataset = {self.dataset!r}; a mixture "
                                 "sets dataset = \"mixture\"")
            Columns(self.columns)  # raises naming an unknown column key
            if self.global_batch_size < 1:
                raise ValueError(f"dataloader.global_batch_size must be >= 1, got {self.global_batch_size}")
            if self.packing not in PACKINGS:
                raise ValueError(f"dataloader.packing: {self.packing!r} is not one of {list(PACKINGS)}")

    def __init__(self, config: Config, tokenizer: BaseTokenizer | None = None):
        self.config = config
        self.source = DATASETS[config.dataset](config, tokenizer)
        if getattr(self.source, "bad", None):
            logger.warning(f"dataloader: {self.source.bad_summary()}")
        self.step = 0
        """Global batches consumed so far (the checkpointed state)."""
        self._data_order: orders.DataOrder | None = None
        self._resuming: tuple[str, bool] | None = None
        """(path, whether its state has ``data_order``) of the checkpoint a resume is about to load."""

    def next_global_batch(self) -> list[int]:
        self.step += 1
        return self.source.global_batch(self.step, self.config.global_batch_size)

    def step_lengths(self, step: int) -> list[tuple[int, int]]:
        """(sample index, length) of 1-based ``step``'s global batch, without
        building tokens: what the over-length pre-scan reads."""
        return [(i, self.source.length(i)) for i in self.source.global_batch(step, self.config.global_batch_size)]

    def length_bound(self) -> int | None:
        """No sample is longer than this (None: unknown without a scan)."""
        return self.source.max_length

    @property
    def data_order(self) -> orders.DataOrder:
        """What this loader's sample order depends on (data_order.py), found once: it hashes the records' lengths."""
        if self._data_order is None:
            self._data_order = orders.data_order(self.config, self.source)
        return self._data_order

    def expect_checkpoint(self, path: str, keys: set[str] | None) -> None:
        """Before a resume loads the checkpoint at ``path``, whose dataloader state holds ``keys``
        (None: not read): DCP loads exactly the keys ``state_dict`` gives, so one written before
        ``data_order`` existed loads only with the key left out, until ``load_state_dict``. A
        checkpoint with no dataloader state at all (a model's) never loads one: nothing is left out."""
        self._resuming = (path, not keys or orders.KEY in keys)

    def order_state(self) -> dict[str, str]:
        """The ``data_order`` key of ``state_dict`` (the loaders add it to theirs)."""
        if self._resuming is not None and not self._resuming[1]:
            return {}
        return {orders.KEY: self.data_order.to_json()}

    def state_dict(self) -> dict:
        return {"step": self.step, **self.order_state()}

    def load_state_dict(self, state_dict: dict) -> None:
        """The step, once the checkpoint's data order is the job's (data_order.check: one line
        and a stop when it is not; a warning when the checkpoint records none)."""
        step = int(state_dict.get("step", 0))
        path = self._resuming[0] if self._resuming is not None else None
        self._resuming = None
        warning = orders.check(state_dict.get(orders.KEY), self.data_order, step, path)
        if warning is not None:
            logger.warning(warning)
        self.step = step
