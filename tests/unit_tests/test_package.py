"""The package's shape (issues 16, 26 and 37): rooms at the package root on
floors, no import from a lower floor up to a higher one, no import cycles,
the product never importing the research tools, no module over 500 lines,
torchtitan changed only in torchtitan_patches, and parts that import alone.

An import is any way a module names another of ours: ``import``/``from``
at the top or inside a function (a late import ties two rooms as surely as
a top-level one, it only hides the tie), or a string that is a module's
name (a PEP 562 lazy map, ``importlib.import_module``, ``python -m``)."""

import ast
import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "skrull_ext"
PATCHES = ROOT / "torchtitan_patches"
PACKAGES = (PKG, PATCHES)


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _named_module(value: str, modules) -> str | None:
    """The module a string names (``"skrull_ext.x"`` or ``"skrull_ext.x:main"``), else None.
    A bare package name is not one: ``"skrull_ext"`` is as often a folder's name."""
    name = value.split(":", 1)[0]
    return name if "." in name and name in modules else None


def import_graph(packages=PACKAGES, root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> our modules it imports, anywhere in its source (a
    function-level import closes a cycle as surely as a top-level one), or
    names by a string (a lazy import). ``skrull_ext._core``, the compiled
    core, is a module here too (its stub ``_core.pyi``)."""
    modules = {_module_name(p, root): p for pkg in packages for p in pkg.rglob("*.py")}
    modules |= {_module_name(p, root): p for pkg in packages for p in pkg.glob("_core.pyi")}
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
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                targets = [_named_module(node.value, modules)]
            else:
                continue
            edges |= {t for t in targets if t in modules and t != name}
        graph[name] = edges
    return graph


@functools.cache
def _graph() -> dict[str, set[str]]:
    """This checkout's graph, read once for the tests below (they do not change it)."""
    return import_graph()


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
    graph = _graph()
    assert "skrull_ext.train.job.job_file" in graph and graph["skrull_ext.train.config_registry"]  # the walk sees the package
    assert "torchtitan_patches" in graph["skrull_ext.train.job.job_file"]  # and the patches
    assert cycles(graph) == []


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Package -> the other packages its modules import: each module counted in the folder
    that holds it (a package's ``__init__`` in that package), except a module at the root
    of skrull_ext, a room of its own as the floors count it (``errors``, ``export``, ...).
    A subfolder is a package of its own here, so two folders that import each other
    (``train/`` and ``train/job/``, issue 56) are a cycle even where no module cycle is."""
    packages = {m for m in graph if any(o.startswith(f"{m}.") for o in graph)}

    def package(module: str) -> str:
        parts = module.split(".")
        if module in packages or (parts[0] == "skrull_ext" and len(parts) == 2):
            return module
        return module.rsplit(".", 1)[0]

    out: dict[str, set[str]] = {package(m): set() for m in graph}
    for m, targets in graph.items():
        out[package(m)] |= {package(t) for t in targets} - {package(m)}
    return out


def test_no_two_packages_import_each_other():
    """No circle of packages either: a subfolder sits below the folder that holds it or beside
    it, never both (train/job/, the job's settled config, below the trainers in train/)."""
    packages = package_graph(_graph())
    assert "skrull_ext.train.job" in packages["skrull_ext.train"]  # the walk sees subfolders
    assert "skrull_ext.data.sources" in packages["skrull_ext.data.steps"]
    assert cycles(packages) == []


def test_the_package_cycle_finder_finds_a_pair_without_a_module_cycle(tmp_path):
    pkg = tmp_path / "skrull_ext"
    for path, source in {
        "__init__.py": "",
        "room/__init__.py": "",
        "room/top.py": "from skrull_ext.room.sub.low import f\n",  # down into the subfolder
        "room/helpers.py": "",
        "room/sub/__init__.py": "",
        "room/sub/low.py": "def f():\n    from skrull_ext.room import helpers\n",  # and back up: a pair
        "errors.py": "",
        "other/__init__.py": "from skrull_ext import errors\n",  # a root module is a room of its own
        "other/m.py": "",
    }.items():
        (pkg / path).parent.mkdir(parents=True, exist_ok=True)
        (pkg / path).write_text(source)
    graph = import_graph(packages=(pkg,), root=tmp_path)
    assert cycles(graph) == []  # no module imports itself round a circle
    assert cycles(package_graph(graph)) == [["skrull_ext.room", "skrull_ext.room.sub"]]
    assert package_graph(graph)["skrull_ext.other"] == {"skrull_ext.errors"}


ROOMS = {
    # the scheduler and the torchtitan integration, each in its room
    "scheduler", "train",
    # the parts they use
    "attention", "data", "models", "hf", "lora",
    # the research and measurement tools, never imported by training
    "bench", "profile", "sim",
    # shipped files
    "assets", "jobs", "lengths",
}
ROOT_MODULES = {
    "__init__.py", "_core.pyi",
    "errors.py", "cli_errors.py",  # every command line's one-line errors
    "export.py", "launch.py", "prepare.py",  # python -m skrull_ext.export / .launch / .prepare
}
TOOLS = {"bench", "profile", "sim"}
"""The research and measurement rooms: no module of the product imports them."""
FLOORS = (
    {"_core", "errors", "assets"},  # the compiled core, the one-line error types, shipped files
    {"scheduler", "lengths", "attention", "models", "cli_errors"},  # parts that need no other room
    {"data", "__init__", "torchtitan_patches"},  # what feeds a step; the package's lazy names; torchtitan's fixes
    {"hf"},  # HF folders: a model's tokenizer, weights and files
    {"lora"},  # adapters over a model and its HF folder
    {"train"},  # the torchtitan integration: a job file read, checked and trained
    {"export", "prepare", "launch"},  # command lines that span rooms (a whole job, a checkpoint)
    {"sim", "profile"},  # the research and measurement tools
    {"bench"},  # the benchmarks, over the simulator and the trainer
)
"""The rooms (a room of the package, a module at its root, or torchtitan_patches),
lowest floor first. A module imports its own room or a room on a floor
below it, never one on its own floor or above: the arrows point down."""


def room(module: str) -> str:
    """The room of a module: its folder under skrull_ext, its own name at the
    package root (``__init__`` for the package's names), or torchtitan_patches."""
    parts = module.split(".")
    if parts[0] != "skrull_ext":
        return parts[0]
    return parts[1] if len(parts) > 1 else "__init__"


def upward_imports(graph: dict[str, set[str]], floors=FLOORS) -> list[str]:
    """Every import of a room on the importer's floor or above it."""
    floor = {r: i for i, rooms in enumerate(floors) for r in rooms}
    return sorted(f"{m} -> {t} (floor {floor[room(m)]} -> {floor[room(t)]})" for m, targets in graph.items()
                  for t in targets if room(m) != room(t) and floor[room(t)] >= floor[room(m)])


def tool_imports(graph: dict[str, set[str]], tools=TOOLS) -> list[str]:
    """Every import of a research tool by a module of the product."""
    return sorted(f"{m} -> {t}" for m, targets in graph.items() if room(m) not in tools
                  for t in targets if room(t) in tools)


def test_the_package_root_is_rooms():
    """A reader of skrull_ext/ meets the rooms and the entry points, not
    loose modules: a new module goes into the room of its concern."""
    built = {p.name for p in PKG.glob("_core.*.so")}  # the core, where an in-place build put it
    entries = {p.name for p in PKG.iterdir() if p.name != "__pycache__"} - built
    dirs = {p.name for p in PKG.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert dirs == ROOMS
    assert entries - dirs == ROOT_MODULES


def unused_imports(path: Path, root: Path = ROOT) -> list[str]:
    """Names ``path`` binds with ``from X import name`` and never uses: no Name node, no word of
    a string (a quoted annotation), not in ``__all__`` (a re-export). What pyflakes reports as
    "imported but unused" for these; ``import a.b`` for its side effect, ``__future__`` and a
    line marked ``noqa: F401`` are left out."""
    source = path.read_text()
    lines, tree = source.splitlines(), ast.parse(source, str(path))
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module != "__future__" and "F401" not in lines[node.lineno - 1]:
            bound |= {a.asname or a.name: node.lineno for a in node.names if a.name != "*"}
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    words = {w for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
             for w in n.value.replace("[", " ").replace("]", " ").replace(",", " ").replace("|", " ").split()}
    return [f"{path.relative_to(root)}:{line}: {name}" for name, line in sorted(bound.items(), key=lambda i: i[1])
            if name not in used and name not in words]


@pytest.mark.parametrize("pkg", PACKAGES, ids=lambda p: p.name)
def test_no_module_imports_a_name_it_never_uses(pkg):
    """skrull_ext/train/job/job_file.py imported JOBS_DIR only for config_registry to import it
    from there (a new user's pass over the README's job); a name lives where it is defined."""
    assert [u for p in sorted(pkg.rglob("*.py")) for u in unused_imports(p)] == []


def test_the_unused_import_finder_finds_one(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("from __future__ import annotations\nfrom os import sep, getcwd\n"
                      "from sys import argv  # noqa: F401\nfrom a import B, C, D\n__all__ = ['C']\n"
                      "def f(x: 'list[B]'):\n    return getcwd()\n")
    assert unused_imports(module, tmp_path) == ["m.py:2: sep", "m.py:4: D"]


@pytest.mark.parametrize("pkg", PACKAGES, ids=lambda p: p.name)
def test_no_module_over_500_lines(pkg):
    long = {str(p.relative_to(ROOT)): n for p in pkg.rglob("*.py") if (n := len(p.read_text().splitlines())) > 500}
    assert long == {}


def _torchtitan_names(tree: ast.AST) -> set[str]:
    """Names a module binds to torchtitan modules or their members."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.startswith("torchtitan.")
                      or a.name == "torchtitan"}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torchtitan":
            names |= {a.asname or a.name for a in node.names}
    return names


def _root(node: ast.AST) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def torchtitan_patches_outside(pkg: Path) -> list[str]:
    """Every place under ``pkg`` that assigns into something imported from
    torchtitan (``mod.attr = ...``, ``setattr(mod, ...)``): a change of
    torchtitan's behaviour, which belongs in torchtitan_patches."""
    found = []
    for path in pkg.rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        titan = _torchtitan_names(tree)
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                targets = [t for t in targets if isinstance(t, ast.Attribute)]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" and node.args:
                targets = [node.args[0]]
            found += [f"{path.relative_to(pkg.parent)}:{node.lineno}" for t in targets if _root(t) in titan]
    return found


def test_torchtitan_is_changed_only_in_torchtitan_patches(tmp_path):
    assert torchtitan_patches_outside(PKG) == []
    assert torchtitan_patches_outside(PATCHES)  # the finder sees the patches that do exist
    bad = tmp_path / "bad.py"
    bad.write_text("from torchtitan.tools import utils\nutils.device_type = 'cpu'\n")
    assert torchtitan_patches_outside(tmp_path) == [f"{tmp_path.name}/bad.py:2"]


def test_every_room_is_on_one_floor():
    placed = [r for rooms in FLOORS for r in rooms]
    assert len(placed) == len(set(placed))
    assert {room(m) for m in _graph()} == set(placed)  # a new room gets a floor


def test_no_import_goes_up_a_floor():
    graph = _graph()
    assert "skrull_ext.models.hf_config" in graph["skrull_ext.models.registry"]  # sees top-level imports
    assert "skrull_ext.assets" in graph["skrull_ext.data.sources.checks"]  # and late ones
    assert "skrull_ext.scheduler.scheduler" in graph["skrull_ext"]  # and lazy ones, by name
    assert upward_imports(graph) == []


def test_the_product_never_imports_the_research_tools():
    graph = _graph()
    assert "sim" in {room(t) for m in graph if room(m) == "bench" for t in graph[m]}  # the walk sees tools
    assert tool_imports(graph) == []


def test_the_floor_check_finds_upward_and_late_imports(tmp_path):
    pkg = tmp_path / "skrull_ext"
    for folder, source in {
        "low": "def f():\n    from skrull_ext.high import g\n",  # late, and up a floor
        "mid": "import importlib\nLAZY = {'x': 'skrull_ext.bench.run'}\n",  # by name, a tool
        "high": "from skrull_ext.low import f\n",  # down: fine
        "bench": "from ..mid import LAZY\n",  # relative, down: fine
    }.items():
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")
        (pkg / folder / ("run.py" if folder == "bench" else "m.py")).write_text(source)
    (pkg / "__init__.py").write_text("")
    graph = import_graph(packages=(pkg,), root=tmp_path)
    floors = ({"__init__"}, {"low"}, {"mid"}, {"high"}, {"bench"})
    assert upward_imports(graph, floors) == ["skrull_ext.low.m -> skrull_ext.high (floor 1 -> 3)",
                                             "skrull_ext.mid.m -> skrull_ext.bench.run (floor 2 -> 4)"]
    assert tool_imports(graph, {"bench"}) == ["skrull_ext.mid.m -> skrull_ext.bench.run"]
    sideways = ({"__init__"}, {"low", "high"}, {"mid"}, {"bench"})  # two rooms on one floor may not meet
    assert upward_imports(graph, sideways)[:2] == ["skrull_ext.high.m -> skrull_ext.low (floor 1 -> 1)",
                                                   "skrull_ext.low.m -> skrull_ext.high (floor 1 -> 1)"]


def test_the_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def _run(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)


BLOCK = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    blocked = ("ortools", "skrull_ext._core")
    def find_spec(self, name, path, target=None):
        if name in self.blocked or name.split(".")[0] in self.blocked:
            raise ImportError(f"{name} is blocked in this test")
sys.meta_path.insert(0, Block())
"""


IMPORTS = """
{block}
import skrull_ext.attention, skrull_ext
assert 'skrull_ext._core' not in sys.modules and 'ortools' not in sys.modules
try:
    skrull_ext.Scheduler
except ImportError as e:
    print('lazy:', e)
Block.blocked = ("ortools",)  # the core may load now; ortools stays blocked
import skrull_ext.train.__main__, skrull_ext.train.config_registry
bad = sorted(m for m in sys.modules if m.split('.')[:2] in (['skrull_ext', 'bench'], ['skrull_ext', 'sim'],
                                                               ['skrull_ext', 'profile']))
print('research tools:', bad)
print('training path imported')
"""
"""One interpreter for the import checks below, each a torch import (seconds) on its own: the
attention room with the core and ortools blocked first, then the training path with ortools
still blocked (so it does not import the CP-SAT fallback either)."""


@functools.cache
def _imports() -> subprocess.CompletedProcess:
    return _run(IMPORTS.format(block=BLOCK))


@pytest.mark.slow
def test_attention_imports_without_ortools_or_the_core():
    proc = _imports()
    assert "lazy: skrull_ext._core is blocked" in proc.stdout, proc.stderr[-3000:]  # the blocker works: names load on use


@pytest.mark.slow
def test_ortools_loads_only_when_cpsat_solves():
    """Every rank of a job builds a Scheduler; ortools (0.4 s to import) is the
    CP-SAT fallback's alone."""
    code = (BLOCK + 'Block.blocked = ("ortools",)\n'
            + "from skrull_ext import Scheduler, SchedulerConfig\n"
            "from skrull_ext.scheduler import cost_model as cm\n"
            "batch = [300, 20, 40, 900, 15, 60, 33, 700]\n"
            "cfg = dict(dp=1, cp=2, bucket_size=512, cpsat_margin=0.0)\n"
            "Scheduler(SchedulerConfig(cpsat=False, **cfg), cm.preset()).schedule(batch)\n"
            "print('heuristic ok')\n"
            "Scheduler(SchedulerConfig(cpsat=True, **cfg), cm.preset()).schedule(batch)\n")
    proc = _run(code)
    assert "heuristic ok" in proc.stdout, proc.stderr[-3000:]
    assert proc.returncode != 0 and "ortools is blocked" in proc.stderr, proc.stderr[-3000:]


@pytest.mark.slow
def test_training_path_does_not_import_research_tools():
    """Nor ortools (blocked: an import would fail), which test_ortools_loads_only_when_cpsat_solves
    leaves to the CP-SAT fallback."""
    proc = _imports()
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "research tools: []" in proc.stdout and "training path imported" in proc.stdout, proc.stdout


def test_top_level_names_resolve():
    import skrull_ext

    for name in skrull_ext.__all__:
        assert getattr(skrull_ext, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        skrull_ext.nope  # noqa: B018
