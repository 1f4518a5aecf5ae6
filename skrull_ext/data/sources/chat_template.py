"""Chats to token ids and a loss mask, with the model's own chat template.

A chat (turns ``{"role", "content"}``, skrull_ext/data/sources/formats.py) is
rendered whole by the tokenizer's Jinja ``chat_template`` (tokenizer_config.json,
or chat_template.jinja beside it) in the environment transformers uses, with
the family's special-token strings (``bos_token``, ``eos_token``, ...) as
template variables: Llama 3 starts with ``<|begin_of_text|>`` because its
template says so, Qwen has no BOS. The rendered string is tokenized once
with the fast tokenizer, without adding special tokens (the template holds
them), exactly as ``transformers.apply_chat_template(tokenize=True)`` does.

Loss mask: for each assistant message, its content is located in the
rendered string (after the previous assistant content; where it occurs more
than once, from where the assistant's turn starts: the length of the
conversation before it rendered with ``add_generation_prompt=True``, when
that is a prefix of the whole rendering; whitespace at the content's
edges is settled by rendering once more without it, see ``JinjaChat._span``),
and every token whose character offsets overlap that span is trained on,
plus the special token right after it (``<|eot_id|>``, ``<|im_end|>``: the
model must learn to stop). Pieces are never rendered or tokenized apart, so
the mask falls on the tokens of the real rendering whatever BPE merges
across turn boundaries. A template that rewrites the content beyond
stripping whitespace (Qwen3 drops ``<think>`` blocks from earlier turns) is
matched on the stripped answer; content the template does not render at all
raises DataError.

Tokenizers without a chat template (the shipped tiny BPE, a base model's)
use ``ChatMLPieces``: ``<|im_start|>ROLE\\nCONTENT<|im_end|>\\n`` per message,
pieces encoded separately so the mask falls on token boundaries. That is a
choice the user did not make (a base model has never seen those markers),
so the first chat it encodes logs it once per process, naming the record and
the tokenizer; ``dataloader.chat_template = "chatml"`` chooses it and says
nothing.
"""

import json
import os
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.sandbox
import numpy as np
from torchtitan.tools.logging import logger

from skrull_ext.errors import DataError


class _Generation(jinja2.ext.Extension):
    """Accepts transformers' ``{% generation %}`` blocks and renders their body as is."""

    tags = {"generation"}

    def parse(self, parser):
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def compile_template(text: str) -> jinja2.Template:
    """Compile a chat template as transformers does (same environment and helpers)."""

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(text)


def _token_string(value) -> str | None:
    return value.get("content") if isinstance(value, dict) else value


def template_text(tokenizer, override: str = "") -> str | None:
    """The chat template of ``tokenizer`` (torchtitan's HuggingFaceTokenizer).

    ``override``: a .jinja file to use instead. Otherwise chat_template.jinja in
    the tokenizer folder wins over tokenizer_config.json's ``chat_template``
    (transformers' order); a list of named templates gives its ``default``.
    None: the tokenizer has none.
    """
    if override:
        try:
            with open(override, encoding="utf-8") as f:
                return f.read()
        except OSError as e:
            raise ValueError(f"dataloader.chat_template: cannot read {override!r}: {e.strerror}") from e
    folder = getattr(tokenizer, "tokenizer_path", None)
    if folder and os.path.isfile(os.path.join(folder, "chat_template.jinja")):
        with open(os.path.join(folder, "chat_template.jinja"), encoding="utf-8") as f:
            return f.read()
    text = (getattr(tokenizer, "_hf_config", None) or {}).get("chat_template")
    if isinstance(text, list):
        text = {t.get("name"): t.get("template") for t in text}.get("default")
    return text or None


def _raw_ids(tokenizer, text: str) -> list[int]:
    """Ids of ``text`` with no special tokens added."""
    fast = getattr(tokenizer, "tokenizer", None)
    if fast is not None and hasattr(fast, "encode"):
        return list(fast.encode(text, add_special_tokens=False).ids)
    return list(tokenizer.encode(text, add_bos=False, add_eos=False)) if text else []


def _family_bos(tokenizer) -> int | None:
    """The BOS id when the tokenizer's own encoding starts with one (Llama), else None (Qwen)."""
    bos = getattr(tokenizer, "bos_id", None)
    adds = getattr(tokenizer, "hf_adds_bos", False) or getattr(tokenizer, "default_add_bos", False)
    return bos if bos is not None and adds else None


