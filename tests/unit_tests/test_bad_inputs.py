"""Bad input files are one line naming the file:line (or key) and what is wrong;
silent choices are logged once; folders transformers loads load here too.

``BAD`` is the table: each row writes one bad input under tmp_path and calls
the loader the product calls on it (the ``hf`` data source, the safetensors
pre-check and reader, the lengths reader). Every row must raise a UserError
(the command lines print it as ``error: ...``, exit status 2, no traceback:
skrull_ext/cli_errors.py) whose message is one line, compared in full. The
slow tests run the same files through the command lines a user types.
"""

import json
import logging
import os
import struct
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from skrull_ext import lengths
from skrull_ext.data.sources import chat_template, formats
from skrull_ext.data.sources.formats import RecordReader
from skrull_ext.data.sources.hf_source import hf_rows
from skrull_ext.data.sources.records import RecordEncoder
from skrull_ext.data.sources.tokenizer import LocalTokenizer
from skrull_ext.errors import UserError
from skrull_ext.hf.checks import check_hf_folder
from skrull_ext.hf.safetensors_file import read_header
from skrull_ext.hf.weights import load_hf_weights, read_safetensors
from skrull_ext.models.registry import build_model_spec
from tests.hf_tiny import perturb

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
DEBUG = os.path.join(ROOT, "skrull_ext", "jobs", "debug_cpu.toml")
TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6, rope_theta=1e6)
"""A tiny GQA Qwen2 (2 layers), saved by transformers' save_pretrained."""


@pytest.fixture(scope="module", autouse=True)
def hf_cache(tmp_path_factory):
    """datasets' Arrow cache in a temporary folder, not the user's."""
    datasets = pytest.importorskip("datasets")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path_factory.mktemp("hf_cache")))
        yield


def _file(folder, name: str, data: bytes) -> str:
    path = os.path.join(folder, name)
    with open(path, "wb") as f:
        f.write(data)
    return path


def _bad_utf8_parquet(folder) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    column = pa.array([b"fine", b"b\xff\xfeoo", b"fine"], pa.binary()).view(pa.string())  # not validated
    path = os.path.join(folder, "bad.parquet")
    pq.write_table(pa.table({"text": column}), path)
    return path


def _safetensors(folder) -> str:
    path = os.path.join(folder, "model.safetensors")
    save_file({"a": torch.zeros(4, 4), "b": torch.ones(8)}, path, metadata={"format": "pt"})
    return path


def _cut(path: str, size: int) -> str:
    with open(path, "rb") as f:
        data = f.read(size)
    with open(path, "wb") as f:
        f.write(data)
    return path


def _header_size(path: str) -> int:
    with open(path, "rb") as f:
        return struct.unpack("<Q", f.read(8))[0]


def _rows(path: str):
    return list(hf_rows(path))


def _hf_empty(d):
    return _rows, _file(d, "empty.jsonl", b""), "{p}: empty (0 bytes); remove it, or name the other files with " \
        "dataloader.data_files"


def _hf_blank(d):
    return _rows, _file(d, "blank.jsonl", b"\n  \n"), "{p}: empty (no rows); remove it, or name the other files " \
        "with dataloader.data_files"


def _hf_bad_utf8_jsonl(d):
    return _rows, _file(d, "bad.jsonl", b'{"text": "fine"}\n{"text": "b\xff\xfeoo"}\n'), \
        "{p}:2: not UTF-8 (byte 0xff at column 12); json files must be UTF-8"


def _hf_bad_utf8_parquet(d):
    return _rows, _bad_utf8_parquet(d), "{p} row 1: column 'text' is not UTF-8 (invalid start byte at byte 1)"


def _st_data_cut(d):
    path = _safetensors(d)
    n = _header_size(path)
    size = 8 + n + 64 + 16  # all of 'a' (64 bytes), half of 'b' (32)
    _cut(path, size)
    return read_header, path, f"{{p}}: tensor 'b' needs bytes {8 + n + 64}-{8 + n + 96} but the file has " \
        f"{size} bytes (truncated?)"


def _st_data_cut_on_load(d):
    path = _safetensors(d)
    _cut(path, os.path.getsize(path) - 1)
    n = _header_size(path)
    return lambda p: read_safetensors(os.path.dirname(p)), path, \
        f"{{p}}: tensor 'b' needs bytes {8 + n + 64}-{8 + n + 96} but the file has {8 + n + 95} bytes (truncated?)"


