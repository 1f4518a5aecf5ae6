"""The real-text path: the shipped JSONL fixture, tokenized with the shipped
tiny BPE tokenizer through torchtitan's HuggingFaceTokenizer, read by the
same source and dataloaders a job uses."""

import json
import os

import pytest
import torch

from skrull_ext import assets
from skrull_ext.attention.meta import DISTRIBUTED
from skrull_ext.data.steps.packed import PackedDataLoader
from skrull_ext.data.steps.loader import SkrullDataLoader
from skrull_ext.data.sources.synthetic import IGNORE_INDEX
from skrull_ext.data.sources.text import JsonlSequences
from skrull_ext.data.sources.tokenizer import LocalTokenizer, SyntheticTokenizer
from skrull_ext.scheduler import Scheduler, cost_model
from skrull_ext.train.job.job_file import load_job
from skrull_ext.train.job.skrull_config import SkrullConfig

FIXTURE = assets.text_path("tiny_sft")
TEXT_JOB = os.path.join(os.path.dirname(__file__), "..", "..", "skrull_ext", "jobs", "debug_cpu_text.toml")


@pytest.fixture(scope="module")
def tok():
    return LocalTokenizer.Config(path="tiny_bpe").build(tokenizer_path="")


@pytest.fixture(scope="module")
def records():
    with open(FIXTURE, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_fixture_mixes_texts_chats_and_long_documents(records, tok):
    src = JsonlSequences(FIXTURE, tok)
    kinds = {("text" if "text" in r else "chat") for r in records}
    assert kinds == {"text", "chat"} and len(src) == len(records) >= 30
    lengths = [src.length(i) for i in range(len(src))]
    assert min(lengths) < 64 and sum(n > 256 for n in lengths) >= 2 and max(lengths) > 512
    assert tok.get_vocab_size() <= 2048  # fits the llama3 debug model


def test_samples_are_the_records_tokenized(records, tok):
    src = JsonlSequences(FIXTURE, tok)
    for i in range(len(src)):
        r, s = records[src.record(i)], src[i]
        assert s.length == src.length(i)
        assert torch.equal(s.labels[:-1][s.labels[:-1] != IGNORE_INDEX],
                           s.input[1:][s.labels[:-1] != IGNORE_INDEX])
        trained = s.labels[s.labels != IGNORE_INDEX].tolist()
        if "text" in r:  # everything is trained on, ending with EOS
            assert tok.decode(s.input.tolist()) == r["text"]
            assert trained == s.input[1:].tolist() and trained[-1] == tok.eos_id
        else:  # only the assistant's turns (special end markers decode to nothing)
            want = "".join(m["content"] for m in r["messages"] if m["role"] == "assistant")
            assert tok.decode(trained) == want
            assert tok.decode(s.input.tolist()) == "".join(
                f"{m['role']}\n{m['content']}\n" for m in r["messages"])


def test_epochs_are_seeded_permutations(tok):
    a, b = JsonlSequences(FIXTURE, tok, seed=3), JsonlSequences(FIXTURE, tok, seed=3)
    n = len(a)
    first, second = [a.record(i) for i in range(n)], [a.record(i) for i in range(n, 2 * n)]
    assert sorted(first) == sorted(second) == list(range(n)) and first != second
    assert [b.record(i) for i in range(2 * n)] == first + second
    assert [JsonlSequences(FIXTURE, tok, seed=4).record(i) for i in range(n)] != first


def test_records_are_kept_whole_and_the_byte_tokenizer_also_works(tok, records):
    """No length limit at load time (the over-length policy applies max_len
    per step, test_accounting.py); each sample knows its file:line."""
    src = JsonlSequences(FIXTURE, tok)
    assert src.max_length > 512
    assert [src.location(i) for i in range(len(src))] == [f"{FIXTURE}:{src.record(i) + 1}" for i in range(len(src))]
    assert len(records) == len(src)  # so record r is on line r + 1: the fixture has no blank lines
    by_bytes = JsonlSequences(FIXTURE, SyntheticTokenizer.Config(vocab_size=2048).build())
    assert by_bytes.max_length > JsonlSequences(FIXTURE, tok).max_length


@pytest.mark.parametrize("line, message", [
    ("{not json", r":1: not valid JSON"),
    ('{"body": "x"}', r":1: no recognised columns \(the row has \['body'\]\); expected 'messages' \|"),
    ('{"messages": [{"role": "bot", "content": "x"}]}', r":1: messages\[0\] has unknown role 'bot'"),
    ('{"messages": [{"role": "user", "content": "hi"}]}', r":1: a chat needs at least one assistant message"),
])
def test_bad_records_are_named_by_line(tmp_path, tok, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(ValueError, match=message):
        JsonlSequences(str(path), tok)


def test_jsonl_through_the_dataloaders(tok):
    config = SkrullDataLoader.Config(dataset="jsonl", dataset_path="tiny_sft", max_len=512, global_batch_size=8)
    section = SkrullConfig(bucket_size=256, cost_model="h100-assumed", overlength="truncate")
    loader = config.build(dp_world_size=1, dp_rank=0, tokenizer=tok)
    loader.attach(Scheduler(section.scheduler_config(1, 2, lookahead=1), cost_model.preset("llama3-debug")), 0, 2)
    placements = []
    for _ in range(4):
        step = loader.next_step()
        want = sum(int((loader.source[i].labels[:512] != IGNORE_INDEX).sum()) for i in step.samples)
        assert step.global_valid_tokens == want
        placements += step.plan.cp_rank
    assert DISTRIBUTED in placements and any(r != DISTRIBUTED for r in placements)
    packed = PackedDataLoader.Config(dataset="jsonl", dataset_path="tiny_sft", max_len=512).build(
        dp_world_size=1, dp_rank=0, tokenizer=tok, seq_len=512, local_batch_size=4)
    packed.set_overlength("truncate")
    inputs, labels = next(iter(packed))
    assert inputs["input"].shape == labels.shape == (4, 512)


def test_text_job_file_selects_both():
    config = load_job(TEXT_JOB)
    assert isinstance(config.tokenizer, LocalTokenizer.Config) and config.tokenizer.path == "tiny_bpe"
    assert config.dataloader.dataset == "jsonl" and config.dataloader.dataset_path == "tiny_sft"


@pytest.mark.parametrize("kwargs, message", [
    ({"dataset": "jsonl"}, "needs dataloader.dataset_path"),
    ({"dataset": "parquet"}, "'parquet' is not one of"),
    ({"dataset": "hf"}, "needs dataloader.dataset_path"),
    ({"columns": {"speaker": "who"}}, r"dataloader.columns: unknown name\(s\) \['speaker'\]"),
])
def test_dataloader_config_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SkrullDataLoader.Config(**kwargs)


def test_non_utf8_is_named_by_file_and_line(tmp_path, tok):
    from skrull_ext.errors import DataError

    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"text": "fine"}\n{"text": "caf\xe9"}\n')
    with pytest.raises(DataError, match=r"latin1.jsonl:2: not UTF-8 \(byte 0xe9 at column 14\)"):
        JsonlSequences(str(path), tok)


def test_a_byte_order_mark_is_read_past_as_hf_reads_it(tmp_path, tok):
    """A file saved with a UTF-8 BOM (Windows editors) was 'not valid JSON' at line 1 under
    dataset = 'jsonl' while dataset = 'hf' read it; now both read the same records. A BOM
    further on is still the error it was."""
    from skrull_ext.data.sources.hf_source import hf_rows

    with open(FIXTURE, "rb") as f:
        body = f.read()
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + body)
    with_bom, plain = JsonlSequences(str(path), tok), JsonlSequences(FIXTURE, tok)
    assert [list(x) for x in with_bom.ids] == [list(x) for x in plain.ids]
    assert len(with_bom.ids) == sum(1 for _ in hf_rows(str(path)))
    path.write_bytes(body + b"\xef\xbb\xbf" + body.splitlines(keepends=True)[0])
    with pytest.raises(ValueError, match=r"bom.jsonl:34: not valid JSON"):
        JsonlSequences(str(path), tok)


