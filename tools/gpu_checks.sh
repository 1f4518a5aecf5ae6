#!/usr/bin/env bash
# The GPU checks of DACP attention in one command, for a lent GPU machine
# (docs/gpu.md). Two steps:
#
#   here, with network:  bash tools/gpu_checks.sh --fetch
#       downloads into .whl/ (git-ignored) the wheels the GPU image lacks:
#       ortools and what it needs beyond the image, and the build tools at the
#       versions this project builds with (the image has its own torch: 2.11).
#   there:               bash tools/gpu_checks.sh        (carry .whl)
#       installs them into /tmp/site, builds skrull_ext._core in place, runs the
#       attention tests (their CUDA cases: side stream at CP 1, varlen vs dense,
#       a real CP group of 2 and 4 ranks on the GPU(s)) and the profiled
#       overlap runs (python -m skrull_ext.bench overlap --device cuda), and
#       packs everything into $OUT/gpu_checks.tar.gz (the device tool returns 8
#       files at most) next to summary.txt.
#
#   anywhere:            bash tools/gpu_checks.sh --dry-run
#       the same stages on CPU at toy sizes, with the installed core (no build):
#       the CUDA test cases collected (they skip) and the overlap runs on
#       --device cpu. CI runs it (tests/integration_tests/test_gpu_checks_dry_run.py)
#       so the script cannot rot between lent GPUs.
#
# PYTHON picks the interpreter (default python3, the image's torch); PYVER the wheels' Python (3.12).
set -uo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
CARRY_LIMIT_MIB=64  # what the device tool carries to the GPU machine
dry=0
[ "${1:-}" = "--dry-run" ] && dry=1
WHEELS=(ortools==9.15.6755 immutabledict==4.3.1 protobuf==6.33.6 pybind11==3.0.1 scikit-build-core==0.11.6
        tomli-w==1.2.0)

if [ "${1:-}" = "--fetch" ]; then
  rm -rf .whl && mkdir -p .whl
  for platform in manylinux_2_27_x86_64 manylinux_2_17_x86_64; do
    "$py" -m pip download -q --no-deps --only-binary=:all: --python-version "${PYVER:-3.12}" --implementation cp \
      --platform "$platform" --platform manylinux2014_x86_64 -d .whl "${WHEELS[@]}" && break
  done
  ls -la .whl
  kib=$(du -sk .whl | cut -f1)
  echo "fetched $((kib / 1024)) MiB into .whl/ (carry limit ${CARRY_LIMIT_MIB} MiB)"
  [ "$kib" -le $((CARRY_LIMIT_MIB * 1024)) ] || { echo "over the carry limit" >&2; exit 1; }
  exit 0
fi

out=${OUT:-outputs/gpu_checks}
work=$(mktemp -d)
mkdir -p "$out" "$work/logs"
log=$work/logs
summary=$out/summary.txt
: >"$summary"
say() { echo "$*" | tee -a "$summary"; }
# Packed again after every stage: a call cut off at the device tool's 10 minutes still returns what ran.
pack() { tar -czf "$out/gpu_checks.tar.gz" -C "$work" . ; }

