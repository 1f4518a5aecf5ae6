"""Record formats: each shape of SFT row normalises to the same turns; bad rows
are named by where they are."""

import pytest

from skrull_ext.data.sources.formats import FORMATS, Columns, RecordReader
from skrull_ext.errors import DataError

CHAT = [{"role": "user", "content": "Capital of Norway?"}, {"role": "assistant", "content": "Oslo."}]
SYSTEM = {"role": "system", "content": "Be brief."}


@pytest.mark.parametrize("row, want", [
    ({"messages": CHAT}, CHAT),
    ({"conversations": [{"from": "human", "value": "Capital of Norway?"}, {"from": "gpt", "value": "Oslo."}]}, CHAT),
    ({"conversations": [{"from": "system", "value": "Be brief."}, {"from": "user", "value": "Capital of Norway?"},
                        {"from": "assistant", "value": "Oslo."}]}, [SYSTEM] + CHAT),
    ({"prompt": "Capital of Norway?", "response": "Oslo."}, CHAT),
    ({"prompt": "Capital of Norway?", "response": "Oslo.", "system": "Be brief."}, [SYSTEM] + CHAT),
    ({"instruction": "Capital of Norway?", "output": "Oslo."}, CHAT),
    ({"instruction": "Capital of Norway?", "input": "", "output": "Oslo."}, CHAT),
    ({"instruction": "Name the capital.", "input": "Norway", "output": "Oslo."},
     [{"role": "user", "content": "Name the capital.\n\nNorway"}, CHAT[1]]),
    ({"text": "Just a document."}, "Just a document."),
    # auto: a null counts as absent (parquet rows of a mixed file carry every column)
    ({"text": None, "messages": CHAT, "prompt": None}, CHAT),
    ({"text": "doc", "messages": None}, "doc"),
])
def test_every_format_normalises_to_turns(row, want):
    assert RecordReader()(row, "f:1") == want


def test_registry_order_is_the_auto_order_and_each_format_can_be_forced():
    assert list(FORMATS) == ["messages", "sharegpt", "prompt_response", "alpaca", "text"]
    row = {"messages": CHAT, "text": "also a text"}
    assert RecordReader()(row, "f:1") == CHAT
    assert RecordReader(format="text")(row, "f:1") == "also a text"
    with pytest.raises(DataError, match=r"f:3: dataloader.format 'sharegpt' needs column\(s\) \['conversations'\]"):
        RecordReader(format="sharegpt")(row, "f:3")


def test_columns_rename_the_canonical_names():
    cols = Columns({"prompt": "question", "response": "answer", "system": "persona"})
    reader = RecordReader(columns=cols)
    assert reader({"question": "Capital of Norway?", "answer": "Oslo.", "persona": "Be brief."}, "r") == [SYSTEM] + CHAT
    sharegpt = RecordReader(columns=Columns({"conversations": "dialog", "from": "speaker", "value": "text"}))
    assert sharegpt({"dialog": [{"speaker": "human", "text": "Capital of Norway?"},
                                {"speaker": "gpt", "text": "Oslo."}]}, "r") == CHAT
    texts = RecordReader(columns=Columns(text_field="body"))
    assert texts({"body": "doc"}, "r") == "doc"
    with pytest.raises(ValueError, match=r"dataloader.columns: unknown name\(s\) \['answer'\]"):
        Columns({"answer": "x"})


def test_system_prompt_default_only_where_a_chat_has_none():
    reader = RecordReader(system_prompt="Be brief.")
    assert reader({"messages": CHAT}, "r") == [SYSTEM] + CHAT
    own = [{"role": "system", "content": "Be long."}] + CHAT
    assert reader({"messages": own}, "r") == own
    assert reader({"text": "doc"}, "r") == "doc"


@pytest.mark.parametrize("row, message", [
    ({"body": "x"}, r"data.parquet row 4: no recognised columns \(the row has \['body'\]\)"),
    ([1, 2], r"data.parquet row 4: expected a JSON object, got list"),
    ({"messages": [{"role": "bot", "content": "x"}]}, r"row 4: messages\[0\] has unknown role 'bot'"),
    ({"conversations": [{"from": "robot", "value": "x"}]}, r"row 4: conversations\[0\] has unknown role 'robot'"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "  \n"}]},
     r"row 4: message 1 \(assistant\) is empty"),
    ({"prompt": "hi", "response": ""}, r"row 4: message 1 \(assistant\) is empty"),
    ({"messages": [{"role": "user", "content": "hi"}]}, r"row 4: a chat needs at least one assistant message"),
    ({"messages": []}, r"row 4: 'messages' must be a non-empty list"),
    ({"messages": [{"role": "user", "content": 3}]}, r"row 4: messages\[0\].content must be a string, got int"),
    ({"text": 5}, r"row 4: 'text' must be a string, got int"),
])
def test_bad_rows_are_named(row, message):
    with pytest.raises(DataError, match=message):
        RecordReader()(row, "data.parquet row 4")
