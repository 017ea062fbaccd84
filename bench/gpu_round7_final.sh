#!/usr/bin/env bash
# Round 7's last device call (one H200, <= 5.5 minutes, carry .whl and bench/tmp/wholerun_data):
#   OUT=$OUT bash bench/gpu_round7_final.sh
# 1. tests/gpu/test_llm_step_cuda.py's Qwen3 fp32 compiled == eager case alone, with its traceback (rounds 6 and 7
#    lost the message: pytest was killed by the part's time limit before its summary);
# 2. bench/decode_bench.py at batch 64, both compiled arms, 5 timed whole passes each (round 7's first call timed
#    one pass an arm: 109.7 and 143.7 utts/s, with 64.5 / 36.1 ms of audio reading and 63.4 / 6.9 ms of other
#    host work in the profiled batch: host noise on a one-batch set).
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-bench/tmp/gpu_out}; WHL=${WHL:-.whl}
mkdir -p "$OUT" /tmp/site /tmp/rf
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $WHL/soundfile*.whl $WHL/cffi*.whl \
    $WHL/pycparser*.whl $WHL/jiwer*.whl $WHL/rapidfuzz*.whl $WHL/liger_kernel*.whl 2>&1 | tail -n 2
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/pycache TORCHINDUCTOR_CACHE_DIR=/tmp/brisk_inductor
{ date -u; nvidia-smi -L; git log -1 --format='commit %h %s' 2>/dev/null; } > /tmp/rf/machine.txt 2>&1
timeout 130 python3 -m pytest -o addopts= -v -rA --tb=long -p no:warnings -p no:cacheprovider \
    tests/gpu/test_llm_step_cuda.py -k "qwen3-fp32" > /tmp/rf/fp32_test.log 2>&1
echo "== fp32 test exit $? at $(( $(date +%s) - T0 )) s"
left=$(( 320 - ($(date +%s) - T0) )); [ $left -lt 60 ] && left=60
timeout "$left" python3 bench/decode_bench.py --out /tmp/rf/decode \
    --arms fast_compile_buckets_multi_enc16,fast_compile_buckets_tuned_multi_enc16 --batches 64 --repeats 1 \
    --passes 5 --budget "$(( left - 15 ))" > /tmp/rf/decode.log 2>&1
echo "== decode_bench exit $? at $(( $(date +%s) - T0 )) s"
cp /tmp/rf/fp32_test.log /tmp/rf/machine.txt "$OUT"/; cp /tmp/rf/decode/decode_bench.md "$OUT"/ 2>/dev/null
tail -n 30 /tmp/rf/decode.log > "$OUT/decode_tail.log"
grep -E "^E |Error|assert|PASSED|FAILED|passed|failed" /tmp/rf/fp32_test.log | head -n 40
grep -E "^\| brisk" /tmp/rf/decode/decode_bench.md 2>/dev/null | cut -c1-200 || tail -n 5 /tmp/rf/decode.log