def _st_header_cut(d):
    path = _safetensors(d)
    n = _header_size(path)
    _cut(path, 20)
    return read_header, path, f"{{p}}: the safetensors header needs bytes 8-{8 + n} but the file has 20 bytes " \
        "(truncated, or not a safetensors file)"


def _st_size_cut(d):
    return read_header, _cut(_safetensors(d), 5), \
        "{p}: 5 bytes, shorter than a safetensors file's 8-byte header size (truncated?)"


def _st_trailing(d):
    path = _safetensors(d)
    size = os.path.getsize(path)
    with open(path, "ab") as f:
        f.write(b"\0" * 8)
    return read_header, path, f"{{p}}: the tensors end at byte {size} but the file has {size + 8} bytes " \
        "(a partial or concatenated write?)"


def _load_lengths(path: str):
    return lengths.load(path, "dataloader.lengths")


def _lengths_npy(d):
    path = os.path.join(d, "lengths.npy")
    np.save(path, np.arange(1, 100))
    return _load_lengths, path, "{p}: a NumPy .npy file; a lengths file is text, one integer per line " \
        "(np.savetxt(path, lengths, fmt='%d') writes one)"


def _lengths_garbage(d):
    return _load_lengths, _file(d, "garbage.bin", b"12\n\x00\x9c\xff\x01\n"), \
        "{p}:2: not text (byte 0x9c at column 2); a lengths file holds one positive integer per line"


def _lengths_word(d):
    return _load_lengths, _file(d, "word.txt", b"12\n3.5\n"), "{p}:2: '3.5' is not an integer length"


def _lengths_zero(d):
    return _load_lengths, _file(d, "zero.txt", b"12\n\n0\n"), "{p}:3: length 0 is not positive"


def _lengths_negative(d):
    return _load_lengths, _file(d, "negative.txt", b"-4\n"), "{p}:1: length -4 is not positive"


def _lengths_huge(d):  # past int64: an OverflowError traceback on every rank when the dataloader built its array
    return _load_lengths, _file(d, "huge.txt", b"12\n99999999999999999999999\n"), \
        "{p}:2: length 99999999999999999999999 is above the longest sequence the scheduler takes (68,719,476,736)"


def _lengths_empty(d):
    return _load_lengths, _file(d, "empty.txt", b"\n"), "{p}: no lengths in it (one positive integer per line)"


def _lengths_missing(d):
    path = os.path.join(d, "nope.txt")
    return _load_lengths, path, "dataloader.lengths: {p!r} is neither a shipped length file " \
        f"{lengths.names()} nor an existing file"


BAD = {
    "hf_empty_file": _hf_empty,
    "hf_blank_file": _hf_blank,
    "hf_jsonl_not_utf8": _hf_bad_utf8_jsonl,
    "hf_parquet_not_utf8": _hf_bad_utf8_parquet,
    "safetensors_data_cut": _st_data_cut,
    "safetensors_data_cut_on_load": _st_data_cut_on_load,
    "safetensors_header_cut": _st_header_cut,
    "safetensors_size_cut": _st_size_cut,
    "safetensors_trailing_bytes": _st_trailing,
    "lengths_npy": _lengths_npy,
    "lengths_binary": _lengths_garbage,
    "lengths_not_integer": _lengths_word,
    "lengths_zero": _lengths_zero,
    "lengths_negative": _lengths_negative,
    "lengths_huge": _lengths_huge,
    "lengths_empty": _lengths_empty,
    "lengths_missing": _lengths_missing,
}


def test_a_lengths_file_may_start_with_a_byte_order_mark(tmp_path):
    path = _file(str(tmp_path), "bom.txt", b"\xef\xbb\xbf100\n200\n")  # was "'\\ufeff100' is not an integer length"
    assert _load_lengths(path) == [100, 200]


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_input_is_one_line_naming_it(tmp_path, case):
    load, path, message = BAD[case](str(tmp_path))
    with pytest.raises(UserError) as e:
        load(path)
    assert str(e.value) == message.format(p=path)
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------- HF folders

def _tiny_qwen2(folder, **config) -> str:
    import transformers

    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**TINY, **config))
    perturb(model, seed=1)
    model.save_pretrained(folder)
    return str(folder)


