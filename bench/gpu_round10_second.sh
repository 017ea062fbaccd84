#!/usr/bin/env bash
# Round 10's second device call (one H200, <= 7 minutes; carry .whl):
#   OUT=$OUT bash bench/gpu_round10_second.sh
# Issue 30's dense row with one host thread: Qwen3 1.7B d5 (compiled layers + optimizer_in_backward; round 7:
# median step 43,518 tokens/s, 176 ms, of which 162.6 ms kernels, 188 ms wall when profiled) is 8% host-bound.
# The seed's loop first (its median step in the same call), then d5 with train.cpu_threads -1 (torch's 16) / 0
# (auto on a GPU: one, the chat configs' setting since round 10) / -1 / 0, one process each, the same batches
# (the seed's loop on the config's 0 as well: sft_bench applies the threads to every arm),
# 8 timed steps after 2 (the first d5 process pays Inductor's cold compile in its warm-up; the cache is shared).
# Prediction: one thread closes part of the 8% host gap, median step +2-6% (2.30-2.38x the loop; 2.5x stays out
# of reach: the kernels alone are 162.6 ms against the 157 ms that 2.5x needs).
set -uo pipefail
shopt -s nullglob
T0=$(date +%s)
OUT=${OUT:-bench/tmp/gpu_out}; WHL=${WHL:-.whl}
R=/tmp/r10_second; W=/tmp/sftw
mkdir -p "$OUT" $R /tmp/site
left() { local s=$(( $1 - ($(date +%s) - T0) )); echo $(( s > 10 ? s : 10 )); }
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site $WHL/soundfile*.whl \
    $WHL/cffi*.whl $WHL/pycparser*.whl $WHL/jiwer*.whl $WHL/rapidfuzz*.whl $WHL/liger_kernel*.whl 2>&1 | tail -n 2
export PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/pycache TORCHINDUCTOR_CACHE_DIR=/tmp/brisk_inductor \
    TRITON_CACHE_DIR=/tmp/triton_cache TOKENIZERS_PARALLELISM=false PYTHONPATH=$PWD:/tmp/site
{ date -u; nvidia-smi -L; nproc; } > $R/machine.txt 2>&1
python3 tools/make_chat_data.py ultrachat --out $W/data --n 600 --n-valid 8 --seed 7 > $R/data.log 2>&1
B="python3 bench/sft_bench.py --wheels $WHL --work $W --no-profile --no-fla --models qwen3_1p7b --batch-tokens 8192 --steps 8 --warmup 2"
timeout 90 $B --arms a_loop --out $R/t0_loop --budget-s 60 > $R/t0_loop.log 2>&1
echo "== seed loop exit $? at $(( $(date +%s) - T0 )) s"
i=0
for th in -1 0 -1 0; do
    i=$(( i + 1 )); end=$(( i == 1 ? 230 : 230 + 55 * (i - 1) ))
    timeout "$(( $(left $end) + 10 ))" $B --arms d5_brisk_fast_compile_oib --set train.cpu_threads=$th \
        --out $R/t${i}_$th --budget-s 30 > $R/t${i}_$th.log 2>&1
    echo "== 1.7B d5 threads $th ($i) exit $? at $(( $(date +%s) - T0 )) s"
done
tar czf "$OUT/all.tgz" -C /tmp r10_second 2>/dev/null
{ cat $R/machine.txt; python3 bench/sft_bench.py --table $R/t*/results.jsonl 2>&1
  for f in $R/t*/results.jsonl; do python3 -c "import json, statistics, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(sys.argv[1].split('/')[-2], r.get('arm'), 'threads', r.get('torch_threads'), 'median',
          round(statistics.median(r.get('tps_steps') or [0])))" "$f"; done; } > "$OUT/summary.md"
echo "== done in $(( $(date +%s) - T0 )) s"; cat "$OUT/summary.md"
