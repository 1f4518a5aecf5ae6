"""Builds the C++ unit tests (cpp/tests) with CMake and runs them under ctest,
so the README's one test command covers the core without Python too.

``SKRULL_CPP_TESTS_BUILD`` names a build folder to use instead of a fresh one:
CI (.ci/run) builds there during its set-up, on the core pip leaves idle. The
test configures it again with its own flags and builds what is not up to date
(nothing, when the set-up built this tree), so it runs the same tests either way."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake not installed")
def test_cpp_unit_tests(tmp_path):
    build = Path(os.environ.get("SKRULL_CPP_TESTS_BUILD") or tmp_path / "build")
    run = lambda *cmd: subprocess.run(cmd, capture_output=True, text=True, timeout=600)  # noqa: E731
    cfg = run("cmake", "-S", str(ROOT), "-B", str(build), "-DSKRULL_BUILD_TESTS=ON", "-DCMAKE_BUILD_TYPE=Release")
    assert cfg.returncode == 0, cfg.stdout + cfg.stderr
    bld = run("cmake", "--build", str(build), "-j2")
    assert bld.returncode == 0, bld.stdout + bld.stderr
    res = run("ctest", "--test-dir", str(build), "--output-on-failure")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "100% tests passed" in res.stdout
