#!/usr/bin/env bash
# libFuzzer over the core's public entry points (cpp/fuzz/fuzz_core.cpp).
#
#   tools/fuzz.sh [SECONDS]   fuzz for SECONDS (default 120), one job, starting
#                             from the committed corpus; new inputs go to
#                             build/fuzz/corpus, crashes to build/fuzz/artifacts
#   tools/fuzz.sh --merge     minimise build/fuzz/corpus + cpp/fuzz/corpus into
#                             cpp/fuzz/corpus (the corpus to commit: the fewest
#                             inputs keeping every edge covered)
#   tools/fuzz.sh --coverage  line and branch coverage of cpp/include/skrull by
#                             the committed corpus (llvm-cov, source-based)
#
# Needs clang and libFuzzer (Debian: apt-get install clang-14
# libclang-rt-14-dev llvm-14); CLANG=... picks another clang++.
set -euo pipefail
cd "$(dirname "$0")/.."
clang=${CLANG:-$(command -v clang++-14 || command -v clang++)}
llvm_bin=$(dirname "$(readlink -f "$clang")")
out=build/fuzz
mkdir -p "$out/corpus" "$out/artifacts"

build() {
  cmake -S . -B "$out/build" -G Ninja -DCMAKE_CXX_COMPILER="$clang" -DCMAKE_BUILD_TYPE=Release \
    -DSKRULL_FUZZ=ON -DSKRULL_BUILD_TESTS=OFF >/dev/null
  cmake --build "$out/build" --target fuzz_core >/dev/null
}

case "${1:-120}" in
  --merge)
    build
    mkdir -p "$out/merged"
    rm -f "$out"/merged/*
    # Edge coverage only (no hit counts, no comparison features): the fewest
    # inputs that keep every edge, i.e. every branch, covered.
    "$out/build/fuzz_core" -merge=1 -use_counters=0 -use_cmp=0 -use_value_profile=0 -timeout=10 -rss_limit_mb=4096 \
      "$out/merged" cpp/fuzz/corpus "$out/corpus"
    rm -f cpp/fuzz/corpus/*
    cp "$out"/merged/* cpp/fuzz/corpus/
    echo "cpp/fuzz/corpus: $(ls cpp/fuzz/corpus | wc -l) inputs, $(du -sh cpp/fuzz/corpus | cut -f1)"
    ;;
  --coverage)
    "$clang" -std=c++17 -O1 -ffp-contract=off -fprofile-instr-generate -fcoverage-mapping -DSKRULL_FUZZ_REPLAY \
      -Icpp/include cpp/fuzz/fuzz_core.cpp -o "$out/replay_cov"
    LLVM_PROFILE_FILE="$out/corpus.profraw" "$out/replay_cov" cpp/fuzz/corpus/*
    "$llvm_bin/llvm-profdata" merge -sparse "$out/corpus.profraw" -o "$out/corpus.profdata"
    "$llvm_bin/llvm-cov" report "$out/replay_cov" -instr-profile="$out/corpus.profdata" \
      -show-branch-summary cpp/include/skrull/*.hpp
    "$llvm_bin/llvm-cov" show "$out/replay_cov" -instr-profile="$out/corpus.profdata" -show-branches=count \
      -format=text cpp/include/skrull/*.hpp >"$out/coverage.txt"
    echo "annotated source: $out/coverage.txt (grep -n 'Branch (.*: \[True: 0\|False: 0' for untaken branches)"
    ;;
  *)
    build
    # One job (the machine is shared); -timeout flags any input slower than
    # 10 s as a hang; the per-input work cap in fuzz_core.cpp keeps normal
    # inputs far below that.
    "$out/build/fuzz_core" -max_total_time="$1" -timeout=10 -rss_limit_mb=4096 -max_len=2048 \
      -print_final_stats=1 -artifact_prefix="$out/artifacts/" "$out/corpus" cpp/fuzz/corpus
    ;;
esac
