#!/usr/bin/env bash
# Written in round 10, not run yet (one H200, ~3 minutes; no wheels needed):
#   OUT=$OUT bash bench/gpu_round11_first.sh
# Issue 35, item 3: bench/attention35.py with its CUDA-graph replay column, which is what the graphed preset pays
# (round 10 had only eager and summed-kernel times: FlexAttention on the packed row 0.109 against varlen's
# 0.198 ms a layer of kernels). Prediction: on replay FlexAttention (mask built once) still beats varlen by
# ~0.08 ms a layer; the arm that builds its block mask inside the call either captures or names its host sync,
# which decides whether a FlexAttention path can build each batch's mask inside the captured step.
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-bench/tmp/gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD TORCHINDUCTOR_CACHE_DIR=/tmp/brisk_inductor
{ date -u; nvidia-smi -L; python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } \
    > "$OUT/machine.txt" 2>&1
timeout 240 python3 bench/attention35.py --out "$OUT/attn35" > "$OUT/attn35.log" 2>&1
echo "== attention35 exit $? in $(( $(date +%s) - T0 )) s"
cat "$OUT/machine.txt"; grep "^|" "$OUT/attn35/attention35.md" 2>/dev/null || tail -n 20 "$OUT/attn35.log"