def test_bad_records_are_skipped_counted_and_named_on_request(tmp_path, tok):
    """on_bad_record = 'skip': each class of bad record is passed over and kept
    as its one-line reason; records in = kept + bad; the good ones are the
    records an all-good file gives."""
    good = ['{"text": "a plain document of some words"}',
            '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}]}']
    bad = {
        2: b'{"text": "caf\xe9"}',
        3: b"{not json",
        4: b'{"body": "x"}',
        5: b'{"messages": [{"role": "bot", "content": "x"}]}',
        6: b'{"messages": [{"role": "user", "content": "hi"}]}',
        7: b'{"text": "a"}',  # one token: under min_len
    }
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b"\n".join([good[0].encode(), *bad.values(), good[1].encode()]) + b"\n")
    with pytest.raises(ValueError, match=r"mixed.jsonl:2: not UTF-8 .*on_bad_record = .skip. skips and counts"):
        JsonlSequences(str(path), tok)  # the default stops at the first
    src = JsonlSequences(str(path), tok, min_len=3, on_bad_record="skip")
    assert len(src) == 2 and len(src.bad) == len(bad) == 6
    assert [b.split(": ", 1)[0] for b in src.bad] == [f"{path}:{line}" for line in bad]
    for reason, want in zip(src.bad, ["not UTF-8", "not valid JSON", "no recognised columns", "unknown role 'bot'",
                                      "at least one assistant message", "fewer than dataloader.min_len 3"]):
        assert want in reason, reason
    assert src.where == [f"{path}:1", f"{path}:8"]
    clean = tmp_path / "clean.jsonl"
    clean.write_text("\n".join(good) + "\n")
    ref = JsonlSequences(str(clean), tok, min_len=3)
    assert all((a == b).all() for a, b in zip(src.ids, ref.ids)) and len(src.ids) == len(ref.ids)
    assert src.bad_summary().startswith("6 of 8 records skipped as bad (dataloader.on_bad_record = 'skip'): ")
    with pytest.raises(ValueError, match=r"dataloader.on_bad_record: 'ignore' is not 'error' or 'skip'"):
        JsonlSequences(str(clean), tok, on_bad_record="ignore")
    only_bad = tmp_path / "only_bad.jsonl"
    only_bad.write_bytes(bad[3] + b"\n")
    with pytest.raises(ValueError, match=r"only_bad.jsonl: no records left: 1 of 1 records skipped as bad"):
        JsonlSequences(str(only_bad), tok, on_bad_record="skip")


def test_the_length_limit_reads_no_tokens(tok):
    """Skrull's length limit and loss count (overlength.decide_lengths) read a
    tokenized source's lengths and loss masks only, never its token ids (with
    the token store: no token page of another rank's samples), and count what
    the built samples hold."""
    from skrull_ext.data.steps.overlength import LengthLimit, apply_limit, decide_lengths

    class Counting(JsonlSequences):
        reads = 0

        def ids_of(self, r):
            Counting.reads += 1
            return super().ids_of(r)

    src = Counting(FIXTURE, tok)
    indices = list(range(len(src)))
    limit = LengthLimit(tokens=40, mode="truncate", by="max_len")
    kept, lengths, losses, account = decide_lengths(limit, indices, src, 1)
    assert Counting.reads == 0 and account.counts.cut > 0
    built_kept, samples, _ = apply_limit(limit, indices, [src[i] for i in indices], src, 1)
    assert kept == built_kept and lengths == [s.length for s in samples]
    assert losses == [int((s.labels != IGNORE_INDEX).sum()) for s in samples]
