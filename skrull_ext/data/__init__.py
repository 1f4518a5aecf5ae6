"""Data for skrull-ext runs, in two rooms: ``sources`` (where records come from:
synthetic tokens following a shipped length distribution, JSONL and HF text
through the token store, mixtures, JSON array files; record formats, chat
templates, tokenizers) and ``steps`` (how steps are built from them: the
dataloaders that feed torchtitan, look-ahead windows, the length limit and
its counts, the per-rank buffers).

``python -m skrull_ext.prepare JOB.toml`` (skrull_ext/prepare.py, at the
package root: it reads a whole job) tokenizes a job's text source once, ahead
of torchrun (docs/data.md)."""