def encode_text(tokenizer, text: str) -> tuple[list[int], list[bool]]:
    """A plain text, all trained on: BOS when the family adds one, the text, EOS."""
    bos = _family_bos(tokenizer)
    ids = ([bos] if bos is not None else []) + (_raw_ids(tokenizer, text) if text else [])
    eos = getattr(tokenizer, "eos_id", None)
    if eos is not None:
        ids.append(eos)
    return ids, [True] * len(ids)


class ChatMLPieces:
    """The fallback for tokenizers without a chat template: ChatML turn markers
    (Qwen's), each piece encoded on its own; loss on the assistant's content and
    end marker; BOS first when the family adds one."""

    start, end = "<|im_start|>", "<|im_end|>"

    def __init__(self, tokenizer, chosen: bool = True):
        self.tokenizer = tokenizer
        self.chosen = chosen  # False: the fallback for a tokenizer without a template, logged at the first chat

    def pieces(self, turns: list[dict]) -> list[tuple[str, bool]]:
        """(text, is_loss) pieces of a chat, in order."""
        out = []
        for m in turns:
            trained = m["role"] == "assistant"
            out += [(f"{self.start}{m['role']}\n", False), (m["content"], trained), (self.end, trained), ("\n", False)]
        return out

    def encode(self, turns: list[dict], where: str) -> tuple[list[int], list[bool]]:
        if not self.chosen:
            self._say_fallback(where)
        bos = _family_bos(self.tokenizer)
        ids, mask = ([bos], [False]) if bos is not None else ([], [])
        for text, trained in self.pieces(turns):
            piece = _raw_ids(self.tokenizer, text) if text else []
            ids += piece
            mask += [trained] * len(piece)
        return ids, mask


    def _say_fallback(self, where: str) -> None:
        folder = getattr(self.tokenizer, "tokenizer_path", None) or type(self.tokenizer).__name__
        if folder in _FALLBACK_SAID:
            return
        _FALLBACK_SAID.add(folder)
        logger.warning(f"{where}: the tokenizer ({folder}) has no chat template (tokenizer_config.json "
                       "chat_template or chat_template.jinja), so chats are rendered as ChatML "
                       "(<|im_start|>role ... <|im_end|>) (logged once; dataloader.chat_template = 'chatml' "
                       "chooses it, a .jinja file another template)")


CHATML_JINJA = (
    "{% if bos_token %}{{ bos_token }}{% endif %}{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""``ChatMLPieces`` as a chat template (the same ids, test_chat_template.py), for
the HF folders of a run that trained on it: served, the model sees its markers."""


def trained_template(tokenizer_dir: str | None, override: str, dataset: str, fmt: str) -> str | None:
    """The chat template a job's chats were rendered with when it is not the
    tokenizer folder's own (which the folder's files carry): the ``override``
    .jinja file's text, or ChatML when chosen (``"chatml"``) or fallen back to
    (a tokenizer without a template, on data that may hold chats). None: the
    tokenizer's own, or no chats."""
    if override == "chatml":
        return CHATML_JINJA
    if override:
        with open(override, encoding="utf-8") as f:
            return f.read()
    if tokenizer_dir is None or dataset == "synthetic" or fmt == "text":
        return None
    has_own = os.path.isfile(os.path.join(tokenizer_dir, "chat_template.jinja"))
    try:
        with open(os.path.join(tokenizer_dir, "tokenizer_config.json"), encoding="utf-8") as f:
            has_own = has_own or bool(json.load(f).get("chat_template"))
    except (OSError, ValueError):
        pass
    return None if has_own else CHATML_JINJA


_FALLBACK_SAID: set[str] = set()
"""Tokenizers whose ChatML fallback was already logged (ChatMLPieces._say_fallback)."""


