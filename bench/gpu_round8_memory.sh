#!/usr/bin/env bash
# Issue 30's 9B memory goal (<= 22 GB peak, Unsloth's published figure) with speed.label_head_recompute
# (one H200, <= 9.5 minutes, carry .whl):
#   OUT=$OUT bash bench/gpu_round8_memory.sh
# Round 6 (bench/gpu_round5_i30.sh, d_brisk_fast): sft_qwen3_5_9b 21.0 GiB (22.5 GB) at 4,096 tokens a batch and
# 24.0 GiB at 8,192, label_head's chunks bounding the forward only: cross-entropy kept every labelled row's fp32
# log-probabilities (248,320 x 4 bytes, ~1 MiB a row) for the backward. Predicted with the recompute: -1 to
# -1.5 GiB at 4,096 (under 22 GB), about twice that at 8,192; tokens/s within 2% (one more head GEMM a step).
# Arms: d_brisk_fast at 4,096 then 8,192 tokens, each without and with --set speed.label_head_recompute=true (with
# speed.label_head=true beside it: sft_bench's worker loads the config with the --set keys before the arm's own);
# fla's kernels for 32 value heads compiled first (bench/fla_warm.py 32).
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-bench/tmp/gpu_out}; WHL=${WHL:-.whl}
R=/tmp/r8m; W=/tmp/sftw
mkdir -p "$OUT" $R /tmp/site
left() { local s=$(( $1 - ($(date +%s) - T0) )); echo $(( s > 10 ? s : 10 )); }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $WHL/soundfile*.whl $WHL/cffi*.whl \
    $WHL/pycparser*.whl $WHL/jiwer*.whl $WHL/rapidfuzz*.whl 2>&1 | tail -n 2
python3 -m pip install -q --no-index --no-deps --no-compile --target $W/site_fla $WHL/fla_core*.whl $WHL/liger_kernel*.whl \
    2>&1 | tail -n 2
export PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/pycache TORCHINDUCTOR_CACHE_DIR=/tmp/brisk_inductor \
    TRITON_CACHE_DIR=/tmp/triton_cache TOKENIZERS_PARALLELISM=false PYTHONPATH=$PWD:/tmp/site
{ date -u; nvidia-smi -L; git log -1 --format='commit %h %s' 2>/dev/null; } > $R/machine.txt 2>&1
( for n in 4096 8192; do python3 bench/sft_bench.py --estimate --models qwen3_5_9b --batch-tokens $n
    python3 bench/sft_bench.py --estimate --models qwen3_5_9b --batch-tokens $n \
    --set speed.label_head=true speed.label_head_recompute=true; done > $R/estimate.md 2>&1 ) &
PYTHONPATH=$PWD:$W/site_fla:/tmp/site timeout 170 python3 bench/fla_warm.py 32 > $R/fla_warm.log 2>&1 &
python3 tools/make_chat_data.py ultrachat --out $W/data --n 600 --n-valid 8 --seed 7 > $R/data.log 2>&1
wait; echo "== warm-up done at $(( $(date +%s) - T0 )) s"
B="python3 bench/sft_bench.py --wheels $WHL --work $W --no-profile --models qwen3_5_9b --arms d_brisk_fast"
part() {  # name end_s batch_tokens [--set ...]
    local name=$1 end=$2 tokens=$3; shift 3
    timeout "$(( $(left $end) + 15 ))" $B --batch-tokens $tokens --steps 4 --warmup 1 --out $R/$name \
        --budget-s "$(( $(left $end) > 66 ? $(left $end) - 65 : 1 ))" "$@" > $R/$name.log 2>&1
    echo "== $name exit $? at $(( $(date +%s) - T0 )) s"; grep '^{' $R/$name.log | cut -c1-300
}
part m1_4096 300 4096
part m2_4096_recompute 390 4096 --set speed.label_head=true speed.label_head_recompute=true
part m3_8192 480 8192
part m4_8192_recompute 565 8192 --set speed.label_head=true speed.label_head_recompute=true
tar czf "$OUT/all.tgz" -C /tmp r8m 2>/dev/null
python3 bench/sft_bench.py --table $R/m*/results.jsonl > "$OUT/summary.md" 2>&1
echo "== done in $(( $(date +%s) - T0 )) s"; cat $R/estimate.md "$OUT/summary.md"
