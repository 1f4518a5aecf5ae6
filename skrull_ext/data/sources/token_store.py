"""Tokenize once: a memory-mapped store of token ids and loss masks.

A text source (``jsonl``/``hf``) is tokenized once into a store folder, on
first use (``[dataloader] token_cache = true``, the default) or ahead of
torchrun with ``python -m skrull_ext.prepare JOB.toml``::

    ids.bin            int32, all records' token ids end to end
    mask.bin           uint8, the loss mask (1: predicted), same layout
    offsets.npy        int64 [n + 1], record r is ids[offsets[r]:offsets[r + 1]]
    lengths.npy        int64 [n], the lengths (what the scheduler reads)
    where.bin          utf-8, each record's ``file:line`` / ``file row N`` end to end
                       (less the source path, which the reader's own spelling replaces)
    where_offsets.npy  int64 [n + 1], the same layout for where.bin
    meta.json          the key's inputs, n, token count, the bad records'
                       messages; written last = the done marker

Ranks load the two index arrays and memory-map the rest: only the pages of
samples a rank builds (or names in a message) are ever read, so a rank's
memory does not grow with the corpus. Lengths are whole: ``max_len`` and the
over-length mode (``skrull.overlength``) are applied per step (overlength.py),
so changing them does not rebuild the store.

Key (``cache_key``): sha256 over the source files' (path, size, mtime_ns),
the tokenizer folder's files by content, the chat template text, the options
that change tokens or which records are kept (format, columns, text_field,
system_prompt, chat_template, min_len, on_bad_record, split, data_files) and
``STORE_VERSION`` (raise it when tokenization or the layout changes). Source files are keyed by
size + mtime, not content: hashing a 10-100 GB corpus would cost about as
much as tokenizing it; every edit, copy-over or regeneration changes mtime
(``touch`` forces a rebuild). Tokenizer files are small, so their content is
hashed (a re-downloaded identical tokenizer keeps the cache).

Writes are crash-safe: a store is built in ``<key>.tmp-<pid>`` and renamed
to ``<key>`` only when complete; ``store_is_complete`` (called by
``ensure_store``) also checks every file's size against meta.json, so a partial or truncated store is removed and
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

from skrull_ext.data.sources.text import BadRecords, TokenizedRecords, encode_record
from skrull_ext.errors import DataError

STORE_VERSION = 2
FILES = ("ids.bin", "mask.bin", "offsets.npy", "lengths.npy", "where.bin", "where_offsets.npy")
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
    """(where, ids, mask, None) per record, or (where, None, None, message) for one that cannot be trained."""
    encode, min_len = _WORKER["encode"], _WORKER["min_len"]
    out = []
    for where, row in chunk:
        try:
            ids, mask = encode_record(encode, where, row, min_len)
        except DataError as e:
            out.append((where, None, None, str(e)))
            continue
        out.append((where, ids.astype(np.int32), mask.astype(np.uint8), None))
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


def _relative_where(where: str, prefix: str) -> str:
    """``where`` less the source path it starts with, marked by a leading NUL (else as is)."""
    return "\0" + where[len(prefix):] if prefix and where.startswith(prefix) else where


def build_store(folder: str, records, encode, *, min_len: int = 2, on_bad: BadRecords | None = None,
                workers: int = 1, chunk: int = 256, meta: dict | None = None, progress: bool = True) -> None:
    """Tokenize ``records`` ((where, row) pairs) into the store ``folder``.

    ``workers`` > 1: a fork pool encodes chunks of ``chunk`` records; ``imap``
    keeps the input order, so the store (bad records' messages included) is
    byte-identical to a 1-worker build. ``on_bad``: what a record that cannot
    be trained does (text.BadRecords; default: raise naming it).
    """
    on_bad = on_bad or BadRecords("error")
    prefix = (meta or {}).get("path", "")  # where strings are kept relative to it (StoreSequences.where_of)
    tmp = f"{folder}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    lengths: list[int] = []
    where_ends: list[int] = []
    n_tokens = n_where = 0
    bar = _Progress(os.path.basename(folder), show=progress)
    if progress:
        print(f"prepare: tokenizing {(meta or {}).get('path', '')} into {folder} ({workers} process"
              f"{'es' if workers > 1 else ''})", file=sys.stderr, flush=True)
    try:
        with open(os.path.join(tmp, "ids.bin"), "wb") as f_ids, open(os.path.join(tmp, "mask.bin"), "wb") as f_mask, \
                open(os.path.join(tmp, "where.bin"), "wb") as f_where:
            _WORKER.update(encode=encode, min_len=min_len)
            pool = multiprocessing.get_context("fork").Pool(workers) if workers > 1 else None
            try:
                encoded = pool.imap(_encode_chunk, _chunks(records, chunk)) if pool else \
                    map(_encode_chunk, _chunks(records, chunk))
                for part in encoded:
                    for where, ids, mask, error in part:
                        if error is not None:
                            on_bad(DataError(error))
                            continue
                        f_ids.write(ids.tobytes())
                        f_mask.write(mask.tobytes())
                        where_b = _relative_where(where, prefix).encode("utf-8")
                        f_where.write(where_b)
                        n_where += len(where_b)
                        where_ends.append(n_where)
                        lengths.append(len(ids))
                        n_tokens += len(ids)
                    bar(len(lengths), n_tokens)
            finally:
                if pool:
                    pool.terminate()
                _WORKER.clear()
        if not lengths:
            path = (meta or {}).get("path", folder)
            raise DataError(f"{path}: no records" + (f" left: {len(on_bad.messages)} skipped as bad, first: "
                                                      f"{on_bad.messages[0]}" if on_bad.messages else ""))
        lens = np.asarray(lengths, dtype=np.int64)
        np.save(os.path.join(tmp, "lengths.npy"), lens)
        np.save(os.path.join(tmp, "offsets.npy"), np.concatenate([[0], np.cumsum(lens)]).astype(np.int64))
        np.save(os.path.join(tmp, "where_offsets.npy"), np.asarray([0, *where_ends], dtype=np.int64))
        info = dict(meta or {}, records=len(lengths), tokens=n_tokens, bad=[_relative_where(m, prefix) for m in on_bad.messages],
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
        self.where_offsets = np.load(os.path.join(folder, "where_offsets.npy"))
        if len(self.where_offsets) != len(self.offsets):
            raise DataError(f"{folder}: token store index does not match its data; delete it or run prepare again")
        # A store holds at least one record of min_len >= 1 tokens, so no file is empty (memmap refuses those).
        self._ids = np.memmap(os.path.join(folder, "ids.bin"), dtype=np.int32, mode="r")
        self._mask = np.memmap(os.path.join(folder, "mask.bin"), dtype=np.uint8, mode="r")
        self._where = np.memmap(os.path.join(folder, "where.bin"), dtype=np.uint8, mode="r")

    def __len__(self) -> int:
        return len(self.lengths)

    def ids(self, r: int) -> np.ndarray:
        return self._ids[self.offsets[r]:self.offsets[r + 1]]

    def mask(self, r: int) -> np.ndarray:
        return self._mask[self.offsets[r]:self.offsets[r + 1]]

    def where(self, r: int) -> str:
        return self._where[self.where_offsets[r]:self.where_offsets[r + 1]].tobytes().decode("utf-8")


def ensure_store(root: str, key: str, records_fn, encode, *, min_len: int, on_bad: BadRecords | None = None,
                 workers: int = 1, meta: dict | None = None, progress: bool = True) -> TokenStore:
    """The store ``root/key``: opened if complete, else (re)built under an exclusive lock."""
    folder = os.path.join(root, key)
    if store_is_complete(folder):
        return TokenStore(folder)
    try:
        os.makedirs(root, exist_ok=True)
        lock = open(os.path.join(root, f"{key}.lock"), "w")
    except OSError as e:
        raise DataError(f"dataloader.token_cache_dir: cannot write the token store under {root}: {e.strerror} "
                        "(name a writable folder, or token_cache = false)") from e
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # other ranks wait here while one builds
        try:
            if not store_is_complete(folder):  # still missing (or partial): we build
                shutil.rmtree(folder, ignore_errors=True)
                build_store(folder, records_fn(), encode, min_len=min_len, on_bad=on_bad, workers=workers,
                            meta=meta, progress=progress)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return TokenStore(folder)


class StoreSequences(TokenizedRecords):
    """A ``TokenStore`` indexed like ``JsonlSequences`` (same samples, epochs, locations, bad records)."""

    def __init__(self, store: TokenStore, *, path: str, seed: int = 0):
        self.store, self.path, self.seed = store, path, seed
        self.bad = [self._resolve(m) for m in store.meta.get("bad", [])]
        self._lengths = store.lengths

    def ids_of(self, r: int) -> np.ndarray:
        return self.store.ids(r)

    def mask_of(self, r: int) -> np.ndarray:
        return self.store.mask(r)

    def where_of(self, r: int) -> str:
        return self._resolve(self.store.where(r))

    def _resolve(self, where: str) -> str:
        # Kept relative to the source path (build_store): the same file spelled
        # another way (relative, absolute, via ..) shares the store, and its
        # messages name it as this job does.
        return self.path + where[1:] if where.startswith("\0") else where
