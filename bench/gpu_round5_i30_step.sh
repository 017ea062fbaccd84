#!/usr/bin/env bash
# Issue 30, item 4 (one H200, one call, <= 8 minutes): the rest of the hybrid's step, and the dense Qwen3 row.
# From the repo root, with fla-core and liger-kernel wheels in $WHL (default .whl):
#   OUT=$OUT bash bench/gpu_round5_i30_step.sh
# 0. (untimed, in parallel, <= ${END0:-140} s) fla's Triton kernels for 16 value heads (bench/fla_warm.py), the
#    compiled arm of each model run once (Inductor's cold compile lands in TORCHINDUCTOR_CACHE_DIR, so the timed
#    arm below starts warm: its compile time is printed here, from the log), and the GPU tests of the fused norms
#    and of compiled == eager (tests/gpu/test_llm_step_cuda.py), then `brisk doctor --kernels` on the 2B config
#    (fla's delta rule, conv and fused gated norm, liger, varlen attention against fp32);
# 1. bench/sft_bench.py on Qwen3.5 2B (fla on) and Qwen3 1.7B, the same batches (8,192 padded tokens a batch),
#    one arm at a time on the otherwise idle GPU: a_loop (the seed's loop), d_brisk_fast (today's),
#    d4_brisk_fast_compile (compiled decoder layers, fla eager between the graphs, no liger) and
#    d3_brisk_fast_norms (+ fla's fused gated norm; the dense model has none);
#    op tables of one step of every brisk arm, grouped (ops_*_groups.md: GEMM / attention / linear attention /
#    norms / loss / optimizer / elementwise; launches, CUDA ms, host time).
# Time: ~8 minutes (part 0 to 140 s, the timed arms to 470 s: END0 and END1 move them). At ~45 s an arm the
# d3 rows come last and are skipped by the budget; END1=510 (~8.7 minutes) leaves room for the 2B's.
# Everything lands in $OUT/all.tgz, the grouped op tables and the table also in $OUT/summary.md, printed last.
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-bench/tmp/gpu_out}; WHL=${WHL:-.whl}
R=${R:-/tmp/r5s}; W=${W:-/tmp/sftw}  # results; bench data and the wheels' private folders
mkdir -p "$OUT" $R /tmp/site
left() { local s=$(( $1 - ($(date +%s) - T0) )); echo $(( s > 10 ? s : 10 )); }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $WHL/soundfile*.whl $WHL/cffi*.whl \
    $WHL/pycparser*.whl $WHL/jiwer*.whl $WHL/rapidfuzz*.whl 2>&1 | tail -n 2  # brisk's own needs the image lacks
python3 -m pip install -q --no-index --no-deps --no-compile --target $W/site_fla $WHL/fla_core*.whl $WHL/liger_kernel*.whl \
    2>&1 | tail -n 2  # the bench's own fla folder (sft_bench finds it there): warm-up and arms import the same files
python3 -m pip install -q --no-index --no-deps --no-compile --target $W/site_liger $WHL/liger_kernel*.whl 2>&1 | tail -n 2
# (made here, not by the two warm-up benches at once)
export PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/pycache TORCHINDUCTOR_CACHE_DIR=/tmp/brisk_inductor \
    TRITON_CACHE_DIR=/tmp/triton_cache TOKENIZERS_PARALLELISM=false PYTHONPATH=$PWD:/tmp/site
{ date -u; nvidia-smi -L; git log -1 --format='commit %h %s' 2>/dev/null; python3 -c "import torch, triton, transformers;
print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"; } \
    > $R/machine.txt 2>&1; cat $R/machine.txt
B="python3 bench/sft_bench.py --wheels $WHL --work $W --batch-tokens 8192"
python3 tools/make_chat_data.py ultrachat --out $W/data --n 600 --n-valid 8 --seed 7 > $R/data.log 2>&1

# 0. warm-up (nothing timed runs beside it). Each warm-up bench kills its own worker at its budget + 60 s.
E0=${END0:-140}
PYTHONPATH=$PWD:$W/site_fla:/tmp/site timeout $(left $E0) python3 bench/fla_warm.py 16 > $R/fla_warm.log 2>&1 &
for m in qwen3_5_2b qwen3_1p7b; do
    timeout $(( $(left $E0) + 20 )) $B --models $m --arms d4_brisk_fast_compile --steps 1 --warmup 1 --no-profile \
        --out $R/warm_$m --budget-s $(( $(left $E0) > 90 ? $(left $E0) - 60 : 30 )) > $R/warm_$m.log 2>&1 &
done
( export PYTHONPATH=$PWD:$W/site_fla:/tmp/site
  timeout $(left $E0) python3 -m pytest -o addopts= -v -rs -p no:warnings -p no:cacheprovider \
      tests/gpu/test_llm_step_cuda.py > $R/gpu_tests.log 2>&1
  timeout $(left $E0) python3 -m brisk doctor --kernels configs/sft_qwen3_5_2b.yaml > $R/doctor_2b.md 2>&1 ) &
wait
echo "== part 0 done at $(( $(date +%s) - T0 )) s"; tail -n 2 $R/fla_warm.log; tail -n 4 $R/gpu_tests.log
grep -E '^\| (Gated|liger|varlen)' $R/doctor_2b.md
for m in qwen3_5_2b qwen3_1p7b; do  # the cold compile: the warm-up arm's wall time (one step each side of it)
    python3 - $R/warm_$m/results.jsonl <<'EOF' 2>/dev/null || echo "warm-up $m: no row (see warm_$m.log)"
import json, sys
for r in map(json.loads, open(sys.argv[1])):
    print(f"warm-up {r['model']} {r['arm']}: {r['wall_s']:.0f} s wall (cold compile + 2 steps + start)",
          r.get("error", ""))
EOF
done

# 1. timed arms, one at a time, in this order: a_loop, d_brisk_fast, d4, d3, each on the 2B then the 1.7B (d3 on
# the dense model swaps nothing: it is d again, a second sample of its run-to-run spread). No arm starts after
# END1 - 65 s (the bench kills a worker at its budget + 60 s, before this timeout): such an arm is one row,
# "skipped: out of the time budget"; at ~45 s an arm that is the d3 rows by default.
E1=${END1:-470}
timeout "$(( $(left $E1) + 15 ))" $B --models qwen3_5_2b,qwen3_1p7b \
    --arms a_loop,d_brisk_fast,d4_brisk_fast_compile,d3_brisk_fast_norms --steps 6 --warmup 2 --out $R/timed \
    --budget-s "$(( $(left $E1) > 66 ? $(left $E1) - 65 : 1 ))" > $R/timed.log 2>&1
echo "== timed arms exit $? at $(( $(date +%s) - T0 )) s"; grep '^{' $R/timed.log | cut -c1-300

tar czf "$OUT/all.tgz" -C "$(dirname $R)" "$(basename $R)" 2>/dev/null  # logs, results.jsonl, op tables, tests, doctor, warm-ups
{ cat $R/machine.txt; cat $R/timed/ops_*_groups.md 2>/dev/null
  python3 bench/sft_bench.py --table $R/timed/results.jsonl 2>/dev/null; } > "$OUT/summary.md"
echo "== done in $(( $(date +%s) - T0 )) s"
cat "$OUT/summary.md"
