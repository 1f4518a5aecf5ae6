"""A file-free tokenizer for synthetic-token runs.

torchtitan's Trainer always builds a tokenizer from ``hf_assets_path``. The
synthetic dataset needs none, and the CPU debug job must run without
downloads, so this stands in: it only reports the vocabulary size (and maps
text to bytes, for completeness).
"""

from dataclasses import dataclass

from torchtitan.components.tokenizer import BaseTokenizer


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
