#!/usr/bin/env bash
# Issue 35, item 3: speed.flex_attention with the FlexAttention call compiled on its own, static per row length
# (brisk/speed/flex.py static_flex), in one short device call. From the repo root on the GPU machine, with the
# wheels in .whl/ and bench/tmp/wholerun_data (carried):
#   OUT=$OUT bash bench/gpu_round12_flex.sh
# 1. configs/bench_flex35.yaml on FunASR's workload (the preset against the preset + flex_attention, interleaved),
#    with pack_buckets cut to the lengths that workload's rows reach (both arms alike: every step lands in the same
#    bucket either way; fewer cold compiles);
# 2. tests/gpu/test_flex_attention_cuda.py.
# Prediction (round 11, attention35 --flex-only: 0.301 -> 0.129 ms a layer against varlen's 0.203, 28 layers):
# the preset + flex median ~27.4 ms against the preset's ~29.5.
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-bench/tmp/gpu_out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/soundfile*.whl .whl/cffi*.whl .whl/pycparser*.whl .whl/jiwer*.whl .whl/rapidfuzz*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/pycache
unset PYTHONDONTWRITEBYTECODE
export TORCHINDUCTOR_CACHE_DIR=/tmp/brisk_inductor
left() { local s=$(( $1 - ($(date +%s) - T0) )); echo $(( s > 10 ? s : 10 )); }
{ date -u; nvidia-smi -L; python3 -c "import torch, transformers, triton; print('torch', torch.__version__,
'transformers', transformers.__version__, 'triton', triton.__version__)"; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
timeout 120 python3 tools/make_nano_folder.py --out /tmp/nano > "$OUT/make_nano.log" 2>&1 || echo "make_nano exited with $?"

# 1. the bench on FunASR's workload
W="model.path=/tmp/nano data.train=bench/tmp/wholerun_data/train.jsonl speed.pack_buckets=[1280,1536,1792,2048,2304,2560]"
timeout "$(left ${BENCH_END:-140})" python3 -m brisk bench configs/bench_flex35.yaml $W --out /tmp/flex35 \
    > "$OUT/bench_flex35.log" 2>&1 || echo "bench exited with $? (the table holds the runs that finished)"
cp /tmp/flex35/bench.md "$OUT/bench_flex35.md" 2>/dev/null; cp /tmp/flex35/bench.json "$OUT/" 2>/dev/null
grep -h "bench: .* run [0-9]*: mean\|eager\|recompile" "$OUT/bench_flex35.log" | sed 's/.*bench: /  /' | head -20
echo "== bench done at $(( $(date +%s) - T0 )) s"

# 2. the GPU tests
timeout "$(left ${TESTS_END:-230})" python3 -m pytest -o addopts="" -q -rs -p no:warnings \
    tests/gpu/test_flex_attention_cuda.py > "$OUT/gpu_tests.log" 2>&1; echo "tests exit $?"
tail -n 8 "$OUT/gpu_tests.log"
echo "== elapsed $(( $(date +%s) - T0 )) s"
echo "== bench"; cat /tmp/flex35/bench.md 2>/dev/null
