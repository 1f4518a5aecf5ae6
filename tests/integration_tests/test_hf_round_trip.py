"""HF folder in, HF folder out, checked against transformers (issue 13 item 4).

A tiny random HF model of each family (transformers ``save_pretrained``, with
the shipped tiny BPE tokenizer beside it) is fine-tuned for 2 steps by the
product's trainer (``[model] hf_path``, 1 process, Skrull's DACP attention),
which saves a DCP checkpoint at step 1 and its last checkpoint in HF format
at step 2. Then:

- ``python -m skrull_ext.export`` turns the step-1 DCP checkpoint into a HF
  folder; transformers loads it and its logits equal those of a torchtitan
  model holding the step-1 weights read straight from the DCP checkpoint;
- the step-2 folder is complete as written by the trainer (config.json,
  tokenizer) and transformers' logits equal the torchtitan model's on it;
- a run started from the step-1 export (``[model] hf_path``) trains exactly
  as a run started from the model of the step-1 DCP checkpoint (both with a
  fresh optimizer: a HF folder carries weights only).
"""

import json
import os

import pytest
import torch
import transformers

from tests.integration_tests.hf_folders import FAMILIES, hf_job, save_tiny_model
from tests.integration_tests.launch import torchrun, train_from_seed

TOL = 1e-5
SAVING = "enable = true\ninterval = 1\nlast_save_in_hf = true"
"""The trained runs' [checkpoint]: DCP every step, the last step as a HF folder."""


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """``trained(family)``: (source folder, checkpoint folder) of a 2-step run (cached)."""
    runs = {}

    def run(family: str):
        if family not in runs:
            tmp = tmp_path_factory.mktemp(f"roundtrip-{family}")
            source = save_tiny_model(str(tmp / f"tiny-{family}"), family)
            dump = str(tmp / "out")
            torchrun(1, "skrull_ext.train", ["--config-file", hf_job(tmp / "job.toml", source, SAVING), "--dump_folder", dump,
                                            "--training.steps", "2"], cwd=str(tmp))
            runs[family] = (source, os.path.join(dump, "checkpoint"))
        return runs[family]

    return run


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory):
    """``exported(family)``: the trained run's step-1 DCP checkpoint exported by
    ``python -m skrull_ext.export`` (its ``main``) into a HF folder (cached)."""
    from skrull_ext.export import main

    folders = {}

    def export(family: str) -> str:
        if family not in folders:
            source, checkpoints = trained(family)
            out = str(tmp_path_factory.mktemp(f"export-{family}") / "export")
            assert main([os.path.join(checkpoints, "step-1"), out, "--hf-path", source]) == 0
            folders[family] = out
        return folders[family]

    return export


def _tokens() -> torch.Tensor:
    return torch.randint(0, 2048, (2, 40), generator=torch.Generator().manual_seed(5))


def _titan_model(folder: str):
    """The torchtitan model of a HF folder's config.json, causal SDPA attention, float32."""
    from torchtitan.models.common import ScaledDotProductAttention

    from skrull_ext.models.hf_config import spec_from_hf

    spec = spec_from_hf(folder)
    for layer in spec.model.layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    return spec, spec.model.build().eval()


def _hf_logits(folder: str) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        return model.eval()(_tokens()).logits


def _compare(ours: torch.Tensor, folder: str, what: str) -> float:
    theirs = _hf_logits(folder)
    diff = (ours - theirs).abs().max().item()
    print(f"{what}: max abs logit diff {diff:.3g} (logits up to {theirs.abs().max():.3g})")
    assert theirs.abs().max() > 0.1
    assert diff <= TOL
    return diff


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_hf_round_trip_export_of_a_mid_run_checkpoint(trained, exported, family):
    from skrull_ext.export import load_single_process

    source, checkpoints = trained(family)
    out = exported(family)
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(os.listdir(out))

    # The trained model: the step-1 weights read straight from the DCP checkpoint.
    spec, model = _titan_model(source)
    state = model.state_dict()
    load_single_process(state, os.path.join(checkpoints, "step-1"))
    model.load_state_dict(state)
    with torch.no_grad():
        ours = model(_tokens())
    _compare(ours, out, f"{family} step-1 DCP -> export")
    # It trained: not the source weights any more.
    assert (_hf_logits(source) - ours).abs().max() > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_hf_round_trip_last_save_is_a_complete_hf_folder(trained, family):
    from skrull_ext.hf.weights import load_hf_weights

    source, checkpoints = trained(family)
    final = os.path.join(checkpoints, "step-2")
    assert {"config.json", "tokenizer.json", "tokenizer_config.json"} <= set(os.listdir(final))
    with open(os.path.join(final, "config.json")) as f, open(os.path.join(source, "config.json")) as g:
        saved, original = json.load(f), json.load(g)
    assert saved["torch_dtype"] == "float32"  # what the checkpointer wrote (export_dtype)
    assert {k: v for k, v in saved.items() if "dtype" not in k} == {k: v for k, v in original.items() if "dtype" not in k}
    spec, model = _titan_model(final)
    load_hf_weights(model, spec, final)
    with torch.no_grad():
        ours = model(_tokens())
    _compare(ours, final, f"{family} step-2 last_save_in_hf")
    tokenizer = transformers.AutoTokenizer.from_pretrained(final)
    assert tokenizer.decode(tokenizer("hello world")["input_ids"], skip_special_tokens=True).strip() == "hello world"


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_hf_round_trip_continue_from_export_matches_dcp(trained, exported, tmp_path, family):
    """Reloading the export into skrull-ext and training on is the same run as
    training on from the DCP checkpoint it was exported from.

    What "the same" can mean: a HF folder holds the weights only, not the
    optimizer's moments, the LR schedule's position or the data position.
    A run started from it (``[model] hf_path`` = the export) starts those
    fresh, so it is compared with a run that loads only the model of the
    step-1 DCP checkpoint (``initial_load_path`` = it, ``initial_load_in_hf``
    false, ``initial_load_model_only``), fresh in the same way: both train 2
    steps on the data's first two global batches, 1 process, Skrull's DACP
    attention. The export is float32 (the export's default dtype), the weights
    are then the same bits, so both runs must log the same losses and the same
    step-2 gradients (after one AdamW step) exactly. Resuming the DCP
    checkpoint whole (optimizer and data position too) is test_resume.py's;
    no HF folder can carry that state.
    """
    source, checkpoints = trained(family)
    export = exported(family)
    step1 = os.path.join(checkpoints, "step-1")
    jobs = {
        "from_dcp": hf_job(tmp_path / "dcp.toml", source,
                           f'enable = true\ninitial_load_path = "{step1}"\ninitial_load_in_hf = false'),
        "from_export": hf_job(tmp_path / "export.toml", export, "enable = true"),
    }
    a, b = (train_from_seed(str(tmp_path), name, 1, "skrull_ext.train", ["--config-file", job], None, 2, grads_at=2)
            for name, job in jobs.items())
    print(f"{family} continued 2 steps: from DCP step-1 {a.losses}, from its HF export {b.losses}")
    # Each loaded what it names (torchtitan's checkpointer logs the path it loads).
    assert f"Loading the checkpoint from {step1}." in a.output
    assert f"Loading the checkpoint from {export}." in b.output
    assert len(a.losses) == 2 and a.losses == b.losses
    ga, gb = torch.load(a.grads), torch.load(b.grads)
    assert ga.keys() == gb.keys()
    for name in ga:
        assert torch.equal(ga[name], gb[name]), f"{family} step-2 gradient of {name}"
