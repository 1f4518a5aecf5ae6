"""A CP=2 training run on a parquet file read through HF ``datasets``
(``[dataloader] dataset = "hf"``) is the JSONL run of the same records: the
real-text job (skrull_ext/jobs/debug_cpu_text.toml), 2 processes, the model
init seeded (debug.seed = 0);
the per-step losses are equal exactly (same batches, same CPU kernels)."""

import os

import pytest

from skrull_ext import assets
from tests.integration_tests.launch import REPO, losses, torchrun

JOB = os.path.join(REPO, "skrull_ext", "jobs", "debug_cpu_text.toml")
STEPS = 3


@pytest.mark.slow
def test_parquet_run_equals_the_jsonl_run(tmp_path):
    datasets = pytest.importorskip("datasets")
    cache = str(tmp_path / "hf_cache")
    parquet = str(tmp_path / "tiny_sft.parquet")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
        datasets.load_dataset("json", data_files=[assets.text_path("tiny_sft")], split="train",
                              on_mixed_types=None).to_parquet(parquet)
    runs = {}
    for name, data in (("jsonl", []), ("hf", ["--dataloader.dataset", "hf", "--dataloader.dataset_path", parquet])):
        dump = str(tmp_path / name)
        torchrun(2, "skrull_ext.train", [
            "--config-file", JOB, "--dump_folder", dump, "--training.steps", str(STEPS),
            "--parallelism.context_parallel_degree", "2", "--metrics.enable_tensorboard", "--debug.seed", "0", *data,
        ], cwd=str(tmp_path), env={"HF_DATASETS_CACHE": cache})
        runs[name] = losses(dump)
    print(f"losses {runs}")
    assert len(runs["jsonl"]) == STEPS and runs["hf"] == runs["jsonl"]
