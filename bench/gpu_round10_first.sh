#!/usr/bin/env bash
# Round 10's first device call (one H200, <= 9.5 minutes; carry .whl):
#   OUT=$OUT bash bench/gpu_round10_first.sh
# What round 9 left (bench/results/2026-12-02-h200-round9/README.md):
# 1. (beside each other, ~200 s: fla's first compiles) tests/gpu/test_llm_kernels_cuda.py in its round-9 form
#    (fla packed and padded against the torch reference in bf16; the reference's own packed == padded in fp32),
#    never run whole; and bench/fla_fp32_check.py with TRITON_F32_DEFAULT=ieee (its own Triton cache), which
#    round 9 could not reach. Prediction: the tests pass; fla's fp32 dg error falls from 4.0e-2 to <= 1e-4
#    without TF32 (then TF32 is the cause, and fla's fp32 refusal stays).
# 2. Does the training step pay the same host-thread barrier that halved batch-64 decoding? sft_bench, Qwen3.5
#    2B (host-bound in round 6: 246 ms of wall for 208.5 ms of kernels), d_brisk_fast at 8,192 tokens, 8 timed
#    steps after 2, train.cpu_threads default (16) / 1 / 16 / 1, one process each, the same batches.
#    Prediction: if the barrier costs here, the 1-thread medians are >= 5% faster in both pairs; else within
#    the round-9 host spread (~3% between adjacent runs, 19% at worst).
set -uo pipefail
shopt -s nullglob
T0=$(date +%s)
OUT=${OUT:-bench/tmp/gpu_out}; WHL=${WHL:-.whl}
R=/tmp/r10; W=/tmp/sftw
mkdir -p "$OUT" $R /tmp/site
left() { local s=$(( $1 - ($(date +%s) - T0) )); echo $(( s > 10 ? s : 10 )); }
# every wheel a test or bench imports (round 9's third call lost its tests to a missing soundfile)
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site $WHL/soundfile*.whl \
    $WHL/cffi*.whl $WHL/pycparser*.whl $WHL/jiwer*.whl $WHL/rapidfuzz*.whl $WHL/fla_core*.whl \
    $WHL/liger_kernel*.whl 2>&1 | tail -n 2
export PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/pycache TORCHINDUCTOR_CACHE_DIR=/tmp/brisk_inductor \
    TRITON_CACHE_DIR=/tmp/triton_cache TOKENIZERS_PARALLELISM=false PYTHONPATH=$PWD:/tmp/site
{ date -u; nvidia-smi -L; git log -1 --format='commit %h %s' 2>/dev/null; nproc; } > $R/machine.txt 2>&1
TRITON_CACHE_DIR=/tmp/tc_ieee TRITON_F32_DEFAULT=ieee timeout 300 python3 bench/fla_fp32_check.py > $R/fp32_ieee.md 2>&1 &
timeout 200 python3 bench/fla_warm.py 16 > $R/fla_warm.log 2>&1 &
python3 tools/make_chat_data.py ultrachat --out $W/data --n 600 --n-valid 8 --seed 7 > $R/data.log 2>&1
timeout "$(left 300)" python3 -m pytest -o addopts= -v -rA --tb=short -p no:warnings -p no:cacheprovider \
    tests/gpu/test_llm_kernels_cuda.py -k "reference or syncs" > $R/gpu_tests.log 2>&1
echo "== kernel tests exit $? at $(( $(date +%s) - T0 )) s"
wait
B="python3 bench/sft_bench.py --wheels $WHL --work $W --no-profile --models qwen3_5_2b --arms d_brisk_fast"
i=0
for th in 16 1 16 1; do
    i=$(( i + 1 )); end=$(( 300 + 60 * i ))
    extra=(); [ $th = 1 ] && extra=(--set train.cpu_threads=1)
    timeout "$(( $(left $end) + 15 ))" $B --batch-tokens 8192 --steps 8 --warmup 2 --out $R/t${i}_$th \
        --budget-s "$(( $(left $end) > 50 ? $(left $end) - 45 : 1 ))" ${extra[@]+"${extra[@]}"} > $R/t${i}_$th.log 2>&1
    echo "== 2B threads $th ($i) exit $? at $(( $(date +%s) - T0 )) s"
done
tar czf "$OUT/all.tgz" -C /tmp r10 2>/dev/null
{ cat $R/machine.txt; grep -E "^E |PASSED|FAILED|passed|failed" $R/gpu_tests.log | cut -c1-800 | tail -n 12
  echo; cut -c1-300 $R/fp32_ieee.md; echo
  python3 bench/sft_bench.py --table $R/t*/results.jsonl 2>&1; } > "$OUT/summary.md"
echo "== done in $(( $(date +%s) - T0 )) s"; cat "$OUT/summary.md"
