#!/usr/bin/env bash
# Issue 34 (helper i34c), one device call on one H200, <= 4 minutes. From the repo root, with the wheels in .whl/
# (soundfile, cffi, pycparser, jiwer, rapidfuzz, funasr, kaldiio, omegaconf, librosa, lazy_loader, soxr) and
# bench/tmp/wholerun_data (tools/make_wholerun_data.py) carried:
#   OUT=$OUT bash bench/gpu_round5_i34c.sh
# 1. the decoder's GPU tests (<= 110 s), among them the bf16 margin rule at Qwen3-0.6B's layer widths;
# 2. bench/decode_bench.py (<= 125 s): the fastest path (compiled step, length buckets, encoder bf16) at 1, 16,
#    64; plain at 1 (4 utterances), 16, 64 with its logit margins; the eager step with the LLM's GEMMs (fast, the
#    new default) at 16 and 64; concatenated GEMMs, the LLM's forward and the compiled step at 16, for which
#    part of the step parts the bf16 ids from plain's.
# Everything lands in $OUT/all.tgz; the table is printed last.
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-bench/tmp/gpu_out}; WHL=${WHL:-.whl}
mkdir -p "$OUT" /tmp/site /tmp/r
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $WHL/soundfile*.whl $WHL/cffi*.whl \
    $WHL/pycparser*.whl $WHL/jiwer*.whl $WHL/rapidfuzz*.whl $WHL/funasr*.whl $WHL/kaldiio*.whl $WHL/omegaconf*.whl \
    $WHL/librosa*.whl $WHL/lazy_loader*.whl $WHL/soxr*.whl 2>&1 | tail -n 2
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/pycache TORCHINDUCTOR_CACHE_DIR=/tmp/brisk_inductor
{ date -u; nvidia-smi -L; python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers',
transformers.__version__)"; } > /tmp/r/machine.txt 2>&1

PT="python3 -m pytest -o addopts= -q -rs -s -p no:warnings -p no:cacheprovider --timeout 100"
timeout 110 $PT tests/gpu/test_device_features_gpu.py tests/gpu/test_fast_decode_gpu.py > /tmp/r/gpu_tests_decode.log 2>&1
echo "== GPU tests done at $(( $(date +%s) - T0 )) s"

left=$(( 232 - ($(date +%s) - T0) )); [ $left -lt 60 ] && left=60
timeout "$left" python3 bench/decode_bench.py --out /tmp/r/decode \
    --arms fast_compile_buckets_enc16,plain,fast,fast_concat,fast_llm,fast_compile \
    --arm-batches fast:16/64,fast_concat:16,fast_llm:16,fast_compile:16 --plain-profile none --slow-utts 4 \
    --repeats 2 --budget "$(( left - 25 ))" > /tmp/r/decode.log 2>&1
echo "decode_bench exit $?"

tar czf "$OUT/all.tgz" -C /tmp r
cat /tmp/r/machine.txt
echo "== GPU tests"; grep -E "rows part from|passed|failed|error" /tmp/r/gpu_tests_decode.log | tail -n 8
echo "== decode"; cat /tmp/r/decode/decode_bench.md 2>/dev/null || tail -n 5 /tmp/r/decode.log
echo "call took $(( $(date +%s) - T0 )) s"
