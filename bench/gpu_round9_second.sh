#!/usr/bin/env bash
# Round 9's second device call (one H200, <= 9.5 minutes; carry .whl):
#   OUT=$OUT bash bench/gpu_round9_second.sh
# 1. tests/gpu/test_llm_kernels_cuda.py's bf16 test, now against transformers' torch chunk function instead of
#    fla's kernel (round 8: its "reference" was fla at another batch shape), alone (~190 s of fla compiles),
#    while fla's kernels for the 9B's 32 value heads compile beside it (bench/fla_warm.py 32).
# 2. speed.label_head_recompute's cost on the 9B, settled: round 8 measured -0.7% on the median step at 8,192
#    tokens and -5.4% at 4,096, where 4 timed steps varied by ~1,000 tokens/s. Here d_brisk_fast at 4,096 with 8
#    timed steps after 2, off / on / off / on (one worker process each, the same batches). Prediction: within 2%
#    of each other on the median step (one more LM-head GEMM per 512-row chunk against 32 layers' work).
set -uo pipefail
shopt -s nullglob
T0=$(date +%s)
OUT=${OUT:-bench/tmp/gpu_out}; WHL=${WHL:-.whl}
R=/tmp/r9b; W=/tmp/sftw
mkdir -p "$OUT" $R /tmp/site
left() { local s=$(( $1 - ($(date +%s) - T0) )); echo $(( s > 10 ? s : 10 )); }
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site $WHL/soundfile*.whl \
    $WHL/cffi*.whl $WHL/pycparser*.whl $WHL/jiwer*.whl $WHL/rapidfuzz*.whl $WHL/fla_core*.whl \
    $WHL/liger_kernel*.whl 2>&1 | tail -n 2
export PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/pycache TORCHINDUCTOR_CACHE_DIR=/tmp/brisk_inductor \
    TRITON_CACHE_DIR=/tmp/triton_cache TOKENIZERS_PARALLELISM=false PYTHONPATH=$PWD:/tmp/site
{ date -u; nvidia-smi -L; git log -1 --format='commit %h %s' 2>/dev/null; } > $R/machine.txt 2>&1
timeout 200 python3 bench/fla_warm.py 32 > $R/fla_warm.log 2>&1 &
python3 tools/make_chat_data.py ultrachat --out $W/data --n 600 --n-valid 8 --seed 7 > $R/data.log 2>&1
timeout "$(left 230)" python3 -m pytest -o addopts= -v -rA --tb=short -p no:warnings -p no:cacheprovider \
    tests/gpu/test_llm_kernels_cuda.py -k "bf16" > $R/gpu_tests.log 2>&1
echo "== bf16 test exit $? at $(( $(date +%s) - T0 )) s"
wait
B="python3 bench/sft_bench.py --wheels $WHL --work $W --no-profile --models qwen3_5_9b --arms d_brisk_fast"
i=0
for rc in off on off on; do
    i=$(( i + 1 )); end=$(( 230 + 80 * i ))
    extra=(); [ $rc = on ] && extra=(--set speed.label_head=true speed.label_head_recompute=true)
    timeout "$(( $(left $end) + 15 ))" $B --batch-tokens 4096 --steps 8 --warmup 2 --out $R/m${i}_$rc \
        --budget-s "$(( $(left $end) > 66 ? $(left $end) - 65 : 1 ))" ${extra[@]+"${extra[@]}"} > $R/m${i}_$rc.log 2>&1
    echo "== 9B 4,096 recompute $rc ($i) exit $? at $(( $(date +%s) - T0 )) s"
done
tar czf "$OUT/all.tgz" -C /tmp r9b 2>/dev/null
{ cat $R/machine.txt; grep -E "^E |PASSED|FAILED|passed|failed" $R/gpu_tests.log | cut -c1-800 | tail -n 10
  python3 bench/sft_bench.py --table $R/m*/results.jsonl 2>&1; } > "$OUT/summary.md"
echo "== done in $(( $(date +%s) - T0 )) s"; cat "$OUT/summary.md"
