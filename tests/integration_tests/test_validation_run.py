"""Validation loss under Skrull (issue 27, ``test_validation_*``), 2 processes at CP 2.

The shipped text job (tiny llama3, tiny_sft.jsonl) trains 4 steps with
``[validation]`` on tests/fixtures/held_out.jsonl (10 chats and documents,
one of 441 tokens: over one rank's bucket of 256, so the plan shards it over
both CP ranks and its loss is computed by distributed attention), evaluated at
steps 2 and 4, the best step's model kept as a HF folder; the same job runs
without validation. Both save the last step as a HF folder.

- the logged ``validation/loss`` of the best step equals a 1-process
  reference: transformers' forward of the best folder (and of the last
  step's folder for step 4) over each held-out sample on its own, token
  losses summed in float64 over the samples' loss tokens, within 1e-5;
- the run with validation logs bitwise the training losses of the run
  without, and its last weights are bitwise the same.
"""

import dataclasses
import glob
import json
import os

import pytest
import torch

from skrull_ext.data.steps.base import DATASETS
from skrull_ext.train.job.job_file import load_job
from skrull_ext.train.validation import BEST_FOLDER
from tests.integration_tests.launch import REPO, Run, torchrun

JOB = os.path.join(REPO, "skrull_ext", "jobs", "debug_cpu_text.toml")
HELD_OUT = os.path.join(REPO, "tests", "fixtures", "held_out.jsonl")
STEPS = 4
TOL = 1e-5
VALIDATION = ["--validation.enable", "--validation.dataset_path", HELD_OUT, "--validation.freq", "2",
              "--validation.keep_best"]


def _launch(workdir: str, name: str, extra: list[str]) -> Run:
    dump = os.path.join(workdir, name)
    proc = torchrun(2, "skrull_ext.train", [
        "--config-file", JOB, "--dump_folder", dump, "--training.steps", str(STEPS),
        "--parallelism.context_parallel_degree", "2", "--metrics.enable_tensorboard",
        "--checkpoint.enable", "--checkpoint.interval", "1000", "--checkpoint.last_save_in_hf", *extra,
    ], cwd=workdir)
    return Run(dump=dump, output=proc.stdout + proc.stderr, grads=None)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Run]:
    workdir = str(tmp_path_factory.mktemp("validation"))
    return {"validated": _launch(workdir, "validated", VALIDATION), "plain": _launch(workdir, "plain", [])}


def _held_out_samples() -> list:
    """The held-out samples, tokenized by the job's own data source (as the run read them)."""
    job = load_job(JOB)
    data = dataclasses.replace(job.dataloader, dataset_path=HELD_OUT, token_cache=False)
    source = DATASETS[data.dataset](data, job.tokenizer.build(tokenizer_path=""))
    return [source[i] for i in range(len(source))]


def _reference_loss(folder: str, samples: list) -> float:
    """transformers' loss of the held-out set: each sample on its own, token losses
    (the sample's own labels: loss on assistant turns only) summed over all samples
    and divided by their loss tokens."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager").eval()
    total, tokens = torch.zeros((), dtype=torch.float64), 0
    with torch.no_grad():
        for s in samples:
            logits = model(input_ids=s.input.unsqueeze(0)).logits[0].double()
            total += torch.nn.functional.cross_entropy(logits, s.labels, ignore_index=-100, reduction="sum")
            tokens += int((s.labels != -100).sum())
    return float(total) / tokens


@pytest.mark.slow
def test_validation_loss_matches_reference(runs):
    run = runs["validated"]
    logged = run.scalars("validation/loss")
    assert len(logged) == 2, f"validation at steps 2 and 4 expected, got {logged}"
    # Its time is a phase of its own (train/step_phases.py), at the two steps it ran, not the log's.
    val_ms = run.scalars("skrull/phase_val_ms")
    assert len(val_ms) == 2 and min(val_ms) > 0, val_ms
    with pytest.raises(KeyError):
        runs["plain"].scalars("skrull/phase_val_ms")
    samples = _held_out_samples()
    assert max(s.length for s in samples) > 256  # one sample is sharded over the CP group
    tokens = sum(int((s.labels != -100).sum()) for s in samples)
    assert run.scalars("validation/loss_tokens") == [float(tokens)] * 2  # nothing cut at CP 2 (limit 512)

    best = os.path.join(run.dump, BEST_FOLDER)
    with open(os.path.join(best, "validation.json")) as f:
        kept = json.load(f)
    assert abs(kept["loss"] - min(logged)) < 1e-6  # TensorBoard keeps float32
    # The best step's folder (written by validation) and the last step's (torchtitan's last save).
    for step, folder in ((kept["step"], best), (STEPS, os.path.join(run.dump, "checkpoint", f"step-{STEPS}"))):
        want = _reference_loss(folder, samples)
        got = logged[step // 2 - 1]
        print(f"validation loss at step {step}: logged {got:.7f}, reference {want:.7f} (diff {abs(got - want):.3g})")
        assert abs(got - want) <= TOL
    # The best folder's config.json is the model's (context 131072 beside rope_scaling's 8192), as the last
    # save's: it was written from the spec after torchtitan shrank the RoPE cache to 512, and transformers warned.
    configs = []
    for folder in (best, os.path.join(run.dump, "checkpoint", f"step-{STEPS}")):
        with open(os.path.join(folder, "config.json")) as f:
            configs.append(json.load(f))
    assert configs[0]["max_position_embeddings"] == configs[1]["max_position_embeddings"] == 131072
    assert configs[0] == configs[1]
    lines = [line.split(" - ")[-1] for line in run.output.splitlines() if "INFO - validation step" in line]
    print("\n".join(lines))
    assert len(lines) == 2 and lines[-1].startswith(f"validation step {STEPS}: loss")


@pytest.mark.slow
def test_validation_changes_no_training(runs):
    validated, plain = runs["validated"], runs["plain"]
    assert validated.losses == plain.losses, f"{validated.losses} vs {plain.losses}"
    assert len(plain.losses) == STEPS
    a, b = (sorted(glob.glob(os.path.join(r.dump, "checkpoint", f"step-{STEPS}", "*.safetensors")))
            for r in (validated, plain))
    assert a and [os.path.basename(p) for p in a] == [os.path.basename(p) for p in b]
    for pa, pb in zip(a, b):
        with open(pa, "rb") as fa, open(pb, "rb") as fb:
            assert fa.read() == fb.read(), f"{os.path.basename(pa)}: the last weights differ with validation on"
    assert not os.path.exists(os.path.join(plain.dump, BEST_FOLDER))
