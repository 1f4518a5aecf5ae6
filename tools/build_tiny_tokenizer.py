"""Rebuild the shipped tiny BPE tokenizer from the shipped text fixture.

    python tools/build_tiny_tokenizer.py

Writes skrull_ext/assets/tokenizers/tiny_bpe/{tokenizer.json,tokenizer_config.json}:
a byte-level BPE (any text encodes; unseen characters fall back to bytes)
trained on skrull_ext/assets/text/tiny_sft.jsonl, with ChatML-style special
tokens. It exists so the real-text path (JSONL -> HF tokenizer -> Skrull
buffers) runs and is tested with no download; its vocabulary (1024) fits
the llama3 debug model's 2048.
"""

import json
import os

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
FIXTURE = os.path.join(REPO, "skrull_ext", "assets", "text", "tiny_sft.jsonl")
OUT = os.path.join(REPO, "skrull_ext", "assets", "tokenizers", "tiny_bpe")
SPECIAL = ["<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # <|pad|> gets id 0
VOCAB = 1024


def texts():
    with open(FIXTURE, encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            if "text" in record:
                yield record["text"]
            for m in record.get("messages", []):
                yield m["role"]
                yield m["content"]


def main() -> None:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts(), trainer=trainer)
    os.makedirs(OUT, exist_ok=True)
    tok.save(os.path.join(OUT, "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|endoftext|>",
        "pad_token": "<|pad|>",
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": 32768,
    }
    with open(os.path.join(OUT, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    print(f"wrote {OUT}: vocab {tok.get_vocab_size()}")


if __name__ == "__main__":
    main()
