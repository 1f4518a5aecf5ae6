"""Tokenizers a job's ``[tokenizer]`` section can pick (``kind``).

``synthetic``: a file-free stand-in. torchtitan's Trainer always builds a
tokenizer from ``hf_assets_path``; the synthetic dataset needs none, and the
CPU debug job must run without downloads, so this reports the vocabulary
size (and maps text to bytes, which also makes a byte-level JSONL run work).

``hf``: a local HF ``tokenizers`` file (tokenizer.json), through torchtitan's
HuggingFaceTokenizer; the real-text path.
"""

from dataclasses import dataclass

from torchtitan.components.tokenizer import BaseTokenizer, HuggingFaceTokenizer

from skrull_ext import assets


class SyntheticTokenizer(BaseTokenizer):
    @dataclass(kw_only=True, slots=True)
    class Config(BaseTokenizer.Config):
        vocab_size: int = 2048
        """Must equal the model's vocabulary size."""

    def __init__(self, config: Config, *, tokenizer_path: str | None = None):
        super().__init__()
        if config.vocab_size < 258:
            raise ValueError("tokenizer.vocab_size must be >= 258 (bytes + pad + eos)")
        self.vocab_size = config.vocab_size
        self.eos_id = 257

    def encode(self, text: str, *args, **kwargs) -> list[int]:
        # Byte b -> id b + 1 (id 0 is padding).
        return [b + 1 for b in text.encode("utf-8")]

    def decode(self, ids: list[int], *args, **kwargs) -> str:
        return bytes(i - 1 for i in ids if 1 <= i <= 256).decode("utf-8", "replace")

    def get_vocab_size(self) -> int:
        return self.vocab_size


class LocalTokenizer(HuggingFaceTokenizer):
    """torchtitan's HuggingFaceTokenizer on a folder named in the job file.

    torchtitan reads the tokenizer from ``hf_assets_path``, a path relative
    to where the job is launched. ``path`` may instead name a tokenizer
    shipped in ``skrull_ext/assets/tokenizers`` (``tiny_bpe``), so a job file
    runs from any directory with no download.
    """

    @dataclass(kw_only=True, slots=True)
    class Config(HuggingFaceTokenizer.Config):
        path: str = ""
        """Tokenizer folder (tokenizer.json, tokenizer_config.json) or a shipped name; empty: hf_assets_path."""

    def __init__(self, config: Config, *, tokenizer_path: str):
        super().__init__(config, tokenizer_path=assets.tokenizer_path(config.path or tokenizer_path))
