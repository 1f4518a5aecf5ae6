"""[validation] (skrull_ext/train/validation.py): when a step is evaluated, how the held-out
set is batched, and the job checks that refuse a validation that cannot run, each one
line naming the key. The 2-process runs are tests/integration_tests/test_validation_run.py."""

import os

import pytest

from skrull_ext.errors import JobFileError
from skrull_ext.train.job.job_file import load_config
from skrull_ext.train.validation import HeldOut, ValidationConfig

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
DEBUG = os.path.join(ROOT, "skrull_ext", "jobs", "debug_cpu.toml")
TEXT = os.path.join(ROOT, "skrull_ext", "jobs", "debug_cpu_text.toml")
HELD_OUT = os.path.join(ROOT, "tests", "fixtures", "held_out.jsonl")


def test_validation_is_due_every_freq_steps_and_at_the_last():
    every = ValidationConfig(enable=True, freq=3)
    assert [s for s in range(1, 11) if every.due(s, 10)] == [3, 6, 9, 10]
    last = ValidationConfig(enable=True)
    assert [s for s in range(1, 11) if last.due(s, 10)] == [10]
    assert not ValidationConfig(freq=1).due(10, 10)  # off


def test_validation_batches_cover_the_held_out_samples_once():
    class Source:
        def length(self, i):
            return 10 + i

    held = HeldOut(Source(), 10)
    batches = [held.global_batch(k, 4) for k in (1, 2, 3)]
    assert batches == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert held.length(9) == 19  # the rest is the source's


BAD = [
    (TEXT, ["--validator.enable"], "validator.enable = True: torchtitan's validator feeds batches the DACP "
                                   "attention cannot take; a Skrull job sets [validation] enable = true"),
    (TEXT, ["--validation.enable"], "validation.dataset_path = '': the held-out data"),
    (TEXT, ["--validation.enable", "--validation.dataset_path", "/nonexistent/held.jsonl"],
     "validation.dataset_path = '/nonexistent/held.jsonl'"),
    (TEXT, ["--validation.enable", "--validation.dataset", "hf", "--validation.dataset_path", "/nonexistent/d"],
     "validation.dataset_path = '/nonexistent/d': is not a local file or folder"),
    (TEXT, ["--validation.enable", "--validation.dataset_path", HELD_OUT, "--skrull.no-enable"],
     "validation.enable = True: needs skrull.enable = true"),
    (DEBUG, ["--validation.enable"], "validation.samples = 0: a synthetic held-out set needs a sample count"),
    (TEXT, ["--validation.freq", "-1"], "validation.freq: -1 must be an integer >= 0"),
]


@pytest.mark.parametrize("job, flags, message", BAD, ids=[" ".join(b[1]) for b in BAD])
def test_validation_bad_config_is_one_line_naming_the_key(job, flags, message, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(JobFileError) as info:
        load_config(["--config-file", job, *flags])
    text = str(info.value)
    assert message in text and "\n" not in text


def test_validation_config_passes_with_a_held_out_file(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "1")
    config = load_config(["--config-file", TEXT, "--validation.enable", "--validation.dataset_path", HELD_OUT])
    assert config.validation.enable and config.validation.dataset_path == HELD_OUT


@pytest.mark.parametrize("kept", [251, 200])
def test_validation_chunks_a_document_at_training_s_fitted_chunk(monkeypatch, kept):
    """overlength = "chunk": validation's forward chunks a held-out document as training would
    (``LengthLimit.chunk``, the memory rule's fitted chunk), not at the limit; its loss is the
    document's in one pass. The debug model on one process, a limit of 64 whose fitted chunk is 24,
    the batch builder stubbed to one batch holding the 251-token document alone, whole or cut to
    200 (dataloader.max_len's cut: validation had run the whole record, past the RoPE cache, and
    summed loss tokens its normaliser did not count)."""
    import dataclasses
    from contextlib import nullcontext
    from types import SimpleNamespace

    import torch

    from skrull_ext.data.steps.accounting import RunAccount
    from skrull_ext.data.steps.overlength import capacity_limit
    from skrull_ext.scheduler.capacity import Capacity
    from skrull_ext.train import validation
    from skrull_ext.train.chunked import attention_layers, chunked_loss
    from skrull_ext.train.validation import Validation
    from tests.unit_tests.test_chunked import LENGTH, _document, _loss, _model, one_pass

    limit = dataclasses.replace(capacity_limit(Capacity(64, cp=1), "chunk", 2048), chunk_for=lambda n: 24)
    tokens, labels = _document()
    chunks = []

    def recorded(model, tokens, labels, chunk, loss_fn, **kw):
        chunks.append(chunk)
        return chunked_loss(model, tokens, labels, chunk, loss_fn, **kw)

    monkeypatch.setattr(validation, "chunked_loss", recorded)
    plan = SimpleNamespace(input_lengths=[], chunked_group=[0], chunked=[kept])
    batch = SimpleNamespace(global_valid_tokens=int((labels[:kept] != -100).sum()), micro_batches=[], plan=plan,
                            samples=[0])
    run = Validation.__new__(Validation)
    run.config, run.batches, run.limit, run.best = ValidationConfig(enable=True), 1, limit, None
    run.source = [SimpleNamespace(input=tokens, labels=labels, length=LENGTH)]

    class Build:  # StepBuilder's part validation reads
        dp_rank = 0

        def __call__(self, k, account):
            return batch

    run.build = Build()
    model = _model()
    trainer = SimpleNamespace(
        model_parts=[model], device=torch.device("cpu"), train_context=nullcontext, cp_group=None,
        chunk_path=SimpleNamespace(traced=False),
        loss_fn=lambda pred, labels, positions=None: (_loss(pred, labels), None),
        dacp_attention=attention_layers([model]),
        parallel_dims=SimpleNamespace(dp_cp_enabled=False, tp=1), metrics_processor=SimpleNamespace(
            logger=SimpleNamespace(log=lambda *a: None)))
    result = run.run(trainer, 1)
    assert chunks == [24], chunks  # not the limit's 64
    if kept == LENGTH:
        ref, _ = one_pass()
    else:  # causal: the cut document's loss is the whole one's first positions
        from skrull_ext.attention import build_meta

        with torch.no_grad():
            meta = build_meta([LENGTH], [0], 0, 1)
            pred = model(tokens[None], positions=torch.arange(LENGTH)[None], attention_masks=meta)
        ref = _loss(pred[:, :kept], labels[None, :kept]).item()
    assert result.loss_tokens == batch.global_valid_tokens
    assert abs(result.loss * result.loss_tokens - ref) <= 1e-6 * abs(ref), (result.loss, ref)
    assert isinstance(result.account, RunAccount)
