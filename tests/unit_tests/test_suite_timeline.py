"""tools/suite_timeline.py: what each xdist worker recorded, and the report of it."""

from tests.unit_tests.tool_module import load_tool


def _tool():
    return load_tool("suite_timeline")


def test_workers_record_and_the_report_sums_them(tmp_path, monkeypatch):
    tool, path = _tool(), tmp_path / "t.jsonl"
    clock = iter([100.0, 101.0, 104.0, 104.0, 105.0, 100.5, 101.5, 111.5])
    monkeypatch.setattr(tool.time, "time", lambda: next(clock))
    monkeypatch.setenv("SUITE_TIMELINE", str(path))
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    tool.pytest_sessionstart(None)
    for nodeid in ("a.py::x", "b.py::y"):
        tool.pytest_runtest_logstart(nodeid, None)
        tool.pytest_runtest_logfinish(nodeid, None)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    tool.pytest_sessionstart(None)
    tool.pytest_runtest_logstart("a.py::z", None)
    tool.pytest_runtest_logfinish("a.py::z", None)
    monkeypatch.delenv("PYTEST_XDIST_WORKER")  # the controller: nothing recorded
    tool.pytest_runtest_logstart("a.py::x", None)
    assert tool.report(str(path), 5).splitlines() == [
        "gw0: 4 s of tests, last one ended 5 s after the first worker started",
        "gw1: 10 s of tests, last one ended 12 s after the first worker started",
        "tests' summed time 14 s; the workers ended 6 s apart",
        "    13.0 s  gw0,gw1  a.py",
        "     1.0 s  gw0  b.py",
    ]
