#!/usr/bin/env bash
# Issue 34's one GPU call (round 4; run at 9b979b6, when --fast meant today's --fast-buckets: the arms are
# named as the code names them now): the decoder's GPU tests, then bench/decode_bench.py (fast, compiled step,
# an arm that stops at EOS, plain, FunASR's inference) at batches 1, 16, 64. From the repo root on the GPU
# machine with the wheels in .whl/:
#   bash bench/gpu_round4_i34.sh        # ~6 minutes; results in $OUT (bench/results/2026-12-01-h200-round4/)
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-bench/tmp/gpu_out}
BUDGET=${BUDGET:-345}  # seconds the whole call may take
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/soundfile*.whl .whl/cffi*.whl .whl/pycparser*.whl .whl/jiwer*.whl .whl/rapidfuzz*.whl \
    .whl/funasr*.whl .whl/kaldiio*.whl .whl/omegaconf*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/pycache
unset PYTHONDONTWRITEBYTECODE
export TORCHINDUCTOR_CACHE_DIR=/tmp/brisk_inductor
left() { local s=$(( $1 - ($(date +%s) - T0) )); echo $(( s > 10 ? s : 10 )); }
{ date -u; nvidia-smi -L; python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers',
transformers.__version__)"; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
timeout 120 python3 -m pytest -o addopts="" -q -rs -p no:warnings --durations=6 \
    tests/gpu/test_fast_decode_gpu.py tests/gpu/test_device_features_gpu.py -s 2>&1 \
    | grep -v "^$" | tee "$OUT/gpu_tests.log" | tail -n 14
timeout "$(left "$BUDGET")" python3 bench/decode_bench.py --out /tmp/decode --arms fast_buckets,fast_eos,plain,fast_compile_buckets,funasr \
    --plain-profile 1 --slow-utts 4 --repeats 2 --budget "$(( $(left "$BUDGET") - 45 ))" > /tmp/decode.log 2>&1
echo "decode_bench exit $?"
tail -n 22 /tmp/decode.log
cp /tmp/decode/decode_bench.md /tmp/decode/decode_bench.json /tmp/decode.log "$OUT/" 2>/dev/null
echo "call took $(( $(date +%s) - T0 )) s"
