"""Every Python block of README.md and docs/ runs (issue 37 item 6): prose
that shows code cannot go stale while the suite passes.

The convention, for whoever writes a doc:

- A fenced block whose info string starts with ``python`` (or ``py``) is
  run by this test, from the repository root, in a fresh namespace: it must
  work as a reader pastes it, on its own (define its inputs; use the shipped
  lengths, jobs and assets rather than files of your own).
- Words after the language mark the block: ``python no-run`` is an
  illustration that is shown, not run (a fragment, or code that needs a GPU
  or a launch); ``python slow`` runs only in the slow lane (a block over
  about a second). Any other word fails here, so a typo cannot hide a block.
- Other fences (``bash``, ``toml``, none) are not run: command lines are
  checked by the tests of their commands.

A failing block is reported as ``FILE:LINE`` of its fence, and its traceback
names the Markdown lines.
"""

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")))
LANGUAGES = {"python", "py"}
OPTIONS = {"no-run", "slow"}

_OPEN = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    """1-based line of the opening fence."""
    options: frozenset[str]
    source: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path}:{self.line}"


def python_blocks(path: Path) -> list[Block]:
    """The Python fences of one Markdown file, with their options. Raises
    ValueError naming the line for an option this test does not know."""
    lines = path.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = _OPEN.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence = m["indent"], m["fence"]
        language, *options = m["info"].split() or [""]
        end = i + 1
        while end < len(lines) and not (lines[end].strip().startswith(fence)
                                        and set(lines[end].strip()) == {fence[0]}):
            end += 1
        if language in LANGUAGES:
            unknown = set(options) - OPTIONS
            if unknown:
                raise ValueError(f"{path}:{i + 1}: unknown option(s) {sorted(unknown)} on a python fence; "
                                 f"one of {sorted(OPTIONS)}")
            body = [ln[len(indent):] if ln.startswith(indent) else ln.lstrip() for ln in lines[i + 1:end]]
            blocks.append(Block(path, i + 1, frozenset(options), "\n".join(body) + "\n"))
        i = end + 1
    return blocks


def run_block(block: Block) -> None:
    """Execute one block; its line numbers are the Markdown file's."""
    code = compile("\n" * block.line + block.source, block.where, "exec")
    exec(code, {"__name__": "__doc_block__"})


BLOCKS = [b for path in DOCS for b in python_blocks(path)]


@pytest.mark.parametrize(
    "block",
    [pytest.param(b, id=b.where, marks=[pytest.mark.slow] if "slow" in b.options else [])
     for b in BLOCKS if "no-run" not in b.options],
)
def test_doc_block_runs(block, monkeypatch):
    monkeypatch.chdir(ROOT)
    run_block(block)


def test_the_scheduler_example_is_run():
    """The scheduler's example (once the README's, now docs/scheduler.md's) runs, not shown only."""
    example = [b for b in BLOCKS if b.path.name == "scheduler.md" and "group_micro_batches" in b.source]
    assert example and all("no-run" not in b.options for b in example)


def test_the_readme_opens_with_what_it_is_the_two_commands_and_one_figure():
    """Issue 50: the README's first screen was some 45 lines of implementation detail before
    the set-up command. Within its first 30 lines: the set-up and main job, the tests, and one
    figure with its command."""
    head = (ROOT / "README.md").read_text().splitlines()[:30]
    text = "\n".join(head)
    assert any(line.startswith("python3 -m venv .venv") and "torchrun" in line and "skrull_ext.train" in line
               for line in head), text
    assert ". .venv/bin/activate && python -m pytest" in text
    assert "python -m skrull_ext.bench simulate" in text and "1.44x" in text
    for target in re.findall(r"\]\(([^)#]+)\)", (ROOT / "README.md").read_text()):
        assert target.startswith("http") or (ROOT / target).exists(), target  # every link leads somewhere


def test_the_parser_reads_the_convention(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text(
        "text\n"
        "```python\nx = 1\n```\n"
        "```bash\nexit 1\n```\n"
        "- a list item:\n\n"
        "  ```python no-run\n  undefined_name\n  ```\n"
        "````py slow\n```\ny = 2\n````\n"
    )
    blocks = python_blocks(doc)
    assert [(b.line, sorted(b.options), b.source) for b in blocks] == [
        (2, [], "x = 1\n"), (10, ["no-run"], "undefined_name\n"), (13, ["slow"], "```\ny = 2\n")]
    run_block(blocks[0])
    with pytest.raises(NameError) as e:
        run_block(blocks[1])
    assert e.traceback[-1].lineno + 1 == 11  # the Markdown line of the failing statement
    doc.write_text("```python norun\npass\n```\n")
    with pytest.raises(ValueError, match=r"doc.md:1: unknown option\(s\) \['norun'\]"):
        python_blocks(doc)
