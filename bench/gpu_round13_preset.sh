#!/usr/bin/env bash
# Issue 35, round 13's last call: the preset with static decoder layers (speed.preset=fast
# speed.compile_dynamic=false; flags.run_scope raises Dynamo's recompile limit to its 15 buckets + 8; the call ran
# with compile_dynamic=false written into fun_asr_nano's preset, taken out after it) checked the way users run it:
# a 120-step probe against the eager reference (AISHELL-1-like batches, FunASR's clipping;
# `brisk train`, so Dynamo's limit is the run's own, not the bench's 64), then the whole run with the preset
# (bench/whole_run.py: 4 epochs, validation and checkpoints, export; cold Inductor cache, then warm).
#   OUT=$OUT bash bench/gpu_round13_preset.sh     (carry .whl and bench/tmp/wholerun_data)
# Prediction: the probe meets the preset's 1,349 of 1,350 gates; the warm whole run within 2 s of round 3's 40.3 s
# (the step is 1.4 ms shorter, x ~360 steps = -0.5 s; a static compile per bucket used, ~2-4 buckets, warm).
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-bench/tmp/gpu_out}
mkdir -p "$OUT" /tmp/keep
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/soundfile*.whl .whl/cffi*.whl .whl/pycparser*.whl .whl/jiwer*.whl .whl/rapidfuzz*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/pycache
unset PYTHONDONTWRITEBYTECODE
export TORCHINDUCTOR_CACHE_DIR=/tmp/brisk_inductor
left() { local s=$(( $1 - ($(date +%s) - T0) )); echo $(( s > 10 ? s : 10 )); }
{ date -u; nvidia-smi -L; python3 -c "import torch, transformers, triton; print('torch', torch.__version__,
'transformers', transformers.__version__, 'triton', triton.__version__)"; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

timeout 120 python3 tools/make_nano_folder.py --out /tmp/nano > /tmp/keep/make_nano.log 2>&1 &
R=/tmp/probe_runs; mkdir -p $R
P="configs/fun_asr_nano.yaml data.profile=brisk/bench/profiles/aishell1_like.jsonl train.max_steps=120
   train.device=cuda probe.enabled=true train.progress=false train.log_every=40 train.tensorboard=false
   train.export=none train.save_final=false data.num_workers=2 train.overwrite=true"
for arm in eager_ref preset; do
    case $arm in
        eager_ref) S="speed.frozen_eval=true speed.sdpa_backends=[flash,efficient,math]";;
        preset) S="speed.preset=fast speed.compile_dynamic=false";;
    esac
    (timeout 220 python3 -m brisk train $P train.output_dir=$R/$arm $S > $R/$arm.log 2>&1 || echo "probe run $arm exited with $?") &
done
wait
echo "== probes done at $(( $(date +%s) - T0 )) s"
grep -h "compile:\|eager\b.*layer\|recompile" $R/preset.log | head -4 | cut -c1-300
python3 -m brisk probe compare $R/eager_ref $R/preset --tolerances kernel_noise --out "$OUT/probe_preset_vs_eager_ref.md" \
    > /tmp/keep/probe.txt 2>&1; echo "probe preset vs eager_ref: exit $?"
cp $R/*.log /tmp/keep/ 2>/dev/null

timeout "$(left ${WR_END:-585})" python3 bench/whole_run.py --speed preset --model /tmp/nano --data bench/tmp/wholerun_data \
    --out /tmp/wr --work /tmp/wr_work --timeout 150 speed.compile_dynamic=false > /tmp/keep/whole_run.log 2>&1 || echo "whole_run exited with $?"
cp /tmp/wr/whole_run.md /tmp/wr/whole_run.json "$OUT/" 2>/dev/null; cp /tmp/wr/whole_run_logs.tgz /tmp/keep/ 2>/dev/null
tar czf "$OUT/keep.tgz" -C /tmp keep 2>/dev/null
echo "== elapsed $(( $(date +%s) - T0 )) s"
head -n 1 "$OUT/probe_preset_vs_eager_ref.md"; grep "unmet" "$OUT/probe_preset_vs_eager_ref.md" | head -n 4
tail -n 20 /tmp/wr/whole_run.md 2>/dev/null || tail -n 8 /tmp/keep/whole_run.log
