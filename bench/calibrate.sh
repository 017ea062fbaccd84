#!/usr/bin/env bash
# Probe tolerances from real noise (issue 15, item 4), in one GPU job of ~4-6 minutes on one H200 (each run is
# cut at LIMIT=240 s, so the job stays under 10 minutes; a cut run still calibrates on the steps it recorded):
#
#   ref_flash   eager reference: frozen_eval, padded, speed.sdpa_backends=[flash,efficient,math]
#               (masked calls take the memory-efficient kernel, unmasked ones flash)
#   ref_cudnn   the same with torch's own SDPA choice: masked bf16 calls take cuDNN attention on sm_90
#               (unmasked ones flash). Same math, another attention kernel: the way equivalent runs differ.
#               Not [cudnn] alone: a batch without padding calls SDPA with enable_gqa and no mask, which
#               cuDNN may refuse ("No available kernel"), as the efficient-only run of the first pair did.
#   fast        the fast path (packing, cuda_graph, frozen_eval, bf16 encoder, compile)
#   fast_label  the fast path + speed.label_head
# Each 150 steps of bench/configs/bench_nano.yaml (Fun-ASR-Nano sizes, random weights, AISHELL-1-like stream) with
# probe.enabled=true; the two eager runs side by side, then the two fast runs (timings here mean nothing,
# only the numbers). Then:
#   brisk probe calibrate ref_flash ref_cudnn          -> $OUT/tolerances_calibrated.yaml
#   brisk probe compare ref_flash fast / fast_label    -> against those tolerances (unmet gates stay unmet)
#   brisk probe compare fast fast_label                -> label_head alone, against the same tolerances
# Run from the repo root:  OUT=/some/dir bash bench/calibrate.sh
set -uo pipefail
OUT=${OUT:-bench/tmp}
R=${RUNS:-/tmp/brisk_calibrate}
STEPS=${STEPS:-150}
mkdir -p "$OUT" "$R"
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-.}
P="train.max_steps=$STEPS probe.enabled=true train.progress=false train.log_every=50 train.tensorboard=false
   train.export=none train.save_final=false diagnose.report=false data.num_workers=4"
FAST="speed.packing=true speed.cuda_graph=true speed.frozen_eval=true speed.encoder_dtype=bf16 speed.compile=true"
run() {  # name, then overrides; background job, log in $R/name.log
  name=$1; shift
  timeout "${LIMIT:-240}" python3 -m brisk train bench/configs/bench_nano.yaml $P train.output_dir="$R/$name" "$@" \
    > "$R/$name.log" 2>&1 || echo "== $name exited with $? (see $R/$name.log)"
}
t0=$(date +%s)
run ref_flash speed.frozen_eval=true "speed.sdpa_backends=[flash,efficient,math]" &
run ref_cudnn speed.frozen_eval=true &
wait
echo "eager pair done in $(( $(date +%s) - t0 )) s"
run fast $FAST &
run fast_label $FAST speed.label_head=true &
wait
echo "fast runs done in $(( $(date +%s) - t0 )) s"
for n in ref_flash ref_cudnn fast fast_label; do echo "== $n"; grep -h "speed \|validation\|Error" "$R/$n.log" | tail -n 8; done

T="$OUT/tolerances_calibrated.yaml"
python3 -m brisk probe calibrate "$R/ref_flash" "$R/ref_cudnn" --out "$T"
python3 -m brisk probe compare "$R/ref_flash" "$R/ref_cudnn" --out "$OUT/probe_ref_cudnn_vs_ref_flash_shipped.md"
for b in fast fast_label; do
  python3 -m brisk probe compare "$R/ref_flash" "$R/$b" --tolerances "$T" --out "$OUT/probe_${b}_vs_ref_flash_calibrated.md"
  python3 -m brisk probe compare "$R/ref_flash" "$R/$b" --out "$OUT/probe_${b}_vs_ref_flash_shipped.md"
done
python3 -m brisk probe compare "$R/fast" "$R/fast_label" --tolerances "$T" --out "$OUT/probe_fast_label_vs_fast_calibrated.md"
tar czf "$OUT/calibrate_runs.tgz" -C "$R" --exclude='*.pt' --exclude=checkpoints --exclude=tb .
echo "total $(( $(date +%s) - t0 )) s"
cat "$T"
for f in "$OUT"/probe_*.md; do echo "== $f"; head -n 30 "$f"; done
