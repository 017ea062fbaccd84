#!/usr/bin/env bash
# Issue 34 (helper i34d), one device call on one H200, <= 4 minutes. From the repo root, with the wheels in .whl/
# (soundfile, cffi, pycparser, jiwer, rapidfuzz, funasr, kaldiio, omegaconf, librosa, lazy_loader, soxr) and
# bench/tmp/wholerun_data (tools/make_wholerun_data.py) carried:
#   OUT=$OUT bash bench/gpu_round6_i34.sh
# 1. GPU tests (<= 85 s): several decode steps a graph replay (--fast-multi-step) against one a replay, bf16, eager
#    and compiled step, bit for bit and in fewer replays; the Recognizer's fast paths against plain (fp32);
# 2. bench/decode_bench.py (the rest, >= 120 s): the fastest path (compiled step, length buckets, encoder bf16) at
#    1, 16 and 64, then the same with several tokens a replay (_multi; its ids against the first arm's: 0 must
#    differ); the replays a generate, Python's GC time inside a batch, and a cProfile of one whole batch of each
#    (host_<arm>_b<batch>.txt: what the host does in "rest of the batch"), and torch.profiler's kernels of one
#    generate of 17 tokens and of the prefill alone (how many, the GPU's busy share of their span, device ms by
#    kernel class: where the 1.5 ms a step and the prefill go).
# Everything lands in $OUT/all.tgz; the table is printed last.
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-bench/tmp/gpu_out}; WHL=${WHL:-.whl}
mkdir -p "$OUT" /tmp/site /tmp/r
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $WHL/soundfile*.whl $WHL/cffi*.whl \
    $WHL/pycparser*.whl $WHL/jiwer*.whl $WHL/rapidfuzz*.whl $WHL/funasr*.whl $WHL/kaldiio*.whl $WHL/omegaconf*.whl \
    $WHL/librosa*.whl $WHL/lazy_loader*.whl $WHL/soxr*.whl 2>&1 | tail -n 2
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/pycache TORCHINDUCTOR_CACHE_DIR=/tmp/brisk_inductor
{ date -u; nvidia-smi -L; echo "cores $(nproc)"; python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers',
transformers.__version__)"; } > /tmp/r/machine.txt 2>&1

PT="python3 -m pytest -o addopts= -q -rs -s -p no:warnings -p no:cacheprovider --timeout 80"
timeout 85 $PT tests/gpu/test_fast_decode_gpu.py -k "multi_step or recognizer_fast" > /tmp/r/gpu_tests_decode.log 2>&1
echo "== GPU tests done at $(( $(date +%s) - T0 )) s"

left=$(( 236 - ($(date +%s) - T0) )); [ $left -lt 90 ] && left=90
timeout "$left" python3 bench/decode_bench.py --out /tmp/r/decode \
    --arms fast_compile_buckets_enc16,fast_compile_buckets_multi_enc16 --batches 1,16,64 --repeats 2 \
    --host-profile --kernel-profile --budget "$(( left - 20 ))" > /tmp/r/decode.log 2>&1
echo "decode_bench exit $?"

tar czf "$OUT/all.tgz" -C /tmp r
cat /tmp/r/machine.txt
echo "== GPU tests"; grep -E "passed|failed|error" /tmp/r/gpu_tests_decode.log | tail -n 8
echo "== host profile of one batch of 16 (by own time)"; sed -n 1,22p /tmp/r/decode/host_fast_compile_buckets_enc16_b16.txt 2>/dev/null | cut -c1-150
echo "== decode"; cat /tmp/r/decode/decode_bench.md 2>/dev/null || tail -n 5 /tmp/r/decode.log
echo "call took $(( $(date +%s) - T0 )) s"
