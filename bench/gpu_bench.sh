#!/usr/bin/env bash
# The whole GPU comparison in one job (run from the repo root on the GPU machine; results go to $OUT or bench/tmp):
#   1. tests/gpu (pytest) and gpu_checks.py - CUDA-only correctness checks of the fast paths and the compile check
#   2. brisk doctor   - the machine's traps
#   3. brisk bench bench/configs/bench_nano.yaml - the arms table (printed last)
set -uo pipefail
OUT=${OUT:-bench/tmp}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m brisk doctor > "$OUT/doctor.md" 2>&1
timeout 300 python3 -m pytest tests/gpu -q -m gpu > "$OUT/gpu_tests.log" 2>&1 || echo "GPU tests failed: see $OUT/gpu_tests.log"
timeout 200 python3 bench/gpu_checks.py --out "$OUT" > "$OUT/gpu_checks.log" 2>&1 || echo "gpu_checks failed: see $OUT/gpu_checks.log"
timeout 420 python3 -m brisk bench bench/configs/bench_nano.yaml --out "$OUT" "$@" > "$OUT/bench.log" 2>&1 || echo "bench failed: see $OUT/bench.log"
cat "$OUT/gpu_checks.json" 2>/dev/null | head -c 2500
echo
cat "$OUT/bench.md" 2>/dev/null || tail -c 3000 "$OUT/bench.log"
