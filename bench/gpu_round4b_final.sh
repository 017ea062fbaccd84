#!/usr/bin/env bash
# Round 4b's last device call (one H200, ~6 minutes): issue 34's fused decode step and issue 31's Qwen3-ASR audio
# path, each measured once. From the repo root, the wheels in .whl/ (transformers 5.24 in .whl/t524/) and the
# whole-run set in bench/tmp/wholerun_data (decode_bench's 40 utterances):
#   OUT=$OUT bash bench/gpu_round4b_final.sh
# 1. correctness, side by side (nothing timed): the decoder's and device features' GPU tests; the Qwen3-ASR GPU
#    tests (transformers 5.24 first on the path); the graphed training step's (tests/gpu/test_gpu_state.py);
# 2. bench/qwen3_asr_bench.py: the recipe, the preset as shipped, and the preset without speed.audio_varlen;
# 3. bench/decode_bench.py: the compiled fused step with graphed encoder/prefill, without, and the plain decoder.
# Everything lands in $OUT/all.tgz (a call returns 8 files at most); the tables are printed last.
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-bench/tmp/gpu_out}; WHL=${WHL:-.whl}; END=${END:-340}
mkdir -p "$OUT" /tmp/site /tmp/t524 /tmp/r
left() { local s=$(( $1 - ($(date +%s) - T0) )); echo $(( s > 10 ? s : 10 )); }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $WHL/soundfile*.whl $WHL/cffi*.whl \
    $WHL/pycparser*.whl $WHL/jiwer*.whl $WHL/rapidfuzz*.whl $WHL/funasr*.whl $WHL/kaldiio*.whl $WHL/omegaconf*.whl \
    $WHL/librosa*.whl $WHL/lazy_loader*.whl $WHL/soxr*.whl 2>&1 | tail -n 2
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/t524 $WHL/t524/transformers*.whl 2>&1 | tail -n 2
export PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/pycache TORCHINDUCTOR_CACHE_DIR=/tmp/brisk_inductor
{ date -u; nvidia-smi -L; git log -1 --format='commit %h %s' 2>/dev/null; python3 -c "import torch, transformers;
print('torch', torch.__version__, 'transformers', transformers.__version__)"; } > /tmp/r/machine.txt 2>&1

# 1. GPU tests, both families at once
PT="python3 -m pytest -o addopts= -q -rs -p no:warnings -p no:cacheprovider --timeout 90"
PYTHONPATH=/tmp/site:$PWD timeout 100 $PT tests/gpu/test_device_features_gpu.py tests/gpu/test_fast_decode_gpu.py \
    > /tmp/r/gpu_tests_decode.log 2>&1 &
PYTHONPATH=/tmp/site:$PWD:/tmp/t524 timeout 100 $PT tests/gpu/test_qwen3_asr_cuda.py \
    tests/gpu/test_qwen3_asr_audio_varlen_cuda.py > /tmp/r/gpu_tests_qwen3_asr.log 2>&1 &
PYTHONPATH=/tmp/site:$PWD timeout 100 $PT tests/gpu/test_gpu_state.py > /tmp/r/gpu_tests_state.log 2>&1 &  # the graphed step
wait
echo "== part 1 done at $(( $(date +%s) - T0 )) s"

# 2. Qwen3-ASR: the recipe against the preset as shipped
PYTHONPATH=/tmp/site:$PWD timeout "$(left ${QEND:-230})" python3 bench/qwen3_asr_bench.py --wheels $WHL --out /tmp/r/q31 \
    --arms recipe,brisk_fast,brisk_fast_nav --steps 15 --warmup 4 --runs ${QRUNS:-1} --budget-s "$(( $(left ${QEND:-230}) - 10 ))" > /tmp/r/q31.log 2>&1
echo "qwen3_asr_bench exit $?"

# 3. the decoder
PYTHONPATH=/tmp/site:$PWD timeout "$(left $END)" python3 bench/decode_bench.py --out /tmp/r/decode \
    --arms fast_compile_buckets,fast_compile,plain --plain-profile 1 --slow-utts 4 --repeats 1 \
    --budget "$(( $(left $END) - 40 ))" > /tmp/r/decode.log 2>&1
echo "decode_bench exit $?"

tar czf "$OUT/all.tgz" -C /tmp --exclude="checkpoint-*" --exclude="*.safetensors" --exclude="*.pt" r
cat /tmp/r/machine.txt
echo "== GPU tests"; for f in decode qwen3_asr state; do tail -n 4 /tmp/r/gpu_tests_$f.log; done
echo "== Qwen3-ASR"; grep "^|" /tmp/r/q31.log | tail -n 4
echo "== decode"; grep -i "error\|Traceback" /tmp/r/decode.log | head -n 4; cat /tmp/r/decode/decode_bench.md 2>/dev/null
echo "call took $(( $(date +%s) - T0 )) s"
