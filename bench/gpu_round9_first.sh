#!/usr/bin/env bash
# Round 9's first device call (one H200, <= 9.5 minutes; carry .whl and bench/tmp/wholerun_data):
#   OUT=$OUT bash bench/gpu_round9_first.sh
# What round 8 left (bench/results/2026-12-02-h200-round8/README.md):
# 1. Batch-64 decoding against the host's speed (first, ~210 s): the same arm in three fresh processes with
#    torch's CPU threads at the default (one a core), 4 and 1; each row carries its CPU-fbank canary (round 8: 48
#    ms in the 170-utts/s process, 1,637 ms in the 70-utts/s one). Prediction: with 1 thread the rest of the
#    batch stays under 20 ms even in a slow-host process, and utts/s within 10% of the fast-host figure. Each
#    process also profiles one whole batch (cProfile, host_*.txt): round 8 has the fast host's only.
# 2. (the rest of the call) tests/gpu/test_llm_kernels_cuda.py's two round-8 failures alone (fla's first
#    compiles for the fp32 shapes took 131 s on a fast host): the packed reference now in plain fp32 torch
#    (transformers' own forward had called fla's kernel, cuDNN had run the conv in TF32); the syncs test names
#    each sync's call site.
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-bench/tmp/gpu_out}; WHL=${WHL:-.whl}
R=/tmp/r9; mkdir -p "$OUT" $R /tmp/site
left() { local s=$(( $1 - ($(date +%s) - T0) )); echo $(( s > 10 ? s : 10 )); }
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site $WHL/soundfile*.whl \
    $WHL/cffi*.whl $WHL/pycparser*.whl $WHL/jiwer*.whl $WHL/rapidfuzz*.whl $WHL/fla_core*.whl \
    $WHL/liger_kernel*.whl 2>&1 | tail -n 2
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/pycache \
    TORCHINDUCTOR_CACHE_DIR=/tmp/brisk_inductor TRITON_CACHE_DIR=/tmp/triton_cache TOKENIZERS_PARALLELISM=false
{ date -u; nvidia-smi -L; git log -1 --format='commit %h %s' 2>/dev/null; nproc; cat /sys/fs/cgroup/cpu.max 2>/dev/null
  grep -E "^(cpu |procs_running)" /proc/stat; } > $R/machine.txt 2>&1
i=0
for th in 0 4 1; do  # one fresh process each, ~60 s (folder build, compile warm-up, 3 passes, stage profile)
    i=$(( i + 1 ))
    timeout "$(left $(( 30 + 60 * i )))" python3 bench/decode_bench.py --out $R/decode_t$th --threads $th \
        --arms fast_compile_buckets_multi_enc16 --batches 64 --repeats 1 --passes 3 --host-profile --budget 60 \
        > $R/decode_t$th.log 2>&1
    echo "== decode threads=$th exit $? at $(( $(date +%s) - T0 )) s"
done
timeout "$(left 580)" python3 -m pytest -o addopts= -v -rA --tb=short -p no:warnings -p no:cacheprovider \
    tests/gpu/test_llm_kernels_cuda.py -k "packed or syncs" > $R/gpu_tests.log 2>&1
echo "== tests exit $? at $(( $(date +%s) - T0 )) s"
# Could a later call of the same session, on a fresh machine, carry these compile caches back instead of paying
# fla's and Inductor's first compiles again (131-186 s)? Their size says (files come back at 16 MiB each, a
# carry holds 64 MiB with the tree; a new session's checkout starts without them either way).
du -sh /tmp/triton_cache /tmp/brisk_inductor /tmp/brisk_decode_bench/inductor >> $R/machine.txt 2>&1
tar czf "$OUT/all.tgz" -C /tmp r9 2>/dev/null
{ cat $R/machine.txt; grep -E "^E |PASSED|FAILED|passed|failed" $R/gpu_tests.log | cut -c1-1500 | tail -n 20
  for f in $R/decode_t*/decode_bench.md; do echo "$f"; grep -E "^\| brisk" "$f" | cut -c1-300; done
  for f in $R/decode_t*/host_*.txt; do echo "$f"; sed -n 1,22p "$f"; done
} > "$OUT/summary.md"
echo "== done in $(( $(date +%s) - T0 )) s"; cat "$OUT/summary.md"