def _with_head(folder: str, head) -> str:
    path = os.path.join(folder, "model.safetensors")
    tensors = load_file(path)
    tensors["lm_head.weight"] = head(tensors["model.embed_tokens.weight"])
    save_file(tensors, path, metadata={"format": "pt"})
    return folder


def _logits(folder: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(transformers', ours) float32 logits of the same tokens, our model loaded through the adapter."""
    import transformers
    from torchtitan.models.common import FlexAttention, ScaledDotProductAttention

    tokens = torch.randint(0, TINY["vocab_size"], (2, 24), generator=torch.Generator().manual_seed(2))
    ref = transformers.Qwen2ForCausalLM.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32)
    spec = build_model_spec(hf_path=folder)
    check_hf_folder(folder, spec)
    for layer in spec.model.layers:
        assert isinstance(layer.attention.inner_attention, FlexAttention.Config)
        layer.attention.inner_attention = ScaledDotProductAttention.Config()  # causal, as eager on one document
    model = spec.model.build().eval()
    load_hf_weights(model, spec, folder)
    with torch.no_grad():
        return ref.eval()(tokens).logits, model(tokens)


def test_tied_folder_that_stores_an_equal_head_loads_as_in_transformers(tmp_path, caplog):
    folder = _with_head(_tiny_qwen2(tmp_path / "tied", tie_word_embeddings=True), lambda e: e.clone())
    with caplog.at_level(logging.INFO):
        ref, ours = _logits(folder)
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-5)
    said = [r.getMessage() for r in caplog.records if "lm_head.weight equals" in r.getMessage()]
    assert said == [f"{folder}/model.safetensors: lm_head.weight equals model.embed_tokens.weight and is tied to "
                    f"it ({folder}/config.json: tie_word_embeddings), as transformers ties it"]


def test_tied_folder_that_stores_another_head_is_refused(tmp_path):
    folder = _with_head(_tiny_qwen2(tmp_path / "tied", tie_word_embeddings=True), lambda e: e + 1)
    with pytest.raises(UserError) as e:
        check_hf_folder(folder, build_model_spec(hf_path=folder))
    assert str(e.value) == (
        f"{folder}/model.safetensors: lm_head.weight differs from model.embed_tokens.weight, but "
        f"{folder}/config.json ties them (tie_word_embeddings: true); set tie_word_embeddings to false to train "
        "both, or remove lm_head.weight to tie the head to the embedding")


def test_qwen2_sliding_window_on_no_layer_loads_as_in_transformers(tmp_path):
    """use_sliding_window with max_window_layers >= num_hidden_layers: every layer is full attention."""
    folder = _tiny_qwen2(tmp_path / "window", tie_word_embeddings=False, use_sliding_window=True,
                         sliding_window=8, max_window_layers=TINY["num_hidden_layers"])
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    assert config["use_sliding_window"] and config["max_window_layers"] == config["num_hidden_layers"]
    ref, ours = _logits(folder)  # 24 tokens > the window of 8: a sliding layer would differ
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-5)


# ---------------------------------------------------------- silent choices

def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_row_with_text_and_messages_trains_the_chat_and_says_so_once(monkeypatch, caplog):
    monkeypatch.setattr(formats, "_SAID", set())
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    reader = RecordReader()
    with caplog.at_level(logging.WARNING):
        assert reader({"messages": chat, "text": "rendered"}, "data.jsonl:3") == chat
        assert reader({"messages": chat, "text": "rendered"}, "data.jsonl:4") == chat
        assert reader({"text": "plain"}, "data.jsonl:5") == "plain"
    said = _warnings(caplog)
    assert said == ["data.jsonl:3: the row fits dataloader.format 'messages' and ['text']; format = 'auto' reads it, "
                    "and every such row, as 'messages' and ignores column(s) ['text'] (logged once; "
                    "dataloader.format = 'text' reads them that way instead)"]
    caplog.clear()
    assert RecordReader(format="text")({"messages": chat, "text": "rendered"}, "data.jsonl:3") == "rendered"
    assert not _warnings(caplog)  # a named format is the user's choice


