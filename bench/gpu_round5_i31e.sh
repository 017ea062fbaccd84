#!/usr/bin/env bash
# Issue 31: Qwen3-ASR's frozen audio tower in a CUDA graph per step bucket (GraphedAudioInputs), so the preset's
# step is a few gathering launches and two replays. One device call (one H200, <= 9 min 40 s: run it with
# timeout_s=600). From the repo root, with the wheels in .whl/ (soundfile, cffi, pycparser; transformers 5.24 in
# .whl/t524/) carried:
#   OUT=$OUT bash bench/gpu_round5_i31e.sh
# 1. GPU tests (transformers 5.24 first on their path, <= 230 s): the graphed tower's rows against the eager
#    tower's (fp32 and bf16, zero-length windows, no host sync: test_qwen3_asr_static_audio_cuda.py), the graphed
#    step with the graphed tower against the eager step, the preset without a recompile, no host sync in a step
#    (test_qwen3_asr_graph_cuda.py), the preset against the plain step (test_qwen3_asr_cuda.py);
# 2. bench/qwen3_asr_bench.py: the recipe, the preset (tower graphed), the preset without the graphs, 20 timed
#    steps, 2 interleaved runs (the table printed last, then each preset row's audio time).
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-bench/tmp/gpu_out}; WHL=${WHL:-.whl}
mkdir -p "$OUT" /tmp/site /tmp/t524 /tmp/r
left() { local s=$(( $1 - ($(date +%s) - T0) )); echo $(( s > 10 ? s : 10 )); }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $WHL/soundfile*.whl $WHL/cffi*.whl \
    $WHL/pycparser*.whl 2>&1 | tail -n 2
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/t524 $WHL/t524/transformers*.whl 2>&1 | tail -n 2
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/pycache TORCHINDUCTOR_CACHE_DIR=/tmp/brisk_inductor
{ date -u; nvidia-smi -L; PYTHONPATH=/tmp/t524:$PYTHONPATH python3 -c "import torch, transformers; print('torch',
torch.__version__, 'transformers', transformers.__version__)"; git log -1 --format='%h %s' 2>/dev/null; } > /tmp/r/machine.txt 2>&1

PT="python3 -m pytest -o addopts= -q -rs -p no:warnings -p no:cacheprovider --timeout 200"
PYTHONPATH=/tmp/t524:$PYTHONPATH timeout 230 $PT tests/gpu/test_qwen3_asr_static_audio_cuda.py \
    tests/gpu/test_qwen3_asr_graph_cuda.py tests/gpu/test_qwen3_asr_cuda.py > /tmp/r/gpu_tests_i31e.log 2>&1
echo "== part 1 done at $(( $(date +%s) - T0 )) s"

timeout "$(left 560)" python3 bench/qwen3_asr_bench.py --wheels $WHL --out /tmp/r/q31 \
    --arms recipe,brisk_fast,brisk_fast_nograph --steps 20 --warmup 5 --runs 2 --budget-s "$(( $(left 560) - 60 ))" \
    > /tmp/r/q31.log 2>&1
echo "qwen3_asr_bench exit $?"

tar czf "$OUT/all.tgz" -C /tmp --exclude="checkpoint-*" --exclude="*.safetensors" --exclude="*.pt" r
cat /tmp/r/machine.txt
echo "== GPU tests"; tail -n 15 /tmp/r/gpu_tests_i31e.log
echo "== Qwen3-ASR"; grep "^|" /tmp/r/q31.log | tail -n 5
python3 -c "
import json
for l in open('/tmp/r/q31/results.jsonl'):
    d = json.loads(l); n = d.get('note', ''); i = n.find('audio rows outside')
    if i >= 0: print(d['arm'], d['run'], 'median', round(d['ms_median'], 1), 'steps', [round(x) for x in d['ms_steps']], n[i:i + 120])
" 2>&1 | tail -n 6
echo "call took $(( $(date +%s) - T0 )) s"
