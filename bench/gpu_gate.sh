#!/usr/bin/env bash
# The GPU gate on a bare device machine, from the repo root, with .whl/ (soundfile, cffi, pycparser, jiwer,
# rapidfuzz, click, fla-core; .whl/tf/ a transformers with qwen3_asr) and bench/tmp/wholerun_data carried:
#   OUT=$OUT bash bench/gpu_gate.sh [gate.py arguments]      # e.g. --only nano_real
# TESTS="tests/gpu/..." adds a pytest run of those GPU tests after the gate (its log: $OUT/gpu_tests.log).
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-bench/tmp/gpu_out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site_asr .whl/tf/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/pycache
unset PYTHONDONTWRITEBYTECODE
{ date -u; nvidia-smi -L; python3 -c "import torch, transformers, triton; print('torch', torch.__version__,
'transformers', transformers.__version__, 'triton', triton.__version__)"; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
[ -f /tmp/nano/model.pt ] || timeout 180 python3 tools/make_nano_folder.py --out /tmp/nano > "$OUT/make_nano.log" 2>&1 \
    || { echo "make_nano_folder failed"; tail -n 20 "$OUT/make_nano.log"; }
echo "== nano folder at $(( $(date +%s) - T0 )) s"
python3 bench/gpu_gate.py --out /tmp/gate --asr-pythonpath /tmp/site_asr "$@"
cp /tmp/gate/gate.md /tmp/gate/gate.json "$OUT/" 2>/dev/null
tar czf "$OUT/gate_logs.tgz" -C /tmp/gate logs 2>/dev/null
if [ -n "${TESTS:-}" ]; then
    timeout "${TESTS_TIMEOUT:-240}" python3 -m pytest -o addopts="" -q -rs -p no:warnings $TESTS > "$OUT/gpu_tests.log" 2>&1
    tail -n 15 "$OUT/gpu_tests.log"
fi
echo "== elapsed $(( $(date +%s) - T0 )) s"
