"""Tokenize once: a memory-mapped store of token ids and loss masks.

A text source (``jsonl``/``hf``) otherwise tokenizes the whole corpus into
memory on every rank at start-up. With ``[dataloader] token_cache = true``
(or after ``python -m skrull_ext.data prepare JOB.toml``) the corpus is
tokenized once into a store folder::

    ids.bin      int32, all records' token ids end to end
    mask.bin     uint8, the loss mask (1: predicted), same layout
    offsets.npy  int64 [n + 1], record r is ids[offsets[r]:offsets[r + 1]]
    lengths.npy  int64 [n], the unclipped lengths (what the scheduler reads)
    meta.json    the key's inputs, n, token count; written last = the done marker

Ranks load ``lengths.npy`` and memory-map ``ids.bin``/``mask.bin``: only the
pages of samples a rank builds are ever read. ``max_len`` is applied when a
sample is read, so changing it does not rebuild the store.

Key (``cache_key``): sha256 over the source files' (path, size, mtime_ns),
the tokenizer folder's files by content, the chat template text, the options
that change tokens (format, columns, text_field, system_prompt,
chat_template, min_len) and ``STORE_VERSION``. Source files are keyed by
size + mtime, not content: hashing a 10-100 GB corpus would cost about as
much as tokenizing it; every edit, copy-over or regeneration changes mtime
(``touch`` forces a rebuild). Tokenizer files are small, so their content is
hashed (a re-downloaded identical tokenizer keeps the cache).

Writes are crash-safe: a store is built in ``<key>.tmp-<pid>`` and renamed
to ``<key>`` only when complete; ``open_store`` also checks every file's
size against meta.json, so a partial or truncated store is removed and
rebuilt, never read. Concurrent ranks: an exclusive ``fcntl.flock`` on
``<key>.lock`` serialises builders; the first builds, the rest wait on the
lock and then find the finished store (a killed builder releases the lock
with its process). flock needs a local or lock-capable file system.
"""

import fcntl
import hashlib
import json
import multiprocessing
import os
import shutil
import sys
import time

import numpy as np
import torch

from skrull_ext.datasets.synthetic import IGNORE_INDEX, Sample
from skrull_ext.errors import DataError

STORE_VERSION = 1
FILES = ("ids.bin", "mask.bin", "offsets.npy", "lengths.npy")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "tokenizer.model", "vocab.json", "merges.txt")


def _sha_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tokenizer_identity(tokenizer) -> dict:
    """What identifies a tokenizer: its folder's files by content, else its class and vocabulary."""
    out = {"class": type(tokenizer).__qualname__, "vocab": int(tokenizer.get_vocab_size())}
    folder = getattr(tokenizer, "tokenizer_path", None)
    if folder and os.path.isdir(folder):
        out["files"] = {f: _sha_file(os.path.join(folder, f))
                        for f in TOKENIZER_FILES if os.path.isfile(os.path.join(folder, f))}
    return out


def source_identity(files: list[str]) -> list:
    """(absolute path, size, mtime_ns) of each source file (module docstring: why not content)."""
    out = []
    for f in files:
        st = os.stat(f)
        out.append([os.path.abspath(f), st.st_size, st.st_mtime_ns])
    return out


def cache_key(files: list[str], tokenizer, template: str | None, options: dict) -> tuple[str, dict]:
    """(hex key, the inputs it hashes)."""
    inputs = {"version": STORE_VERSION, "sources": source_identity(files),
              "tokenizer": tokenizer_identity(tokenizer), "template": template or "", "options": options}
    blob = json.dumps(inputs, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:32], inputs


def default_cache_root(files: list[str]) -> str:
    """``.skrull_tokens`` beside the first source file, or a per-user folder when that is read-only."""
    here = os.path.dirname(os.path.abspath(files[0])) if os.path.isfile(files[0]) else os.path.abspath(files[0])
    if os.access(here, os.W_OK):
        return os.path.join(here, ".skrull_tokens")
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "skrull_ext", "tokens")


# ---- building ------------------------------------------------------------------------------------

