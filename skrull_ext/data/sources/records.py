"""One data row -> (token ids, loss mask): a record format, then the chat template.

The sources (skrull_ext/data/sources/text.py for JSONL, hf_source.py for HF
``datasets``) call a ``RecordEncoder`` on every row; it is the one place a
row becomes tokens, so a JSONL file and a parquet file of the same records
give the same samples.
"""

from dataclasses import dataclass

from skrull_ext.data.sources.chat_template import chat_encoder, encode_text
from skrull_ext.data.sources.formats import Columns, RecordReader


@dataclass
class RecordEncoder:
    """``(row, where) -> (ids, mask)``; mask True: the token is predicted (trained)."""

    reader: RecordReader
    tokenizer: object
    chat_template: str = ""
    """'' : the tokenizer's own template (ChatML pieces without one); 'chatml'; or a .jinja file."""

    def __post_init__(self):
        self.chat = chat_encoder(self.tokenizer, self.chat_template)

    def __call__(self, row, where: str) -> tuple[list[int], list[bool]]:
        record = self.reader(row, where)
        if isinstance(record, str):
            return encode_text(self.tokenizer, record)
        return self.chat.encode(record, where)

    @classmethod
    def from_config(cls, config, tokenizer) -> "RecordEncoder":
        """From a ``[dataloader]`` section (format, columns, text_field, system_prompt, chat_template)."""
        reader = RecordReader(
            format=config.format,
            columns=Columns(config.columns, text_field=config.text_field),
            system_prompt=config.system_prompt or None,
        )
        return cls(reader, tokenizer, config.chat_template)
