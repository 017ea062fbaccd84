#!/usr/bin/env bash
# Probe records on the GPU (300 steps of Fun-ASR-Nano at real sizes, random weights, AISHELL-1-like stream):
#   defaults        torch's eager defaults (the FunASR recipe as it runs today)
#   sdpa_compile    speed.sdpa_backends=[flash,efficient,math] + speed.compile (the FunASR PR's setting)
#   eager_ref       the fast path's eager reference: frozen_eval, flash/efficient SDPA, fp32 encoder
#   eager_ref_eff   the same with only the memory-efficient SDPA kernel (an equivalent attention kernel)
#   fast            packing + cuda_graph + frozen_eval + bf16 encoder + compile
# then: calibrate tolerances from (eager_ref, eager_ref_eff), and compare sdpa_compile vs defaults and
# fast vs eager_ref with the shipped and the calibrated tolerances.
set -uo pipefail
OUT=${OUT:-bench/tmp}
R=${RUNS:-/tmp/brisk_probe}
mkdir -p "$OUT" "$R"
export PYTHONUNBUFFERED=1
P="data.profile=brisk/bench/profiles/aishell1_like.jsonl train.max_steps=${STEPS:-300} train.device=cuda probe.enabled=true
   train.progress=false train.log_every=50 train.tensorboard=false train.export=none train.save_final=false
   data.num_workers=4 speed.inductor_cache_dir=/tmp/brisk_inductor train.overwrite=true"
FAST="speed.packing=true speed.cuda_graph=true speed.frozen_eval=true speed.encoder_dtype=bf16 speed.compile=true"
run() { name=$1; shift; echo "== $name"; timeout "${LIMIT:-200}" python3 -m brisk train configs/fun_asr_nano.yaml $P train.output_dir=$R/$name "$@" > "$R/$name.log" 2>&1 || echo "   $name exited with $?"; tail -n 3 "$R/$name.log"; }
run fast $FAST
run eager_ref speed.frozen_eval=true "speed.sdpa_backends=[flash,efficient,math]"
run eager_ref_eff speed.frozen_eval=true "speed.sdpa_backends=[efficient]"
TORCH_LOGS=recompiles run sdpa_compile "speed.sdpa_backends=[flash,efficient,math]" speed.compile=true
LIMIT=260 run defaults
python3 -m brisk probe calibrate $R/eager_ref $R/eager_ref_eff --out "$OUT/tolerances_calibrated.yaml"
for pair in "defaults sdpa_compile" "eager_ref fast"; do
  set -- $pair
  python3 -m brisk probe compare $R/$1 $R/$2 --out "$OUT/probe_$2_vs_$1.md"
  python3 -m brisk probe compare $R/$1 $R/$2 --tolerances "$OUT/tolerances_calibrated.yaml" --out "$OUT/probe_$2_vs_$1_calibrated.md"
done
grep -h "Recompiling\|triggered by" $R/sdpa_compile.log | head -20 > "$OUT/recompiles.txt"
tar czf "$OUT/runs.tgz" -C "$R" --exclude='*.pt' --exclude=checkpoints --exclude=tb .
ls -la "$OUT"
