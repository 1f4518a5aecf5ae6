#!/usr/bin/env bash
# Run a command N times in a row with a CPU load beside it (busy processes),
# stopping at the first failure; prints how many runs passed.
#
#   bash tools/under_load.sh RUNS BUSY -- python -m pytest -q -p no:cacheprovider tests/unit_tests/test_prefetch.py
#
# RUNS: how many runs; BUSY: how many busy-looping processes to keep beside it
# (this machine has 2 cores: 2 busy processes halve what the tests get).
# The busy processes end with the script (trap), and each is capped by
# `timeout` in case the script itself is killed.
set -u
runs=$1 busy=$2
shift 2
[ "${1:-}" = "--" ] && shift
pids=()
for _ in $(seq "$busy"); do
  timeout 7200 python3 -c "while True: pass" &
  pids+=($!)
done
trap 'kill "${pids[@]}" 2>/dev/null' EXIT
passed=0
for i in $(seq "$runs"); do
  if "$@" >"/tmp/under_load.$$.log" 2>&1; then
    passed=$((passed + 1))
    echo "run $i passed ($(tail -n 1 "/tmp/under_load.$$.log"))"
  else
    echo "run $i failed (log: /tmp/under_load.$$.log):"
    tail -30 "/tmp/under_load.$$.log"
    echo "$passed of $runs runs passed under $busy busy processes before the failure"
    exit 1
  fi
done
echo "$passed of $runs runs passed in a row under $busy busy processes: $*"