_WORKER: dict = {}
"""The encoder in a forked worker (inherited, not pickled: tokenizers do not pickle cheaply)."""


def _encode_chunk(chunk: list) -> list:
    encode, min_len = _WORKER["encode"], _WORKER["min_len"]
    out = []
    for where, row in chunk:
        ids, mask = encode(row, where)
        if len(ids) < min_len:
            raise DataError(f"{where}: {len(ids)} tokens, fewer than dataloader.min_len {min_len}")
        out.append((np.asarray(ids, dtype=np.int32), np.asarray(mask, dtype=np.uint8)))
    return out


def _chunks(records, size: int):
    chunk = []
    for item in records:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


class _Progress:
    """A plain periodic line on stderr (no tqdm dependency; logs stay readable)."""

    def __init__(self, label: str, every_s: float = 5.0, show: bool = True):
        self.label, self.every, self.show = label, every_s, show
        self.start = self.last = time.monotonic()

    def __call__(self, n: int, tokens: int, final: bool = False):
        now = time.monotonic()
        if self.show and (final or now - self.last >= self.every):
            self.last = now
            rate = n / max(now - self.start, 1e-9)
            print(f"prepare {self.label}: {n} records, {tokens} tokens, {rate:.0f} records/s"
                  + (" (done)" if final else ""), file=sys.stderr, flush=True)


