"""Real text: JSONL records tokenized with a local tokenizer.

Each line is a JSON object holding either a plain text (``{"text": ...}``,
the field name is configurable) or a chat (``{"messages": [{"role",
"content"}, ...]}``, roles system / user / assistant). Plain text is trained
on whole (text + EOS); a chat is rendered ChatML-style,

    <|im_start|>ROLE\\nCONTENT<|im_end|>\\n   (per message)

and only the assistant's content and its end marker are loss tokens (SFT).
Pieces are encoded separately, so the loss mask falls exactly on token
boundaries whatever the tokenizer.

Every record is tokenized once at start-up and kept in memory: lengths are
then known exactly (the scheduler and the over-length pre-scan need them
before any token is built) and sample ``i`` is a pure function of
``(seed, i)``: record ``perm_e[i % n]`` of epoch ``e = i // n``, each epoch a
fresh seeded permutation. So a global batch is a function of its step, as
with the synthetic source, and a resume needs only the step.

Records are kept whole: ``dataloader.max_len`` is a limit the over-length
policy applies per step (overlength.py), counted and reported with the
record's ``file:line`` (``location``), never a silent cut at load time.
TODO: a memory-mapped pre-tokenized format for corpora that do not fit.
"""

import json
from dataclasses import dataclass

import numpy as np
import torch

from skrull_ext.datasets.synthetic import IGNORE_INDEX, Sample
from skrull_ext.errors import DataError

ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class ChatTemplate:
    """ChatML-style turn markers (Qwen's); loss on the assistant's turns."""

    start: str = "<|im_start|>"
    end: str = "<|im_end|>"

    def pieces(self, messages: list[dict]) -> list[tuple[str, bool]]:
        """(text, is_loss) pieces of a chat, in order."""
        out = []
        for m in messages:
            trained = m["role"] == "assistant"
            out += [(f"{self.start}{m['role']}\n", False), (m["content"], trained), (f"{self.end}", trained), ("\n", False)]
        return out


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_bos=False, add_eos=False)) if text else []


def tokenize_record(record, tokenizer, text_field: str, template: ChatTemplate, where: str):
    """Token ids and loss mask (True: predict this token) of one record."""
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
    if isinstance(record.get(text_field), str):
        ids = _encode(tokenizer, record[text_field])
        eos = getattr(tokenizer, "eos_id", None)
        if eos is not None:
            ids.append(eos)
        return ids, [True] * len(ids)
    messages = record.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where}: needs a {text_field!r} string or a non-empty 'messages' list")
    for k, m in enumerate(messages):
        if not (isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str)):
            raise ValueError(f"{where}: message {k} needs a role in {list(ROLES)} and a string content, got {m!r}")
    if not any(m["role"] == "assistant" for m in messages):
        raise ValueError(f"{where}: a chat needs at least one assistant message (nothing to train on)")
    ids, mask = [], []
    for text, trained in template.pieces(messages):
        piece = _encode(tokenizer, text)
        ids += piece
        mask += [trained] * len(piece)
    return ids, mask


class JsonlSequences:
    """Tokenized JSONL records, indexed like ``SyntheticSequences``."""

    def __init__(self, path: str, tokenizer, *, text_field: str = "text", seed: int = 0,
                 min_len: int = 2, template: ChatTemplate = ChatTemplate()):
        self.path, self.seed = path, seed
        self.ids: list[np.ndarray] = []
        self.mask: list[np.ndarray] = []
        self.lines: list[int] = []
        """1-based line of each record in the file."""
        try:
            f = open(path, "rb")
        except OSError as e:
            raise DataError(f"{path}: cannot read the JSONL file: {e.strerror}") from e
        with f:
            for line_no, raw in enumerate(f, 1):
                where = f"{path}:{line_no}"
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise DataError(f"{where}: not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1}); "
                                    "JSONL files must be UTF-8") from e
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(f"{where}: not valid JSON: {e}") from e
                try:
                    ids, mask = tokenize_record(record, tokenizer, text_field, template, where)
                except ValueError as e:
                    raise DataError(str(e)) from e
                if len(ids) < min_len:
                    raise DataError(f"{where}: {len(ids)} tokens, fewer than dataloader.min_len {min_len}")
                self.lines.append(line_no)
                self.ids.append(np.asarray(ids, dtype=np.int64))
                self.mask.append(np.asarray(mask, dtype=bool))
        if not self.ids:
            raise DataError(f"{path}: no records")
        self._lengths = np.asarray([len(x) for x in self.ids], dtype=np.int64)
        self._perm: tuple[int, np.ndarray] | None = None  # the last epoch's permutation

    def __len__(self) -> int:
        """Records in the file (one epoch)."""
        return len(self.ids)

    def _epoch(self, epoch: int) -> np.ndarray:
        if self._perm is None or self._perm[0] != epoch:
            self._perm = (epoch, np.random.default_rng([self.seed, epoch]).permutation(len(self.ids)))
        return self._perm[1]

    def record(self, index: int) -> int:
        """The record behind sample ``index``."""
        epoch, pos = divmod(index, len(self.ids))
        return int(self._epoch(epoch)[pos])

    def length(self, index: int) -> int:
        return int(self._lengths[self.record(index)])

    def has_loss_within(self, index: int, n: int) -> bool:
        """Whether sample ``index`` cut to ``n`` tokens keeps a loss token (label k predicts token k + 1)."""
        return bool(self.mask[self.record(index)][1 : n + 1].any())

    def location(self, index: int) -> str:
        """``path:line`` of the record behind sample ``index``."""
        return f"{self.path}:{self.lines[self.record(index)]}"

    @property
    def max_length(self) -> int:
        return int(self._lengths.max())

    def __getitem__(self, index: int) -> Sample:
        r = self.record(index)
        ids = torch.from_numpy(self.ids[r])
        labels = torch.full_like(ids, IGNORE_INDEX)
        keep = torch.from_numpy(self.mask[r][1:])
        labels[:-1] = torch.where(keep, ids[1:], IGNORE_INDEX)
        return Sample(input=ids, labels=labels)

    def global_batch(self, step: int, size: int) -> list[int]:
        """Sample indices of the global batch of 1-based training ``step``."""
        if step < 1:
            raise ValueError("steps are 1-based")
        return list(range((step - 1) * size, step * size))
