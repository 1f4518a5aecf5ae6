"""Whether a GPU call trains with the cuDNN kernel: read from tools/attention_backends.py's output.

    python tools/kernel_choice.py logs/attention_backends.txt [--tests logs/pytest_trainer.xml]   # MODE: why

tools/gpu_checks.sh (stage 3'', KERNEL_AB) runs it on the backends table of the model's heads and
adds MODE to its late training modes unless MODE is ``none``. A cuDNN backend is chosen where
both hold:

- its agreement line says it matched the float64 oracle (output, dq, dk, dv): not refused, not
  ``DISAGREES``;
- at the largest buffer of the table (the buffers grow to the trained BucketSize; flash
  attention timed there too), its row reads at most ``1 - MIN_GAIN`` of flash's time (``ms x flash``).

Where ``--tests`` names a pytest JUnit file (stage 3' ran the kernels' CUDA cases,
tests/unit_tests/test_cudnn_kernel.py), a kernel with a failed case there is not chosen either: the
A/B tool checks cuDNN's op, those cases the kernel as DACP calls it.

Of two such (grouped ``cudnn``, ``cudnn-expanded``), the faster. The first pass on the buffer (the
table's last column: cuDNN's graph build for a new layout) is said, not gated on: the training run,
a new layout every micro-batch, is what measures its cost. The row's backend name is the
kernel's (skrull_ext/attention/kernels.py), the mode ``skrull-<kernel>`` (tools/gpu_ab_modes.txt).
"""

import re
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

CANDIDATES = ("cudnn", "cudnn-expanded")
"""tools/attention_backends.py's cuDNN rows, each named as the kernel that runs it."""
MIN_GAIN = 0.05
"""The least fraction of flash's forward+backward time a cuDNN kernel must save to be trained."""
NONE = "none"

_AGREED = re.compile(r"^agreement (\S+): max \|error\| / max \|value\| \S+ against float64")


@dataclass(frozen=True)
class Choice:
    mode: str
    """``skrull-<kernel>``, or ``none``."""
    why: str

    def __str__(self) -> str:
        return f"{self.mode}: {self.why}"


def mode_of(kernel: str) -> str:
    return f"skrull-{kernel}"


def agreed(text: str) -> set[str]:
    """Backends whose agreement line matched the oracle (neither refused nor DISAGREES)."""
    return {m.group(1) for line in text.splitlines()
            if (m := _AGREED.match(line)) and "DISAGREES" not in line}


def ratios(text: str) -> dict[int, dict[str, float | None]]:
    """Per buffer (tokens), each backend's ``ms x flash`` (None: refused there, or no flash time to divide by)."""
    out: dict[int, dict[str, float | None]] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 7 or not re.fullmatch(r"[0-9,]+", cells[0]):
            continue
        tokens, backend, ratio = int(cells[0].replace(",", "")), cells[3], cells[6]
        out.setdefault(tokens, {})[backend] = float(ratio[1:]) if re.fullmatch(r"x[0-9.]+", ratio) else None
    return out


def first_passes(text: str) -> dict[int, dict[str, float]]:
    """Per buffer, each timed backend's first pass in ms (the table's last column): a cuDNN graph build
    per layout shows there, not in the median."""
    out: dict[int, dict[str, float]] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 8 and re.fullmatch(r"[0-9,]+", cells[0]) and re.fullmatch(r"[0-9.]+", cells[7]):
            out.setdefault(int(cells[0].replace(",", "")), {})[cells[3]] = float(cells[7])
    return out


def failed_cases(junit: str) -> dict[str, int]:
    """Per kernel of CANDIDATES, its failed or errored CUDA cases of test_cudnn_kernel.py in a JUnit file's
    text (each case's id ends with its kernel: ``[...-cudnn]``)."""
    out = dict.fromkeys(CANDIDATES, 0)
    for case in ET.fromstring(junit).iter("testcase"):
        name = case.get("name", "")
        bad = case.find("failure") is not None or case.find("error") is not None
        if bad and "test_cudnn_kernel" in case.get("classname", ""):
            for kernel in CANDIDATES:
                out[kernel] += name.endswith((f"-{kernel}]", f"[{kernel}]"))
    return out


def choose(text: str, min_gain: float = MIN_GAIN, failed: dict[str, int] | None = None) -> Choice:
    """The cuDNN kernel to train, or ``none``, with the figures that decided; ``failed``: each kernel's
    failed CUDA cases (``failed_cases``), a kernel with any not chosen."""
    table = ratios(text)
    if not table:
        return Choice(NONE, "no buffer in the table")
    tokens = max(table)  # the largest buffer timed (a stage cut by its limit leaves the larger ones out)
    row = {k: r for k, r in table[tokens].items() if r is not None}
    if "flash" not in row:
        return Choice(NONE, f"no flash attention time at the largest buffer ({tokens:,} tokens)")
    ok = agreed(text)
    said = [f"{k} x{row[k]:.3f}" if k in row else f"{k} {'untimed' if k in ok else 'not agreed'}"
            for k in CANDIDATES]
    failed = failed or {}
    said += [f"{k} failed {failed[k]} CUDA case(s)" for k in CANDIDATES if failed.get(k)]
    wins = sorted((row[k], k) for k in CANDIDATES
                  if k in ok and k in row and row[k] <= 1 - min_gain and not failed.get(k))
    at = f"of flash's fwd+bwd at {tokens:,} tokens ({', '.join(said)}; the bar x{1 - min_gain:.2f})"
    if not wins:
        return Choice(NONE, f"no cuDNN kernel agreed, passed its CUDA cases and beat flash by {min_gain:.0%} {at}")
    ratio, kernel = wins[0]
    first = first_passes(text).get(tokens, {})
    builds = (f"; first pass {first[kernel]:.2f} ms against flash's {first['flash']:.2f} (a graph build per layout, "
              "paid once a micro-batch in training)") if kernel in first and "flash" in first else ""
    return Choice(mode_of(kernel), f"{kernel} agreed with the oracle and took x{ratio:.3f} {at}{builds}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) not in (1, 3) or (len(argv) == 3 and argv[1] != "--tests"):
        print("usage: python tools/kernel_choice.py ATTENTION_BACKENDS_OUTPUT [--tests JUNIT_XML]", file=sys.stderr)
        return 2
    try:
        text = Path(argv[0]).read_text(errors="replace")
    except OSError as e:
        print(Choice(NONE, f"no table ({argv[0]}: {e.strerror})"))
        return 0
    failed = None
    if len(argv) == 3:
        try:
            failed = failed_cases(Path(argv[2]).read_text(errors="replace"))
        except (OSError, ET.ParseError) as e:  # the cases' file unreadable: nothing says the kernel works
            print(Choice(NONE, f"no CUDA cases to read ({argv[2]}: {getattr(e, 'strerror', None) or e})"))
            return 0
    print(choose(text, failed=failed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
