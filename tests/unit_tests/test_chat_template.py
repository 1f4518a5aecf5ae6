"""Chat templates: token ids and loss masks against transformers.

The reference is ``transformers``' ``apply_chat_template(..., tokenize=True,
return_dict=True, return_assistant_tokens_mask=True)`` on the same tokenizer
folder. transformers can only mask what the template marks with
``{% generation %}``, which the real templates lack: the reference renders a
copy of the template with those markers around each assistant message's
content and its end-of-turn token (``chat_families.with_generation_markers``,
which changes nothing else in the rendered text), while skrull-ext renders
the unmarked real template and finds the spans itself. Ids and masks must be
equal token for token, for Llama 3.1 Instruct, Qwen2.5 Instruct and Qwen3.
"""

import pytest

from skrull_ext.data.sources.chat_template import ChatMLPieces, JinjaChat, chat_encoder
from skrull_ext.data.sources.formats import RecordReader
from skrull_ext.data.sources.tokenizer import LocalTokenizer
from skrull_ext.errors import DataError
from tests.unit_tests.chat_families import FAMILIES, with_generation_markers, write_family

transformers = pytest.importorskip("transformers")

CHATS = {
    "one_turn": [{"role": "user", "content": "How long should I boil an egg?"},
                 {"role": "assistant", "content": "About six minutes for a soft yolk."}],
    "system_two_turns": [
        {"role": "system", "content": "You answer briefly."},
        {"role": "user", "content": "Capital of Norway?"},
        {"role": "assistant", "content": "Oslo."},
        {"role": "user", "content": "And of Sweden?"},
        {"role": "assistant", "content": "Stockholm."}],
    "whitespace_edges": [{"role": "user", "content": "  Say hi.\n"},
                         {"role": "assistant", "content": "\n  Hi there!\n\n"}],
    "answer_echoes_the_prompt": [  # the assistant's text also occurs earlier: its span must be its own turn's
        {"role": "system", "content": "Reply yes or no. yes"},
        {"role": "user", "content": "yes"},
        {"role": "assistant", "content": "yes"},
        {"role": "user", "content": "yes or no?"},
        {"role": "assistant", "content": "no"}],
    "unicode": [{"role": "user", "content": "Cafe\u0301 ou caf\u00e9? \u4e2d\u6587 \U0001f600"},
                {"role": "assistant", "content": "Both spell caf\u00e9 \u2014 d\u00e9j\u00e0 vu \U0001f600."}],
    "ends_on_user": [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi."},
                     {"role": "user", "content": "Bye"}],
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    folder = write_family(str(tmp_path_factory.mktemp(request.param)), request.param)
    ours = LocalTokenizer.Config(path=folder).build(tokenizer_path="")
    ref = transformers.AutoTokenizer.from_pretrained(folder)
    return request.param, ours, ref


def _reference(ref, family: str, turns: list[dict]):
    out = ref.apply_chat_template(turns, chat_template=with_generation_markers(family), tokenize=True,
                                  return_dict=True, return_assistant_tokens_mask=True)
    return list(out["input_ids"]), [bool(m) for m in out["assistant_masks"]]


@pytest.mark.parametrize("chat", sorted(CHATS))
def test_chat_template_ids_and_masks_equal_transformers(family, chat):
    name, ours, ref = family
    turns = CHATS[chat]
    encoder = chat_encoder(ours)
    assert isinstance(encoder, JinjaChat)
    ids, mask = encoder.encode(turns, "test")
    want_ids, want_mask = _reference(ref, name, turns)
    assert ids == want_ids
    assert mask == want_mask
    # Not vacuous: every assistant turn is trained on, nothing else is.
    trained = ours.decode([i for i, m in zip(ids, mask) if m], skip_special_tokens=False)
    end = "<|eot_id|>" if name == "llama3_1" else "<|im_end|>"
    n_assistant = sum(t["role"] == "assistant" for t in turns)
    assert trained.count(end) == n_assistant and 0 < sum(mask) < len(mask)
    for t in turns:
        if t["role"] == "assistant":
            assert t["content"].strip() in trained


def test_chat_template_bos_as_the_family_expects(family):
    name, ours, _ = family
    ids, _ = chat_encoder(ours).encode(CHATS["one_turn"], "test")
    bos = ours.tokenizer.token_to_id("<|begin_of_text|>")
    if name == "llama3_1":
        assert ids[0] == bos and ids.count(bos) == 1
    else:
        assert ours.tokenizer.id_to_token(ids[0]) == "<|im_start|>"


def test_chat_template_qwen3_history_drops_thinking(tmp_path):
    """Qwen3 renders an earlier turn's ``<think>`` block away: the answer after it is still located."""
    folder = write_family(str(tmp_path / "q3"), "qwen3")
    ours = LocalTokenizer.Config(path=folder).build(tokenizer_path="")
    ref = transformers.AutoTokenizer.from_pretrained(folder)
    turns = [{"role": "user", "content": "2+2?"},
             {"role": "assistant", "content": "<think>\nadd them\n</think>\n\nIt is 4."},
             {"role": "user", "content": "3+3?"},
             {"role": "assistant", "content": "It is 6."}]
    ids, mask = chat_encoder(ours).encode(turns, "test")
    assert (ids, mask) == _reference(ref, "qwen3", turns)
    assert "add them" not in ours.decode(ids)


def test_chat_template_system_prompt_default_per_job(family):
    name, ours, ref = family
    reader = RecordReader(system_prompt="Be terse.")
    turns = reader({"messages": CHATS["one_turn"]}, "row")
    assert turns[0] == {"role": "system", "content": "Be terse."}
    ids, mask = chat_encoder(ours).encode(turns, "row")
    assert (ids, mask) == _reference(ref, name, turns)
    assert "Be terse." in ours.decode(ids)
    kept = reader({"messages": CHATS["system_two_turns"]}, "row")
    assert kept == CHATS["system_two_turns"]  # a chat's own system turn wins


def test_no_template_falls_back_to_chatml_pieces(tmp_path):
    folder = write_family(str(tmp_path / "plain"), "qwen2_5", with_template=False)
    ours = LocalTokenizer.Config(path=folder).build(tokenizer_path="")
    encoder = chat_encoder(ours)
    assert isinstance(encoder, ChatMLPieces)
    ids, mask = encoder.encode(CHATS["one_turn"], "row")
    # Same string as the ChatML template would give, and the same loss tokens.
    assert ours.decode(ids, skip_special_tokens=False) == (
        "<|im_start|>user\nHow long should I boil an egg?<|im_end|>\n"
        "<|im_start|>assistant\nAbout six minutes for a soft yolk.<|im_end|>\n")
    assert ours.decode([i for i, m in zip(ids, mask) if m], skip_special_tokens=False) == (
        "About six minutes for a soft yolk.<|im_end|>")


def test_fallback_puts_one_bos_first_for_a_bos_family(tmp_path):
    """A Llama tokenizer without a template (a base model): BOS once, not before every piece."""
    folder = write_family(str(tmp_path / "base"), "llama3_1", with_template=False)
    ours = LocalTokenizer.Config(path=folder).build(tokenizer_path="")
    ids, mask = chat_encoder(ours).encode(CHATS["system_two_turns"], "row")
    bos = ours.tokenizer.token_to_id("<|begin_of_text|>")
    assert ids[0] == bos and ids.count(bos) == 1 and not mask[0]


def test_template_override_file_and_chatml(tmp_path, family):
    name, ours, _ = family
    assert isinstance(chat_encoder(ours, "chatml"), ChatMLPieces)
    path = tmp_path / "t.jinja"
    path.write_text("{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}")
    ids, mask = chat_encoder(ours, str(path)).encode(CHATS["one_turn"], "row")
    assert ours.decode([i for i, m in zip(ids, mask) if m]) == "About six minutes for a soft yolk."


def test_content_the_template_does_not_render_is_named(tmp_path, family):
    _, ours, _ = family
    path = tmp_path / "drops.jinja"
    path.write_text("{% for m in messages %}[{{ m.role }}]{% if m.role != 'assistant' %}{{ m.content }}{% endif %}"
                    "{% endfor %}")
    with pytest.raises(DataError, match=r"data.jsonl:7: the chat template does not render message 1 \(assistant\)"):
        chat_encoder(ours, str(path)).encode(CHATS["one_turn"], "data.jsonl:7")


def test_a_template_refusal_is_named(tmp_path, family):
    _, ours, _ = family
    path = tmp_path / "strict.jinja"
    path.write_text("{% if messages[0].role != 'system' %}{{ raise_exception('needs a system turn') }}{% endif %}"
                    "{% for m in messages %}{{ m.content }}{% endfor %}")
    with pytest.raises(DataError, match=r"f.parquet row 3: the chat template refused the chat: "
                                        r"TemplateError: needs a system turn"):
        chat_encoder(ours, str(path)).encode(CHATS["one_turn"], "f.parquet row 3")


def test_chat_template_jinja_file_beside_the_tokenizer_wins(tmp_path):
    """transformers' order: chat_template.jinja in the folder over tokenizer_config.json's."""
    from tests.unit_tests.chat_families import template

    folder = write_family(str(tmp_path / "q"), "qwen2_5")
    (tmp_path / "q" / "chat_template.jinja").write_text(template("qwen3"))
    ours = LocalTokenizer.Config(path=folder).build(tokenizer_path="")
    ids, _ = chat_encoder(ours).encode(CHATS["one_turn"], "row")
    assert "<think>" in ours.decode(ids, skip_special_tokens=False)  # Qwen3's empty think block


@pytest.mark.parametrize("name", ["qwen2_5", "llama3_1"])
@pytest.mark.parametrize("chat", sorted(CHATS))
def test_the_chatml_fallback_written_beside_the_weights_gives_the_trained_ids(tmp_path, name, chat):
    """A run that trained on the ChatML fallback writes CHATML_JINJA into its HF
    folders; served through transformers it must give the ids the run trained on."""
    from skrull_ext.data.sources.chat_template import CHATML_JINJA, trained_template

    folder = write_family(str(tmp_path / name), name, with_template=False)
    assert trained_template(folder, "", "jsonl", "auto") == CHATML_JINJA
    assert trained_template(folder, "", "jsonl", "text") is None
    ours = LocalTokenizer.Config(path=folder).build(tokenizer_path="")
    ids, _ = chat_encoder(ours).encode(CHATS[chat], "row")
    served = transformers.AutoTokenizer.from_pretrained(folder).apply_chat_template(
        CHATS[chat], chat_template=CHATML_JINJA, tokenize=True, return_dict=True)["input_ids"]
    assert list(served) == ids


def test_a_tokenizer_with_its_own_template_needs_none_written(family, tmp_path):
    from skrull_ext.data.sources.chat_template import CHATML_JINJA, trained_template

    _, ours, _ = family
    assert trained_template(ours.tokenizer_path, "", "jsonl", "auto") is None
    assert trained_template(ours.tokenizer_path, "chatml", "jsonl", "auto") == CHATML_JINJA
    path = tmp_path / "t.jinja"
    path.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    assert trained_template(ours.tokenizer_path, str(path), "jsonl", "auto") == path.read_text()