class JinjaChat:
    """A tokenizer's own chat template; masks from the rendered string's spans."""

    def __init__(self, text: str, tokenizer):
        fast = getattr(tokenizer, "tokenizer", None)
        if fast is None or not hasattr(fast, "get_added_tokens_decoder"):
            raise ValueError("a chat template needs a HF fast tokenizer ([tokenizer] kind = \"hf\")")
        self.fast = fast
        self.template = compile_template(text)
        config = getattr(tokenizer, "_hf_config", None) or {}
        self.variables = {k: s for k in ("bos_token", "eos_token", "unk_token", "pad_token")
                          if (s := _token_string(config.get(k))) is not None}
        self.special_ids = {i for i, t in fast.get_added_tokens_decoder().items() if t.special}

    def render(self, turns: list[dict], add_generation_prompt: bool = False) -> str:
        return self.template.render(messages=turns, tools=None, documents=None,
                                    add_generation_prompt=add_generation_prompt, **self.variables)

    def _anchor(self, turns: list[dict], k: int, rendered: str) -> int | None:
        """Where assistant turn ``k``'s output starts: the end of the conversation
        before it with the generation prompt, when that is a prefix of the whole."""
        try:
            prefix = self.render(turns[:k], add_generation_prompt=True)
        except Exception:  # a template may refuse a partial chat (no user turn yet); only a hint
            return None
        return len(prefix) if rendered.startswith(prefix) else None

    def _with_content(self, turns: list[dict], k: int, content: str) -> str:
        return self.render(turns[:k] + [{**turns[k], "content": content}] + turns[k + 1:])

    def _span(self, turns: list[dict], k: int, rendered: str, start: int, where: str) -> tuple[int, int]:
        """Assistant turn ``k``'s content span in ``rendered``, searched from ``start``.

        The stripped content is found first (templates may trim it, Llama's
        does). Whitespace at its edges is the content's only where the template
        renders it: the chat is rendered again with that whitespace removed, and
        the span edge is where the two renderings diverge (Qwen3's own blank
        line before an answer stays out, Qwen2.5's rendered newline goes in).
        """
        content = turns[k]["content"]
        for core in dict.fromkeys((content.strip(), content.split("</think>")[-1].strip())):
            pos = rendered.find(core, start) if core else -1
            if pos >= 0:
                break
        else:
            raise DataError(f"{where}: the chat template does not render message {k} (assistant)'s "
                            "content (stripped or not); cannot place its loss")
        s, e = pos, pos + len(core)
        if content != content.lstrip() and core == content.strip():
            alt = self._with_content(turns, k, content.lstrip())
            if alt != rendered:
                s = next((i for i in range(start, pos) if rendered[i] != alt[i]), pos)
        if content != content.rstrip():
            alt = self._with_content(turns, k, content.rstrip())
            delta = len(rendered) - len(alt)
            if alt != rendered and delta > 0:
                e = next((j for j in range(e, e + delta + 1) if rendered[j:] == alt[j - delta:]), e)
        return s, e

    def spans(self, turns: list[dict], rendered: str, where: str) -> list[tuple[int, int]]:
        """Character spans of the assistant contents in ``rendered``, in order."""
        out, cursor = [], 0
        for k, turn in enumerate(turns):
            if turn["role"] != "assistant":
                continue
            start = cursor
            if rendered.count(turn["content"].strip(), cursor) != 1:  # ambiguous (or absent): where the turn starts
                anchor = self._anchor(turns, k, rendered)
                start = max(cursor, anchor if anchor is not None else cursor)
            s, e = self._span(turns, k, rendered, start, where)
            out.append((s, e))
            cursor = e
        return out

    def encode(self, turns: list[dict], where: str) -> tuple[list[int], list[bool]]:
        try:
            rendered = self.render(turns)
        except Exception as e:  # raise_exception() in the template, or a type error inside it
            raise DataError(f"{where}: the chat template refused the chat: {type(e).__name__}: {e}") from e
        enc = self.fast.encode(rendered, add_special_tokens=False)
        ids = list(enc.ids)
        offsets = np.asarray(enc.offsets, dtype=np.int64).reshape(-1, 2)
        mask = np.zeros(len(ids), dtype=bool)
        for s, e in self.spans(turns, rendered, where):
            hit = np.flatnonzero((offsets[:, 0] < e) & (offsets[:, 1] > s))
            if hit.size == 0:
                continue
            mask[hit[0]:hit[-1] + 1] = True
            nxt = hit[-1] + 1
            if nxt < len(ids) and ids[nxt] in self.special_ids and offsets[nxt, 0] == e:
                mask[nxt] = True
        return ids, mask.tolist()


def chat_encoder(tokenizer, override: str = ""):
    """``JinjaChat`` on the tokenizer's (or ``override``'s) template; ``ChatMLPieces``
    when there is none or ``override == "chatml"``."""
    if override == "chatml":
        return ChatMLPieces(tokenizer)
    text = template_text(tokenizer, override)
    return JinjaChat(text, tokenizer) if text else ChatMLPieces(tokenizer, chosen=False)
