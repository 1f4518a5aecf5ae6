"""Data for skrull-ext runs: the sources (synthetic tokens following a shipped
length distribution, JSONL and HF text through the token store, mixtures),
the tokenizers, the per-rank buffers and the dataloaders that feed torchtitan.

``python -m skrull_ext.prepare JOB.toml`` (skrull_ext/prepare.py, at the
package root: it reads a whole job) tokenizes a job's text source once, ahead
of torchrun (docs/data.md)."""
