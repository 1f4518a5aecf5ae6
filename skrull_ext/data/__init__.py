"""``python -m skrull_ext.data prepare JOB.toml``: tokenize a job's text source once (docs/data.md)."""
