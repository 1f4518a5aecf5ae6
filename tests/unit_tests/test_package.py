"""The package's shape: no import cycles, parts that import alone, and the
training path apart from the research tools (issue 16)."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "skrull_ext"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> skrull_ext modules it imports, anywhere in its source (a
    function-level import closes a cycle as surely as a top-level one)."""
    modules = {_module_name(p): p for p in PKG.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
                # `from pkg import mod` imports the module mod; `from mod import name`, mod
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            edges |= {t for t in targets if t in modules and t != name}
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    graph = import_graph()
    assert "skrull_ext.job_file" in graph and graph["skrull_ext.config_registry"]  # the walk sees the package
    assert cycles(graph) == []


def test_the_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def _run(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)


BLOCK = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "ortools" or name.startswith("ortools.") or name == "skrull_ext._core":
            raise ImportError(f"{name} is blocked in this test")
sys.meta_path.insert(0, Block())
"""


@pytest.mark.slow
def test_attention_imports_without_ortools_or_the_core():
    proc = _run(BLOCK + "import skrull_ext.attention, skrull_ext\n"
                "assert 'skrull_ext._core' not in sys.modules and 'ortools' not in sys.modules\n"
                "try:\n    skrull_ext.Scheduler\nexcept ImportError as e:\n    print('lazy:', e)\n")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "lazy: skrull_ext._core is blocked" in proc.stdout  # the blocker works: names load on use


@pytest.mark.slow
def test_training_path_does_not_import_research_tools():
    proc = _run("import sys, skrull_ext.train, skrull_ext.config_registry\n"
                "bad = sorted(m for m in sys.modules if m.split('.')[:2] in (['skrull_ext', 'bench'], "
                "['skrull_ext', 'sim'], ['skrull_ext', 'profile']))\n"
                "print(bad)\nassert not bad, bad\n")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]


def test_top_level_names_resolve():
    import skrull_ext

    for name in skrull_ext.__all__:
        assert getattr(skrull_ext, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        skrull_ext.nope  # noqa: B018
