#!/usr/bin/env bash
# Sanitizer CI (issue 7): the core under AddressSanitizer + UndefinedBehavior-
# Sanitizer (plus float division by zero and float->int overflow).
#   1. C++ tests (ctest) built with -DSKRULL_SANITIZE=ON;
#   2. the Python module built the same way, staged with a copy of the
#      package and tests under build/sanitize/stage, and the Python tests that
#      reach every core path run against it (libasan preloaded into CPython).
# Any sanitizer report aborts with a non-zero exit. Debug builds (-O0, asserts
# on): the sanitizers instrument the same code, and the compile took a quarter
# of RelWithDebInfo's (test_core.cpp: 8 s against 30 s), the stage 114 s
# against 230 s. Steps 1 and 2 run side by side, each on its own build: the
# module's one translation unit (bindings.cpp, 33 s of one core at -O0 with
# ASan) is most of step 2 and left the second core idle while step 1 waited
# for it (docs/reliability.md, "The suite's time"). Step 1's output is its
# log, printed when both are done. About 1 minute on 2 cores.
# Usage: .ci/sanitize.sh [--build-only]  (PYTHON=... picks the interpreter of
# the tests; it needs pytest, hypothesis and the package's deps.) The module is
# built by a venv of its own with only the build's requirements
# (build/sanitize/build-venv: scikit-build-core, pybind11), so the build reads
# nothing that an install into PYTHON's venv could change under it.
# --build-only: both builds and the stage, no test run (.ci/run makes them
# beside its set-up's pip; the full run after it finds them up to date).
set -euo pipefail
cd "$(dirname "$0")/.."
build_only=0
[ "${1:-}" != --build-only ] || build_only=1
py=${PYTHON:-python3}
# A relative path (the usage in docs/reliability.md: PYTHON=.venv/bin/python) made absolute: the tests
# run from the stage folder. The venv's link itself is kept (not resolved).
case $py in */*) py=$(cd "$(dirname "$py")" && pwd)/$(basename "$py") ;; esac
out=build/sanitize
jobs=${JOBS:-2}
export ASAN_OPTIONS=abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
t0=$SECONDS

# 1. The C++ tests, in the background (their log: $out/cpp.log).
cpp_tests() {
  local gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  cmake -S . -B "$out/cpp" "${gen[@]}" -DSKRULL_SANITIZE=ON -DSKRULL_BUILD_TESTS=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null
  cmake --build "$out/cpp" -j "$jobs"
  [ "$build_only" = 0 ] || return 0
  ctest --test-dir "$out/cpp" --output-on-failure -j "$jobs"
}
mkdir -p "$out"
cpp_log=$PWD/$out/cpp.log
echo "== sanitize: C++ tests, beside the Python module (their output when both are done)"
cpp_tests >"$cpp_log" 2>&1 &
cpp_pid=$!
# Their output and status, also where step 2 fails first (the EXIT trap): a failure of either fails the script.
cpp_done() {
  local rc=0
  wait "$cpp_pid" || rc=$?
  echo "== sanitize: C++ tests (rc $rc)"
  cat "$cpp_log"
  return "$rc"
}
trap 'rc=$?; trap - EXIT; cpp_done || [ "$rc" != 0 ] || rc=1; exit "$rc"' EXIT

# 2. The Python module and the Python tests against it.
echo "== sanitize: Python module"
# The build runs without isolation (its build folder is kept between runs), in
# its own venv from PYTHON's interpreter (the same ABI; -S: nothing read from
# PYTHON's site-packages, which .ci/run's pip may be writing meanwhile).
bpy=$out/build-venv/bin/python
"$bpy" -c "import scikit_build_core, pybind11" 2>/dev/null || {
  "$py" -S -m venv --clear "$out/build-venv"
  "$bpy" -m pip install -q "scikit-build-core>=0.11" "pybind11>=3.0" 2>&1 | grep -v '^WARNING: Location' || true
}
rm -rf "$out/py-install" "$out/stage"
"$bpy" -m pip install -q --no-build-isolation --no-deps --target "$out/py-install" \
  -C cmake.define.SKRULL_SANITIZE=ON -C cmake.build-type=Debug -C build-dir="$out/py-build" . \
  2>&1 | grep -v '^WARNING: Location' || true
so=$(ls "$out"/py-install/skrull_ext/_core*.so)
# grep -c, not grep -q: -q exits at the first match, nm dies of SIGPIPE
# (141) and pipefail turns that into a failure.
nm -D "$so" | grep -c __asan_init >/dev/null || { echo "$so is not built with ASan" >&2; exit 1; }
mkdir -p "$out/stage"
cp -r skrull_ext tests profiles pyproject.toml "$out/stage/"  # profiles: test_pool_subgroup reads the CPU one
find "$out/stage" \( -name '_core*.so' -o -name __pycache__ \) -prune -exec rm -rf {} +
cp "$so" "$out/stage/skrull_ext/"
if [ "$build_only" = 1 ]; then
  trap - EXIT
  cpp_done
  echo "== sanitize: built in $((SECONDS - t0)) s"
  exit 0
fi

echo "== sanitize: Python tests against it"
# libasan first; libstdc++ with it, so ASan's __cxa_throw interceptor finds the
# real one (else the first C++ exception, i.e. the first ValueError, aborts).
preload="$(${CXX:-g++} -print-file-name=libasan.so) $(${CXX:-g++} -print-file-name=libstdc++.so)"
cd "$out/stage"
# CPython frees some memory only at exit: leak checking would only see that. In one process (-n 0, not
# pyproject's -n auto): an xdist worker under ASan costs more than the tests it takes (57.5 CPU s and
# 38.7 s of wall for the 137 tests on two workers, 23.3 and 21.6 s in one, 2026-12-01), and the C++
# tests beside them have the second core.
ASAN_OPTIONS=$ASAN_OPTIONS:detect_leaks=0 LD_PRELOAD=$preload PYTHONPATH=$PWD SKRULL_HARDENING_EXAMPLES=60 \
  "$py" -m pytest -q -p no:cacheprovider -n 0 \
  tests/unit_tests/test_bindings.py tests/unit_tests/test_cost_model.py tests/unit_tests/test_dacp.py \
  tests/unit_tests/test_gds.py tests/unit_tests/test_plan.py tests/unit_tests/test_properties.py \
  tests/unit_tests/test_hardening.py tests/unit_tests/test_concurrency.py tests/unit_tests/test_pool_subgroup.py \
  tests/unit_tests/test_whole_buffer.py
trap - EXIT
cpp_done
echo "== sanitize: green in $((SECONDS - t0)) s"