# 1. What machine and software this is.
{
  [ "$dry" = 1 ] && echo "dry run: CPU, toy sizes" || nvidia-smi
  "$py" - <<'EOF'
import inspect, torch, torch.distributed as dist
from torch.nn.attention import current_flash_attention_impl
from torch.nn.attention.varlen import varlen_attn
print("torch", torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
print("varlen_attn", inspect.signature(varlen_attn))
print("flash attention impl", current_flash_attention_impl(), "| nccl", dist.is_nccl_available(),
      "| gloo", dist.is_gloo_available())
EOF
} >"$log/env.txt" 2>&1
say "$(grep -E '^torch|^flash' "$log/env.txt")"
pack

# 2. Wheels the image lacks, then the C++ core built in place.
if compgen -G ".whl/*.whl" >/dev/null; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    >"$log/wheels.txt" 2>&1 || { say "wheel install failed"; tail "$log/wheels.txt"; }
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
if [ "$dry" = 1 ]; then  # the installed core, as CI built it
  "$py" -c "import skrull_ext._core as c; print('installed', c.__file__)" >"$log/build.txt" 2>&1 \
    && say "core: $(tail -1 "$log/build.txt")" || { say "core import FAILED"; tail -20 "$log/build.txt"; }
else
  export PYTHONPATH=$PWD:${PYTHONPATH:-}
  PYTHON=$py bash tools/build_inplace.sh >"$log/build.txt" 2>&1 && say "core: $(tail -1 "$log/build.txt")" \
    || { say "core build FAILED"; tail -20 "$log/build.txt"; }
fi
pack

# 3. The attention tests: every CPU case too (they must hold on this torch), the CUDA ones are the point.
export PYTHONUNBUFFERED=1
select=()
[ "$dry" = 1 ] && select=(-k cuda)  # CI runs the CPU cases already: here only that the CUDA ones collect
timeout 200 "$py" -m pytest -p no:cacheprovider -o addopts="-ra" -W ignore::DeprecationWarning -W ignore::FutureWarning \
  --junitxml="$log/pytest_cuda.xml" "${select[@]}" tests/unit_tests/test_dacp_attention.py \
  tests/unit_tests/test_dacp_kernels.py tests/unit_tests/test_trace_overlap.py >"$log/pytest_cuda.txt" 2>&1
say "pytest (rc $?): $(tail -1 "$log/pytest_cuda.txt")"
"$py" - "$log/pytest_cuda.xml" <<'EOF' >>"$summary" 2>/dev/null
import sys, xml.etree.ElementTree as ET
for case in ET.parse(sys.argv[1]).iter("testcase"):
    if "cuda" in case.get("name", ""):
        state = "skipped" if case.find("skipped") is not None else "FAILED" if (
            case.find("failure") is not None or case.find("error") is not None) else "passed"
        print(f"  {state:8} {case.get('name')} ({float(case.get('time', 0)):.1f} s)")
EOF
pack

# 4. Profiled overlap: a Qwen2.5-0.5B attention shape (14 heads over 2 K/V heads of 64); a micro-batch of
#    two long sequences (16K, 8K: distributed) and 40 long-tail short ones (local), ~45K tokens.
#    The dry run: CP 2 only, on CPU, 2 layers; a 512 and a 256 (distributed) and 8 short ones (local).
if [ "$dry" = 1 ]; then
  device=cpu cps=2
  shape=(--layers 2 --lengths 512 256 40 60 20 90 30 70 50 80 --local-max 200 --steps 1 --warmup 1)
else
  short=$("$py" -c "from skrull_ext.bench.attention import long_tail_lengths; print(*long_tail_lengths(40, 1))")
  device=cuda cps="2 4" shape=(--layers 6 --lengths 16384 8192 $short --local-max 4096 --steps 3)
fi
for cp in $cps; do
  for kernel in auto dense; do
    timeout 75 "$py" -m skrull_ext.bench overlap --device "$device" --cp "$cp" --kernel "$kernel" \
      --heads 14 --kv-heads 2 --head-dim 64 "${shape[@]}" \
      --out "$work/overlap_cp${cp}_${kernel}" >"$log/overlap_cp${cp}_${kernel}.txt" 2>&1
    say "overlap cp $cp kernel $kernel (rc $?): $(grep 'exchange hidden' "$log/overlap_cp${cp}_${kernel}.txt" || tail -2 "$log/overlap_cp${cp}_${kernel}.txt")"
    pack
  done
done

cp "$work"/overlap_cp2_auto/overlap.png "$out"/overlap_cp2_auto.png 2>/dev/null
say "packed: $(du -h "$out/gpu_checks.tar.gz" | cut -f1) in $out/gpu_checks.tar.gz"