def test_the_chatml_fallback_is_logged_once(monkeypatch, caplog):
    monkeypatch.setattr(chat_template, "_FALLBACK_SAID", set())
    tok = LocalTokenizer.Config(path="tiny_bpe").build(tokenizer_path="")  # has no chat template
    chat = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    with caplog.at_level(logging.WARNING):
        encode = RecordEncoder(RecordReader(), tok)
        encode({"text": "plain"}, "data.jsonl:1")
        assert not _warnings(caplog)  # nothing to say until a chat is rendered
        encode(chat, "data.jsonl:2")
        encode(chat, "data.jsonl:3")
        RecordEncoder(RecordReader(), tok)(chat, "data.jsonl:4")
        RecordEncoder(RecordReader(), tok, chat_template="chatml")(chat, "data.jsonl:5")  # chosen: silent
    said = _warnings(caplog)
    assert len(said) == 1 and said[0].startswith(f"data.jsonl:2: the tokenizer ({tok.tokenizer_path}) has no chat "
                                                 "template"), said
    assert "chats are rendered as ChatML" in said[0] and "dataloader.chat_template = 'chatml'" in said[0]


# ------------------------------------------------------------ command lines

def _run(*args: str, cwd) -> subprocess.CompletedProcess:
    """``python -m ARGS`` in ``cwd`` (where a job's outputs would go)."""
    env = {**os.environ, "PYTHONPATH": os.path.abspath(ROOT)}
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, env=env, timeout=600,
                          cwd=cwd)


def _one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr[-3000:]
    return errors[0]


@pytest.mark.slow
@pytest.mark.parametrize("case", ["lengths_npy", "lengths_binary", "lengths_zero"])
def test_bench_simulate_lengths_file_errors(tmp_path, case):
    _, path, message = BAD[case](str(tmp_path))
    proc = _run("skrull_ext.bench", "simulate", "--lengths", path, "--quiet", "--no-plots", "--out", str(tmp_path),
                cwd=tmp_path)
    assert _one_line_error(proc) == "error: " + message.format(p=path)


@pytest.mark.slow
def test_bench_simulate_takes_a_lengths_file_and_warns_of_cuts(tmp_path):
    path = _file(str(tmp_path), "mine.txt", "".join(f"{n}\n" for n in [100, 3000, 200, 5000] * 10).encode())
    proc = _run("skrull_ext.bench", "simulate", "--lengths", path, "--models", "qwen2.5-0.5b", "--dp", "1", "--cp",
                "2", "--batch-size", "8", "--bucket-size", "1024", "--iterations", "2", "--quiet", "--no-plots",
                "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    warning = next(k for k, line in enumerate(lines) if line.startswith("warning:"))
    assert lines[warning] == (
        f"warning: sequences longer than a CP group holds (bucket size x CP) were cut in 1 of 1 cells: "
        f"{path} / qwen2.5-0.5b: 8 of 16 sequences (50.0%) cut to 2,048 tokens. Every policy but the pool ones "
        "planned the cut batches, so those cells' speed-ups describe the cut data, not the dataset: raise "
        "--bucket-size or --cp")
    assert lines[warning + 2].startswith("fastest policy a job can run, on equal work: skrull")  # above the first table
    assert lines[warning + 4].startswith("| policy |")
    assert lines[warning] in (tmp_path / "out" / "results.md").read_text()


@pytest.mark.slow
def test_train_with_a_bad_lengths_file(tmp_path):
    _, path, message = _lengths_npy(str(tmp_path))
    proc = _run("skrull_ext.train", "--config-file", DEBUG, "--dataloader.lengths", path, cwd=tmp_path)
    assert _one_line_error(proc) == "error: " + message.format(p=path)


@pytest.mark.slow
def test_train_with_a_cut_safetensors_file(tmp_path):
    folder = _tiny_qwen2(tmp_path / "cut", tie_word_embeddings=True)
    path = os.path.join(folder, "model.safetensors")
    _cut(path, os.path.getsize(path) - 100)
    proc = _run("skrull_ext.train", "--config-file", DEBUG, "--model.hf_path", folder, "--checkpoint.enable",
                "--skrull.cost_model", "h100-assumed", cwd=tmp_path)
    error = _one_line_error(proc)
    assert error.startswith(f"error: {path}: tensor ") and error.endswith(
        f"but the file has {os.path.getsize(path)} bytes (truncated?)"), error
