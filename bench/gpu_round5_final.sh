#!/usr/bin/env bash
# Round 5's last device call (one H200, <= 9 min 40 s: run with timeout_s=600). From the repo root, with the wheels
# in .whl/ (transformers 5.24 in .whl/t524/) and bench/tmp/wholerun_data carried:
#   OUT=$OUT bash bench/gpu_round5_final.sh
# 1. issue 31 (to 420 s): the Qwen3-ASR GPU tests of the graphed tower and the graphed step, then
#    bench/qwen3_asr_bench.py: the recipe, the preset (step and tower graphed), the preset with train.gc_every
#    (is the every-third-step 27 ms against 42 ms the Python collector?), 2 interleaved runs; each preset row's
#    note says the audio rows' synced time outside the step graph;
# 2. issue 34 (to 580 s): the decoder's GPU tests (the bf16 margin rule among them), then bench/decode_bench.py:
#    the fastest path with the bf16 encoder at 1, 16, 64; plain at 1 (4 utterances), 16, 64 with its logit
#    margins; the eager step on the LLM's own GEMMs (--fast, now) at 16 and 64.
# Results: $OUT/q31.tgz and $OUT/decode.tgz; the tables are printed last.
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-bench/tmp/gpu_out}; WHL=${WHL:-.whl}
mkdir -p "$OUT" /tmp/site /tmp/t524 /tmp/r31 /tmp/r
left() { local s=$(( $1 - ($(date +%s) - T0) )); echo $(( s > 10 ? s : 10 )); }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $WHL/soundfile*.whl $WHL/cffi*.whl \
    $WHL/pycparser*.whl $WHL/jiwer*.whl $WHL/rapidfuzz*.whl $WHL/funasr*.whl $WHL/kaldiio*.whl $WHL/omegaconf*.whl \
    $WHL/librosa*.whl $WHL/lazy_loader*.whl $WHL/soxr*.whl 2>&1 | tail -n 2
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/t524 $WHL/t524/transformers*.whl 2>&1 | tail -n 2
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/pycache TORCHINDUCTOR_CACHE_DIR=/tmp/brisk_inductor
{ date -u; nvidia-smi -L; python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers',
transformers.__version__)"; } > /tmp/r31/machine.txt 2>&1
PT="python3 -m pytest -o addopts= -q -rs -p no:warnings -p no:cacheprovider"

# 1. issue 31
PYTHONPATH=/tmp/t524:$PYTHONPATH timeout 120 $PT --timeout 110 tests/gpu/test_qwen3_asr_static_audio_cuda.py \
    tests/gpu/test_qwen3_asr_graph_cuda.py > /tmp/r31/gpu_tests_qwen3_asr.log 2>&1
echo "== Qwen3-ASR tests done at $(( $(date +%s) - T0 )) s"
timeout "$(left 420)" python3 bench/qwen3_asr_bench.py --wheels $WHL --out /tmp/r31/q31 \
    --arms recipe,brisk_fast,brisk_fast_gc --steps 20 --warmup 5 --runs 2 --budget-s "$(( $(left 420) - 50 ))" \
    > /tmp/r31/q31.log 2>&1
echo "qwen3_asr_bench exit $? at $(( $(date +%s) - T0 )) s"
tar czf "$OUT/q31.tgz" -C /tmp --exclude="checkpoint-*" --exclude="*.safetensors" --exclude="*.pt" r31

# 2. issue 34
timeout "$(( $(left 500) ))" $PT -s --timeout 100 tests/gpu/test_fast_decode_gpu.py > /tmp/r/gpu_tests_decode.log 2>&1
echo "== decode tests done at $(( $(date +%s) - T0 )) s"
timeout "$(left 580)" python3 bench/decode_bench.py --out /tmp/r/decode --arms fast_compile_buckets_enc16,plain,fast \
    --arm-batches fast:16/64 --plain-profile none --slow-utts 4 --repeats 2 --budget "$(( $(left 580) - 20 ))" \
    > /tmp/r/decode.log 2>&1
echo "decode_bench exit $?"
tar czf "$OUT/decode.tgz" -C /tmp r

cat /tmp/r31/machine.txt
echo "== Qwen3-ASR GPU tests"; tail -n 4 /tmp/r31/gpu_tests_qwen3_asr.log
echo "== Qwen3-ASR"; grep "^|" /tmp/r31/q31.log | tail -n 5
python3 -c "
import json
for l in open('/tmp/r31/q31/results.jsonl'):
    d = json.loads(l); n = d.get('note', ''); i = n.find('audio rows outside')
    print(d['arm'], d['run'], [round(x) for x in d.get('ms_steps', [])], n[i:i + 140] if i >= 0 else '')
" 2>&1 | tail -n 8
echo "== decode GPU tests"; grep -E "rows part from|passed|failed|error" /tmp/r/gpu_tests_decode.log | tail -n 6
echo "== decode"; cat /tmp/r/decode/decode_bench.md 2>/dev/null || tail -n 5 /tmp/r/decode.log
echo "call took $(( $(date +%s) - T0 )) s"
