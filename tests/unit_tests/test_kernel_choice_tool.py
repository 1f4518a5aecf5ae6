"""tools/kernel_choice.py: which cuDNN kernel, if any, a GPU call trains after stage 3'' (tools/gpu_checks.sh)."""

import shlex
from pathlib import Path

import pytest
import torch

from skrull_ext.attention.kernels import KERNELS
from tests.unit_tests.tool_module import load_tool

choice = load_tool("kernel_choice")
backends = load_tool("attention_backends")
ROOT = Path(__file__).resolve().parents[2]

SAMPLE = """torch 2.11.0+cu130, NVIDIA H200, cuDNN 91300; heads 14 over 2 K/V heads of 64, torch.bfloat16, lengths mix
agreement flash: max |error| / max |value| 3.91e-03 against float64 (output, dq, dk, dv)
agreement cudnn: refused (RuntimeError: GQA is not supported)
agreement cudnn-expanded: max |error| / max |value| 4.20e-03 against float64 (output, dq, dk, dv)

| tokens | documents | longest | backend | fwd+bwd ms | TFLOP/s | ms x flash | first pass ms |
|---|---|---|---|---|---|---|---|
| 16,384 | 31 | 4,071 | flash | 1.10 | 180 | x1.000 | 1.30 |
| 16,384 | 31 | 4,071 | cudnn-expanded | 0.80 | 248 | x0.727 | 95.10 |
| 131,072 | 242 | 16,384 | flash | 20.00 | 310 | x1.000 | 20.40 |
| 131,072 | 242 | 16,384 | cudnn-expanded | 18.30 | 339 | x0.915 | 130.00 |
"""


def test_the_sample_table_chooses_the_expanded_kernel_at_the_largest_buffer():
    assert choice.agreed(SAMPLE) == {"flash", "cudnn-expanded"}
    assert choice.ratios(SAMPLE) == {16384: {"flash": 1.0, "cudnn-expanded": 0.727},
                                     131072: {"flash": 1.0, "cudnn-expanded": 0.915}}
    got = choice.choose(SAMPLE)
    assert got.mode == "skrull-cudnn-expanded", got
    assert str(got) == ("skrull-cudnn-expanded: cudnn-expanded agreed with the oracle and took x0.915 of flash's "
                        "fwd+bwd at 131,072 tokens (cudnn not agreed, cudnn-expanded x0.915; the bar x0.95); first pass "
                        "130.00 ms against flash's 20.40 (a graph build per layout, paid once a micro-batch in training)")
    assert choice.first_passes(SAMPLE)[131072] == {"flash": 20.4, "cudnn-expanded": 130.0}


@pytest.mark.parametrize("edit, want", [
    (("x0.915", "x0.951"), "none"),  # 4.9% faster at the largest buffer: not enough (x0.727 at 16K does not count)
    (("x0.915", "x0.950"), "skrull-cudnn-expanded"),  # 5.0%: the bar, met
    (("4.20e-03 against float64 (output, dq, dk, dv)", "4.20e-01 against float64 (output, dq, dk, dv) -- DISAGREES, "
      "not timed"), "none"),  # fast but wrong
    (("| 131,072 | 242 | 16,384 | flash | 20.00 | 310 | x1.000 | 20.40 |\n", ""), "none"),  # no flash row there
    (("| 131,072 | 242 | 16,384 | cudnn-expanded | 18.30 | 339 | x0.915 | 130.00 |",
      "| 131,072 | 242 | 16,384 | cudnn-expanded | refused: OutOfMemoryError | - | - | - |"), "none"),  # x0.727 at 16K
])
def test_the_bar_agreement_and_the_baseline_decide(edit, want):
    assert SAMPLE.count(edit[0]) == 1
    assert choice.choose(SAMPLE.replace(*edit)).mode == want


def test_no_table_or_a_cpu_table_chooses_nothing(tmp_path, capsys):
    assert choice.choose("").mode == "none"
    cpu = ("agreement reference: max |error| / max |value| 1.2e-07 against float64 (output, dq, dk, dv)\n\n"
           "| tokens | documents | longest | backend | fwd+bwd ms | TFLOP/s | ms x flash | first pass ms |\n"
           "|---|---|---|---|---|---|---|---|\n| 256 | 3 | 200 | reference | 1.00 | 0.1 | - | 2.00 |\n")
    assert str(choice.choose(cpu)) == "none: no flash attention time at the largest buffer (256 tokens)"
    assert choice.main([str(tmp_path / "absent.txt")]) == 0
    assert capsys.readouterr().out.startswith("none: no table (")


