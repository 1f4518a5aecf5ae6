"""Tokenizer folders for the chat-template tests: the real chat templates of
Llama 3.1 Instruct, Qwen2.5 Instruct and Qwen3 (tests/assets/chat_templates,
the text of their tokenizer_config.json ``chat_template``), with each family's
special tokens, BOS/EOS settings, pre-tokenizer split and post-processor, on
the shipped tiny BPE vocabulary (the real 128K/151K vocabularies are not
shipped; merges only change which ids a span gets, not where it lies).
"""

import json
import os

from skrull_ext import assets

TEMPLATES = os.path.join(os.path.dirname(__file__), "..", "assets", "chat_templates")

_LLAMA_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}

FAMILIES = {
    "llama3_1": {
        "template": "llama3_1_instruct.jinja",
        "special": ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                    "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"],
        "plain": [],
        "config": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
        "split": _LLAMA_SPLIT,
        "normalizer": None,
        "bos_template": "<|begin_of_text|>",
    },
    "qwen2_5": {
        "template": "qwen2_5_instruct.jinja",
        "special": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        "plain": [],
        "config": {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "add_bos_token": False},
        "split": _QWEN_SPLIT,
        "normalizer": {"type": "NFC"},
        "bos_template": None,
    },
    "qwen3": {
        "template": "qwen3.jinja",
        "special": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        "plain": ["<think>", "</think>"],
        "config": {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "add_bos_token": False},
        "split": _QWEN_SPLIT,
        "normalizer": {"type": "NFC"},
        "bos_template": None,
    },
}


def template(family: str) -> str:
    with open(os.path.join(TEMPLATES, FAMILIES[family]["template"]), encoding="utf-8") as f:
        return f.read()


def write_family(folder: str, family: str, *, with_template: bool = True) -> str:
    """A tokenizer folder (tokenizer.json, tokenizer_config.json) of ``family``."""
    spec = FAMILIES[family]
    with open(os.path.join(assets.tokenizer_path("tiny_bpe"), "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    base = tok["model"]["vocab"]
    next_id = max(base.values()) + 1
    added = []
    for content, special in [(c, True) for c in spec["special"]] + [(c, False) for c in spec["plain"]]:
        added.append({"id": next_id, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
                      "normalized": False, "special": special})
        next_id += 1
    tok["added_tokens"] = added
    tok["normalizer"] = spec["normalizer"]
    tok["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": spec["split"]}, "behavior": "Isolated", "invert": False}, _BYTE_LEVEL]}
    tok["decoder"] = _BYTE_LEVEL
    if spec["bos_template"]:
        bos = spec["bos_template"]
        bos_id = next(a["id"] for a in added if a["content"] == bos)
        tok["post_processor"] = {"type": "Sequence", "processors": [_BYTE_LEVEL, {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}}}]}
    else:
        tok["post_processor"] = _BYTE_LEVEL
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok, f)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 131072,
              "added_tokens_decoder": {str(a["id"]): {k: v for k, v in a.items() if k != "id"} for a in added},
              **spec["config"]}
    if with_template:
        config["chat_template"] = template(family)
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=1)
    return folder


def _replace(text: str, old: str, new: str) -> str:
    assert old in text, f"generation-marker anchor not found: {old!r}"
    return text.replace(old, new)


def with_generation_markers(family: str) -> str:
    """The reference's copy of the template: the same text with transformers'
    ``{% generation %}`` blocks around each assistant message's content and its
    end-of-turn token (nothing else changes what is rendered)."""
    text = template(family)
    if family == "llama3_1":
        return _replace(
            text,
            r"""{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}""",
            r"""{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}"""
            r"""{%- if message['role'] == 'assistant' %}{% generation %}{{- message['content'] | trim + '<|eot_id|>' }}{% endgeneration %}"""
            r"""{%- else %}{{- message['content'] | trim + '<|eot_id|>' }}{%- endif %}""")
    if family == "qwen2_5":
        return _replace(
            text,
            r"""{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}""",
            r"""{{- '<|im_start|>' + message.role + '\n' }}"""
            r"""{%- if message.role == 'assistant' %}{% generation %}{{- message.content + '<|im_end|>' }}{% endgeneration %}"""
            r"""{%- else %}{{- message.content + '<|im_end|>' }}{%- endif %}{{- '\n' }}""")
    text = _replace(text, r"""+ '\n</think>\n\n' + content.lstrip('\n') }}""",
                    r"""+ '\n</think>\n\n' }}{% generation %}{{- content.lstrip('\n') }}{% endgeneration %}""")
    text = _replace(text, r"""{{- '<|im_start|>' + message.role + '\n' + content }}""",
                    r"""{{- '<|im_start|>' + message.role + '\n' }}{% generation %}{{- content }}{% endgeneration %}""")
    return _replace(text, "        {%- endif %}\n        {{- '<|im_end|>\\n' }}\n    {%- elif message.role == \"tool\" %}",
                    "        {%- endif %}\n        {% generation %}{{- '<|im_end|>' }}{% endgeneration %}{{- '\\n' }}\n"
                    "    {%- elif message.role == \"tool\" %}")