def build_store(folder: str, records, encode, *, min_len: int = 2, workers: int = 1, chunk: int = 256,
                meta: dict | None = None, progress: bool = True) -> None:
    """Tokenize ``records`` ((where, row) pairs) into the store ``folder`` (must not exist).

    ``workers`` > 1: a fork pool encodes chunks of ``chunk`` records; ``imap``
    keeps the input order, so the store is byte-identical to a 1-worker build.
    """
    tmp = f"{folder}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    lengths: list[int] = []
    n_tokens = 0
    bar = _Progress(os.path.basename(folder), show=progress)
    try:
        with open(os.path.join(tmp, "ids.bin"), "wb") as f_ids, open(os.path.join(tmp, "mask.bin"), "wb") as f_mask:
            _WORKER.update(encode=encode, min_len=min_len)
            pool = multiprocessing.get_context("fork").Pool(workers) if workers > 1 else None
            try:
                encoded = pool.imap(_encode_chunk, _chunks(records, chunk)) if pool else \
                    map(_encode_chunk, _chunks(records, chunk))
                for part in encoded:
                    for ids, mask in part:
                        f_ids.write(ids.tobytes())
                        f_mask.write(mask.tobytes())
                        lengths.append(len(ids))
                        n_tokens += len(ids)
                    bar(len(lengths), n_tokens)
            finally:
                if pool:
                    pool.terminate()
                _WORKER.clear()
        if not lengths:
            raise DataError(f"{(meta or {}).get('path', folder)}: no records")
        lens = np.asarray(lengths, dtype=np.int64)
        np.save(os.path.join(tmp, "lengths.npy"), lens)
        np.save(os.path.join(tmp, "offsets.npy"), np.concatenate([[0], np.cumsum(lens)]).astype(np.int64))
        info = dict(meta or {}, records=len(lengths), tokens=n_tokens,
                    sizes={f: os.path.getsize(os.path.join(tmp, f)) for f in FILES})
        with open(os.path.join(tmp, "meta.json"), "w") as f:  # last: its presence marks a complete store
            json.dump(info, f, indent=1, default=str)
            f.flush()
            os.fsync(f.fileno())
        shutil.rmtree(folder, ignore_errors=True)
        os.rename(tmp, folder)
        bar(len(lengths), n_tokens, final=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# ---- reading -------------------------------------------------------------------------------------

def store_is_complete(folder: str) -> bool:
    """meta.json present and every file the size it records."""
    try:
        with open(os.path.join(folder, "meta.json")) as f:
            sizes = json.load(f)["sizes"]
        return all(os.path.getsize(os.path.join(folder, name)) == sizes[name] for name in FILES)
    except (OSError, ValueError, KeyError, TypeError):
        return False


class TokenStore:
    """A complete store, memory-mapped: ``ids(r)``, ``mask(r)``, ``lengths``."""

    def __init__(self, folder: str):
        if not store_is_complete(folder):
            raise DataError(f"{folder}: token store is incomplete or corrupt; delete it or run prepare again")
        self.folder = folder
        with open(os.path.join(folder, "meta.json")) as f:
            self.meta = json.load(f)
        self.lengths = np.load(os.path.join(folder, "lengths.npy"))
        self.offsets = np.load(os.path.join(folder, "offsets.npy"))
        if len(self.offsets) != len(self.lengths) + 1 or int(self.offsets[-1]) != self.meta["tokens"]:
            raise DataError(f"{folder}: token store index does not match its data; delete it or run prepare again")
        self._ids = np.memmap(os.path.join(folder, "ids.bin"), dtype=np.int32, mode="r") if self.meta["tokens"] else None
        self._mask = np.memmap(os.path.join(folder, "mask.bin"), dtype=np.uint8, mode="r") if self.meta["tokens"] else None

    def __len__(self) -> int:
        return len(self.lengths)

    def ids(self, r: int) -> np.ndarray:
        return self._ids[self.offsets[r]:self.offsets[r + 1]]

    def mask(self, r: int) -> np.ndarray:
        return self._mask[self.offsets[r]:self.offsets[r + 1]]


def ensure_store(root: str, key: str, records_fn, encode, *, min_len: int, workers: int = 1,
                 meta: dict | None = None, progress: bool = True) -> TokenStore:
    """The store ``root/key``: opened if complete, else (re)built under an exclusive lock."""
    folder = os.path.join(root, key)
    if store_is_complete(folder):
        return TokenStore(folder)
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, f"{key}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # other ranks wait here while one builds
        try:
            if not store_is_complete(folder):  # still missing (or partial): we build
                shutil.rmtree(folder, ignore_errors=True)
                build_store(folder, records_fn(), encode, min_len=min_len, workers=workers, meta=meta,
                            progress=progress)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return TokenStore(folder)


class StoreSequences:
    """A ``TokenStore`` indexed like ``JsonlSequences``: same samples, same epochs, same ``max_len`` cut."""

    def __init__(self, store: TokenStore, *, path: str, seed: int = 0, max_len: int | None = None):
        self.store, self.path, self.seed, self.max_len = store, path, seed, max_len
        lens = store.lengths
        self._lengths = lens if max_len is None else np.minimum(lens, max_len)
        self._perm: tuple[int, np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.store)

    def _epoch(self, epoch: int) -> np.ndarray:
        if self._perm is None or self._perm[0] != epoch:
            self._perm = (epoch, np.random.default_rng([self.seed, epoch]).permutation(len(self.store)))
        return self._perm[1]

    def record(self, index: int) -> int:
        epoch, pos = divmod(index, len(self.store))
        return int(self._epoch(epoch)[pos])

    def length(self, index: int) -> int:
        return int(self._lengths[self.record(index)])

    @property
    def max_length(self) -> int:
        return int(self._lengths.max())

    def arrays(self, r: int) -> tuple[np.ndarray, np.ndarray]:
        """Record ``r``'s (ids int64, mask bool), cut to max_len: copies of the mapped pages."""
        n = int(self._lengths[r])
        return (np.array(self.store.ids(r)[:n], dtype=np.int64), np.array(self.store.mask(r)[:n], dtype=bool))

    def __getitem__(self, index: int) -> Sample:
        ids_np, mask_np = self.arrays(self.record(index))
        ids = torch.from_numpy(ids_np)
        labels = torch.full_like(ids, IGNORE_INDEX)
        keep = torch.from_numpy(mask_np[1:])
        labels[:-1] = torch.where(keep, ids[1:], IGNORE_INDEX)
        return Sample(input=ids, labels=labels)

    def global_batch(self, step: int, size: int) -> list[int]:
        if step < 1:
            raise ValueError("steps are 1-based")
        return list(range((step - 1) * size, step * size))