def _run_tool(monkeypatch, capsys, ms: dict[str, float], wrong: str | None = None) -> str:
    """tools/attention_backends.py's own output on CPU, its three GPU backends played by the oracle (one of
    them without its causal mask if ``wrong``) and each pass timed at ``ms``: the format the helper reads."""
    def played(name):
        def run(q, k, v, b):
            if name == wrong:
                k, v = backends._expand(k, q.size(1)), backends._expand(v, q.size(1))
                return torch.nn.functional.scaled_dot_product_attention(
                    q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)).transpose(0, 1)
            return backends.run_reference(q, k, v, b)
        return run

    for name in ms:
        monkeypatch.setitem(backends.BACKENDS, name, played(name))
    monkeypatch.setattr(backends, "time_pass", lambda run, b, warmup, repeats: ms[
        next(n for n in ms if backends.BACKENDS[n] is run)])
    assert backends.main(["--device", "cpu", "--tokens", "64", "128", "--repeats", "1", "--warmup", "0", "--heads",
                          "4", "--kv-heads", "2", "--head-dim", "8", "--backends", *ms]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("ms, wrong, want", [
    ({"flash": 10.0, "cudnn": 9.0, "cudnn-expanded": 8.5}, None, "skrull-cudnn-expanded"),
    ({"flash": 10.0, "cudnn": 9.0, "cudnn-expanded": 9.8}, None, "skrull-cudnn"),
    ({"flash": 10.0, "cudnn": 9.6, "cudnn-expanded": 9.7}, None, "none"),
    ({"flash": 10.0, "cudnn": 5.0, "cudnn-expanded": 9.7}, "cudnn", "none"),  # fast without its mask: not timed
])
def test_the_tools_own_output_decides(monkeypatch, capsys, ms, wrong, want):
    out = _run_tool(monkeypatch, capsys, ms, wrong)
    assert ("DISAGREES" in out) == (wrong is not None), out
    got = choice.choose(out)
    assert got.mode == want and "at 128 tokens" in got.why, (got, out)


def test_every_mode_it_can_name_is_a_kernel_a_backend_and_a_line_of_the_ab_modes():
    lines = [shlex.split(line) for line in (ROOT / "tools" / "gpu_ab_modes.txt").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    modes = {name: flags for name, *flags in lines}
    for kernel in choice.CANDIDATES:
        assert kernel in KERNELS and kernel in backends.BACKENDS
        assert modes[choice.mode_of(kernel)] == ["--skrull.attention_kernel", kernel]


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.unit_tests.test_cudnn_kernel" name="test_cudnn_equals_dense_on_cuda[dtype0-1-cudnn]"/>
<testcase classname="tests.unit_tests.test_cudnn_kernel" name="test_cudnn_equals_dense_on_cuda[dtype0-1-cudnn-expanded]">
<failure message="AssertionError: Tensor-likes are not close!"/></testcase>
<testcase classname="tests.unit_tests.test_cudnn_kernel" name="test_cp1_cudnn_through_dacp_attention_on_cuda[cudnn-expanded]">
<error message="RuntimeError"/></testcase>
<testcase classname="tests.unit_tests.test_head_loss" name="test_bf16_head_loss_on_cuda_equals_unchunked[cudnn]">
<failure message="not a kernel's case"/></testcase>
</testsuite></testsuites>"""


def test_a_kernel_whose_cuda_cases_failed_is_not_chosen(tmp_path, capsys):
    """The A/B table checks cuDNN's op; the stage's CUDA cases check the kernel as DACP calls it."""
    assert choice.failed_cases(JUNIT) == {"cudnn": 0, "cudnn-expanded": 2}
    got = choice.choose(SAMPLE, failed=choice.failed_cases(JUNIT))
    assert got.mode == "none" and "cudnn-expanded failed 2 CUDA case(s)" in got.why, got
    assert choice.choose(SAMPLE, failed={"cudnn": 3, "cudnn-expanded": 0}).mode == "skrull-cudnn-expanded"
    table, cases = tmp_path / "ab.txt", tmp_path / "cases.xml"
    table.write_text(SAMPLE)
    cases.write_text(JUNIT)
    assert choice.main([str(table), "--tests", str(cases)]) == 0
    assert capsys.readouterr().out.startswith("none: no cuDNN kernel agreed, passed its CUDA cases and beat flash")
    assert choice.main([str(table), "--tests", str(tmp_path / "absent.xml")]) == 0
    assert capsys.readouterr().out.startswith("none: no CUDA cases to read (")
    assert choice.main([str(table)]) == 0 and capsys.readouterr().out.startswith("skrull-cudnn-expanded: ")
    assert choice.main([str(table), "--cases", str(cases)]) == 2
