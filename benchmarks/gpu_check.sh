#!/usr/bin/env bash
# The GPU check in one command, bounded: on a machine with one NVIDIA GPU and a Python that has
# CUDA PyTorch (no network needed), it builds the core against that PyTorch and CUDA, runs the
# CUDA tests (marker gpu) and times our NCCL path beside torch.distributed's at 1 rank.
#
#   bash benchmarks/gpu_check.sh [OUT_DIR]      # GPU_CHECK_TIMEOUT (seconds, default 540) bounds it all
#
# Prints, and writes under OUT_DIR (default ./gpu-check): build.log, tests.log, nccl.json and
# the table of benchmarks/nccl_allreduce.py (4 KiB and 64 MiB: the per-call cost our path adds
# over torch.distributed's NCCL). Exits 2 where no CUDA device is seen, otherwise with the first
# failing step's status. The compiler is /usr/bin/g++ unless CXX says otherwise: a compiler that
# links libstdc++ statically crashes beside torch's.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-gpu-check}
LIMIT=${GPU_CHECK_TIMEOUT:-540}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
deadline=$((SECONDS + LIMIT))
left() { echo $((deadline - SECONDS > 10 ? deadline - SECONDS : 10)); }

if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "gpu_check: no CUDA device seen by $PY's torch; nothing to check" >&2
  exit 2
fi
"$PY" -c 'import torch; print("gpu_check:", torch.cuda.get_device_name(0), "torch", torch.__version__, "CUDA", torch.version.cuda)'

echo "gpu_check: building the core (log: $OUT/build.log)"
CMAKE_ARGS="-DCMAKE_CXX_COMPILER=${CXX:-/usr/bin/g++} ${CMAKE_ARGS:-}" timeout "$(left)" \
  "$PY" -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/build.log" 2>&1 \
  || { echo "gpu_check: the build failed; the end of $OUT/build.log:" >&2; tail -20 "$OUT/build.log" >&2; exit 1; }

echo "gpu_check: the CUDA tests (log: $OUT/tests.log)"
timeout "$(left)" "$PY" -m pytest tests -m gpu -q -p no:cacheprovider >"$OUT/tests.log" 2>&1
tests=$?
tail -3 "$OUT/tests.log"

echo "gpu_check: our NCCL path beside torch.distributed's, 1 rank"
timeout "$(left)" "$PY" benchmarks/nccl_allreduce.py --np 1 --sizes 4K,64M --json "$OUT/nccl.json"
bench=$?
[ "$tests" -eq 0 ] || exit "$tests"
exit "$bench"
