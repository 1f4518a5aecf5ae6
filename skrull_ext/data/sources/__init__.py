"""Where records come from: the sources (synthetic lengths, JSONL and HF text through the
token store, mixtures), record formats and chat templates, tokenizers, and the data keys' checks."""
