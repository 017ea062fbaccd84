#!/usr/bin/env bash
# Round 10's first device calls (one H200, <= 9.5 minutes each; carry .whl):
#   OUT=$OUT bash bench/gpu_round10_first.sh tests     # then, on the warm machine:
#   OUT=$OUT bash bench/gpu_round10_first.sh threads
# What round 9 left (bench/results/2026-12-02-h200-round9/README.md):
# tests: tests/gpu/test_llm_kernels_cuda.py whole (every test in it), alone (round 9: three processes compiling
#    Triton kernels at once starved each other), in its round-9 form: fla packed and padded against the torch
#    reference in bf16, the reference's own packed == padded in fp32, the sync count in bf16 measured twice.
#    Then, in the time left, bench/fla_fp32_check.py with TRITON_F32_DEFAULT=ieee (its own Triton cache).
#    Prediction: the tests pass; without TF32 fla's fp32 dg error falls from 4.0e-2 to <= 1e-4 (then TF32 is
#    the cause; the fp32 refusal stays either way).
# threads: does the training step pay the host-thread barrier that halved batch-64 decoding? sft_bench, Qwen3.5
#    2B (host-bound in round 6: 246 ms of wall for 208.5 ms of kernels), d_brisk_fast at 8,192 tokens, 8 timed
#    steps after 2, train.cpu_threads unset (16) / 1 / 16 / 1, one process each, the same batches; fla's 2B
#    kernels compiled first (bench/fla_warm.py 16). Prediction: if the barrier costs here, the 1-thread medians
#    are >= 5% faster in both pairs; else within round 9's host spread (3% between adjacent runs, 19% at worst).
set -uo pipefail
shopt -s nullglob
PART=${1:?tests or threads}
T0=$(date +%s)
OUT=${OUT:-bench/tmp/gpu_out}; WHL=${WHL:-.whl}
R=/tmp/r10_$PART; W=/tmp/sftw
mkdir -p "$OUT" $R /tmp/site
left() { local s=$(( $1 - ($(date +%s) - T0) )); echo $(( s > 10 ? s : 10 )); }
# every wheel a test or bench imports (round 9's third call lost its tests to a missing soundfile)
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site $WHL/soundfile*.whl \
    $WHL/cffi*.whl $WHL/pycparser*.whl $WHL/jiwer*.whl $WHL/rapidfuzz*.whl $WHL/fla_core*.whl \
    $WHL/liger_kernel*.whl 2>&1 | tail -n 2
export PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/pycache TORCHINDUCTOR_CACHE_DIR=/tmp/brisk_inductor \
    TRITON_CACHE_DIR=/tmp/triton_cache TOKENIZERS_PARALLELISM=false PYTHONPATH=$PWD:/tmp/site
{ date -u; nvidia-smi -L; git log -1 --format='commit %h %s' 2>/dev/null; nproc; } > $R/machine.txt 2>&1
if [ "$PART" = tests ]; then
    timeout 380 python3 -m pytest -o addopts= -v -rA --tb=short -p no:warnings -p no:cacheprovider --durations=0 \
        tests/gpu/test_llm_kernels_cuda.py > $R/gpu_tests.log 2>&1
    echo "== kernel tests exit $? at $(( $(date +%s) - T0 )) s"
    TRITON_CACHE_DIR=/tmp/tc_ieee TRITON_F32_DEFAULT=ieee timeout "$(left 560)" python3 bench/fla_fp32_check.py \
        > $R/fp32_ieee.md 2>&1
    echo "== fp32 check (ieee) exit $? at $(( $(date +%s) - T0 )) s"
    summary() { grep -E "^E |PASSED|FAILED|SKIPPED|passed|failed" $R/gpu_tests.log | cut -c1-800 | tail -n 16
                echo; cut -c1-300 $R/fp32_ieee.md; }
else
    timeout 200 python3 bench/fla_warm.py 16 > $R/fla_warm.log 2>&1 &
    python3 tools/make_chat_data.py ultrachat --out $W/data --n 600 --n-valid 8 --seed 7 > $R/data.log 2>&1
    wait
    echo "== warm at $(( $(date +%s) - T0 )) s"
    B="python3 bench/sft_bench.py --wheels $WHL --work $W --no-profile --models qwen3_5_2b --arms d_brisk_fast"
    i=0; start=$(( $(date +%s) - T0 ))
    for th in 16 1 16 1; do
        i=$(( i + 1 )); end=$(( start + 85 * i ))
        extra=(); [ $th = 1 ] && extra=(--set train.cpu_threads=1)
        timeout "$(( $(left $end) + 15 ))" $B --batch-tokens 8192 --steps 8 --warmup 2 --out $R/t${i}_$th \
            --budget-s "$(( $(left $end) > 70 ? $(left $end) - 65 : 1 ))" ${extra[@]+"${extra[@]}"} > $R/t${i}_$th.log 2>&1
        echo "== 2B threads $th ($i) exit $? at $(( $(date +%s) - T0 )) s"
    done
    summary() { python3 bench/sft_bench.py --table $R/t*/results.jsonl 2>&1
                for f in $R/t*/results.jsonl; do python3 -c "import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line); print(sys.argv[1], 'threads', r.get('torch_threads'), 'median', r.get('tps_steps') and sorted(r['tps_steps'])[len(r['tps_steps']) // 2])" "$f"; done; }
fi
tar czf "$OUT/all.tgz" -C /tmp "r10_$PART" 2>/dev/null
{ cat $R/machine.txt; summary; } > "$OUT/summary.md"
echo "== done in $(( $(date +%s) - T0 )) s"; cat "$OUT/summary.md"
