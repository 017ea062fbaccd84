#!/usr/bin/env bash
# Round 5's last device call (one H200, <= 9 min 20 s; run with timeout_s=600). From the repo root, with the wheels
# in .whl/ (transformers 5.24 in .whl/t524/) and bench/tmp/wholerun_data carried:
#   OUT=$OUT bash bench/gpu_round5_final.sh
# 1. issue 34: bench/gpu_round5_i34c.sh (the decoder's GPU tests, decode_bench with plain's logit margins and the
#    bf16 encoder; <= 232 s), its tar kept as $OUT/decode.tgz;
# 2. issue 31: bench/qwen3_asr_bench.py, the recipe, the graphed preset and the preset with train.gc_every (is the
#    preset's every-third-step 27 ms against 42 ms the Python collector?), 2 interleaved runs, the frozen tower's
#    time outside the graph in each preset row's note.
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-bench/tmp/gpu_out}; WHL=${WHL:-.whl}
mkdir -p "$OUT" /tmp/t524 /tmp/r31
bash bench/gpu_round5_i34c.sh
mv "$OUT/all.tgz" "$OUT/decode.tgz"
echo "== decode part done at $(( $(date +%s) - T0 )) s"

python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/t524 $WHL/t524/transformers*.whl 2>&1 | tail -n 2
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/pycache TORCHINDUCTOR_CACHE_DIR=/tmp/brisk_inductor
left=$(( 555 - ($(date +%s) - T0) )); [ $left -lt 60 ] && left=60
timeout "$left" python3 bench/qwen3_asr_bench.py --wheels $WHL --out /tmp/r31/q31 \
    --arms recipe,brisk_fast,brisk_fast_gc --steps 20 --warmup 5 --runs 2 --budget-s "$(( left - 45 ))" \
    > /tmp/r31/q31.log 2>&1
echo "qwen3_asr_bench exit $?"
tar czf "$OUT/q31.tgz" -C /tmp --exclude="checkpoint-*" --exclude="*.safetensors" --exclude="*.pt" r31
echo "== Qwen3-ASR"; grep "^|" /tmp/r31/q31.log | tail -n 5
python3 -c "
import json
for l in open('/tmp/r31/q31/results.jsonl'):
    d = json.loads(l); n = d.get('note', ''); i = n.find('audio rows outside')
    print(d['arm'], d['run'], [round(x) for x in d.get('ms_steps', [])], n[i:i + 160] if i >= 0 else '')
" 2>&1 | tail -n 8
echo "call took $(( $(date +%s) - T0 )) s"
