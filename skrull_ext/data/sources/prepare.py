"""Build or open the token store of a ``jsonl``/``hf`` source (token_store.py).

``cached_sequences`` is the one hook the text sources call when
``[dataloader] token_cache = true`` (the default); ``python -m
skrull_ext.prepare JOB.toml`` calls it ahead of torchrun with a pool of
processes (docs/data.md, "Prepare"). A build on first use inside a training
job uses one process: forking a process that already runs torch and its
collectives' threads is not safe.
"""

import os

from skrull_ext import assets
from skrull_ext.data.sources.chat_template import template_text
from skrull_ext.data.sources.hf_source import _is_saved, data_files, hf_rows
from skrull_ext.data.sources.records import RecordEncoder
from skrull_ext.data.sources.text import BadRecords, jsonl_records
from skrull_ext.data.sources.token_store import StoreSequences, cache_key, default_cache_root, ensure_store


def source_files(config) -> tuple[str, list[str], object]:
    """(display path, files the key covers, () -> (where, row) iterator) of a jsonl/hf config."""
    if config.dataset == "jsonl":
        path = assets.text_path(config.dataset_path)
        return path, [path], lambda: jsonl_records(path, skip_bad=config.on_bad_record == "skip")
    path = config.dataset_path
    if os.path.isdir(path) and _is_saved(path):
        files = sorted(os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs)
    else:
        files = data_files(path, config.split, config.data_files)
    return path, files, lambda: hf_rows(path, config.split, config.data_files)


def cached_sequences(config, tokenizer, *, workers: int = 1, progress: bool = True) -> StoreSequences:
    """The source's samples from its token store, built first if missing or stale."""
    path, files, rows = source_files(config)
    options = {k: getattr(config, k) for k in ("dataset", "format", "columns", "text_field", "system_prompt",
                                                "chat_template", "min_len", "on_bad_record", "split",
                                                "data_files")}
    key, inputs = cache_key(files, tokenizer, template_text(tokenizer, "" if config.chat_template == "chatml" else config.chat_template), options)
    root = config.token_cache_dir or default_cache_root(files)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    store = ensure_store(root, key, rows, RecordEncoder.from_config(config, tokenizer), min_len=config.min_len,
                         on_bad=BadRecords(config.on_bad_record), workers=workers, meta=dict(inputs, path=path),
                         progress=progress and local_rank == 0)
    return StoreSequences(store, path=path, seed=config.seed)
