"""Nothing a LoRA run trained is lost (issue 24): every folder it writes is the trained model.

A tiny random llama3 HF folder (with a chat template beside its tokenizer)
is fine-tuned with ``[lora]`` for 2 steps, 2 processes (gloo, CP 2), under
activation checkpointing ``full`` and ``selective`` (the wrappers that put
``_checkpoint_wrapped_module`` into every module name, as the shipped GPU
jobs do), with ``[checkpoint] interval = 1, last_save_in_hf = true`` and
``[lora] save_merged``: a DCP checkpoint at step 1, HF folders at step 2.
The ``selective`` run adapts the head too (``lm_head`` in ``target_modules``,
besides the seven defaults). Then, for each run:

- step 2: the peft adapter loaded by peft on the transformers base, the
  merged folder and the ``last_save_in_hf`` folder give the same logits
  (1e-5), and they are not the base's: the adapters trained;
- step 1: ``python -m skrull_ext.export --config-file JOB`` of the DCP
  checkpoint gives the logits of the torchtitan LoRA model (adapters
  unmerged) holding that checkpoint; with ``--hf-path`` (no ``[lora]``, so
  no adapter scale) it refuses in one line instead of writing the base;
- every HF folder carries the tokenizer and the chat template.

One run per AC kind, shared by the module's tests (about 35 s each on the
loaded 2-core box).
"""

import json
import os

import pytest
import torch
import transformers

from tests.integration_tests.hf_folders import hf_job, save_tiny_model
from tests.integration_tests.launch import torchrun

TOL = 1e-5
STEPS = 2
TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
SAVING = "enable = true\ninterval = 1\nlast_save_in_hf = true"
LORA = "\n[lora]\nrank = 4\nalpha = 8.0\nsave_merged = true\n"
HEAD = ('target_modules = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", '
        '"lm_head"]\n')
LORA_OF = {"full": LORA, "selective": LORA + HEAD}
"""Each run's [lora]: the selective run's adapts the head as well."""
# peft 0.x calls a transformers API that transformers 5 deprecates (not our code).
PEFT_WARNING = pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> str:
    folder = save_tiny_model(str(tmp_path_factory.mktemp("lora-src") / "tiny-llama3"), "llama3", perturbed=True)
    with open(os.path.join(folder, "chat_template.jinja"), "w") as f:
        f.write(TEMPLATE)
    return folder


@pytest.fixture(scope="module")
def lora_run(source, tmp_path_factory):
    """``lora_run(ac)``: (job file, dump folder) of the 2-step LoRA run under AC ``ac`` (cached)."""
    runs = {}

    def run(ac: str):
        if ac not in runs:
            tmp = tmp_path_factory.mktemp(f"lora-{ac}")
            # AC in the job file: its CLI flags are another change's
            job = hf_job(tmp / "job.toml", source, SAVING, edits={
                '[activation_checkpoint]\nkind = "none"': f'[activation_checkpoint]\nkind = "{ac}"',
                'activation_checkpoint = "auto"  # the': 'activation_checkpoint = "job"  # the',  # the kind above
                "\n[skrull]\n": LORA_OF[ac] + "\n[skrull]\n",
            })
            dump = str(tmp / "out")
            args = ["--config-file", job, "--dump_folder", dump, "--training.steps", str(STEPS),
                    "--parallelism.context_parallel_degree", "2"]
            proc = torchrun(2, "skrull_ext.train", args, cwd=str(tmp))
            applied = {"full": "FullAC", "selective": "SelectiveAC"}[ac]
            assert f"Applied {applied} activation checkpointing" in proc.stdout + proc.stderr
            runs[ac] = (job, dump)
        return runs[ac]

    return run


def _tokens() -> torch.Tensor:
    return torch.randint(0, 2048, (2, 40), generator=torch.Generator().manual_seed(5))


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        out = model.eval()(_tokens())
    return getattr(out, "logits", out)


def _hf(folder: str):
    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager")


def _complete(folder: str) -> None:
    """config.json, tokenizer and chat template: what from_pretrained and a chat front end read."""
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= set(os.listdir(folder))
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    assert tokenizer.chat_template == TEMPLATE
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert chat == "<|user|>hi\n"


def _same(ours: torch.Tensor, theirs: torch.Tensor, what: str) -> float:
    diff = (ours - theirs).abs().max().item()
    print(f"{what}: max |logit diff| {diff:.3g}")
    assert diff <= TOL, what
    return diff


@PEFT_WARNING
@pytest.mark.slow
@pytest.mark.parametrize("ac", ["full", "selective"])
def test_lora_final_folders_are_the_trained_model(source, lora_run, ac):
    import peft

    _, dump = lora_run(ac)
    adapter = os.path.join(dump, "lora_adapter")
    with open(os.path.join(adapter, "adapter_config.json")) as f:
        assert ("lm_head" in json.load(f)["target_modules"]) == (ac == "selective")
    base = _logits(_hf(source))
    trained = _logits(peft.PeftModel.from_pretrained(_hf(source), adapter))
    moved = (trained - base).abs().max().item()
    print(f"{ac}: the step-{STEPS} adapter moves the logits by {moved:.3g}")
    assert moved > 100 * TOL, "the adapter does not change the base model"
    for name, folder in (("lora_merged", os.path.join(dump, "lora_merged")),
                         ("last_save_in_hf", os.path.join(dump, "checkpoint", f"step-{STEPS}"))):
        _same(_logits(_hf(folder)), trained, f"{ac} {name} vs peft adapter on the base")
        _complete(folder)
    # torchtitan's own files of that last save (the base only) are gone, not beside the merged weights
    last = os.listdir(os.path.join(dump, "checkpoint", f"step-{STEPS}"))
    assert not [f for f in last if f.startswith(("model-", "sharded"))], last


@pytest.mark.slow
@pytest.mark.parametrize("ac", ["full", "selective"])
def test_lora_export_of_a_dcp_checkpoint_is_the_trained_model(source, lora_run, ac, tmp_path, capsys):
    from torchtitan.models.common import ScaledDotProductAttention

    from skrull_ext.export import load_single_process, main
    from skrull_ext.lora import apply_lora
    from skrull_ext.train.job.job_file import load_job

    job, dump = lora_run(ac)
    step1 = os.path.join(dump, "checkpoint", "step-1")
    out = str(tmp_path / "export")
    assert main([step1, out, "--config-file", job]) == 0
    assert "(the LoRA adapters merged into the base)" in capsys.readouterr().out

    # The trained model: the torchtitan LoRA model (adapters unmerged) holding the step-1 checkpoint.
    config = load_job(job)
    apply_lora(config)
    spec = config.model_spec
    for layer in spec.model.layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    model = spec.model.build()
    state = model.state_dict()
    assert any(".lora_b." in k for k in state) and ("lm_head.lora_b.weight" in state) == (ac == "selective")
    load_single_process(state, step1)
    model.load_state_dict(state)
    ours = _logits(model)
    assert (ours - _logits(_hf(source))).abs().max() > 100 * TOL, "step 1 did not move the adapters"
    with capsys.disabled():
        _same(_logits(_hf(out)), ours, f"{ac} export of step-1 DCP vs torchtitan LoRA model")
    _complete(out)

    # Without the job's [lora], the adapters' scale is unknown: refused, nothing written.
    refused = str(tmp_path / "refused")
    assert main([step1, refused, "--hf-path", source]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "holds LoRA adapters" in errors[0] and "--config-file JOB" in errors[0], errors
    assert not os.path.exists(refused)
