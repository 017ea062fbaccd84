#!/usr/bin/env bash
# Issue 31's last check, for the first device call of the next session (one H200, <= 6 minutes). Round 5 changed
# the graphed step (brisk/speed/graph.py: the family's audio_graphs / audio_static_inputs, the eager fallback's
# audio rows) after the last GPU run of Fun-ASR-Nano's graphed path. From the repo root, soundfile/cffi/pycparser/jiwer/rapidfuzz
# wheels in .whl/:
#   OUT=$OUT bash bench/gpu_round6_first.sh
# 1. tests/gpu/test_gpu_state.py: Fun-ASR-Nano's graphed step against the eager one, resume of a graphed run, tf32
#    scope, val decode on the packed path (13 passed in round 5's call 1, before the change);
# 2. the probe of the speech preset as shipped against its eager reference (120 real-size steps, the
#    AISHELL-1-like stream, kernel_noise tolerances), as round 3c ran it: round 3c met 1,349 of 1,350 gates (the
#    unmet one param_norm at 3.5e-6 against 1e-9 relative) and round 4b's preset + optimizer_in_backward the same.
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-bench/tmp/gpu_out}; WHL=${WHL:-.whl}
mkdir -p "$OUT" /tmp/site
left() { local s=$(( $1 - ($(date +%s) - T0) )); echo $(( s > 10 ? s : 10 )); }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $WHL/soundfile*.whl $WHL/cffi*.whl \
    $WHL/pycparser*.whl $WHL/jiwer*.whl $WHL/rapidfuzz*.whl 2>&1 | tail -n 2
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/pycache TORCHINDUCTOR_CACHE_DIR=/tmp/brisk_inductor
{ date -u; nvidia-smi -L; python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers',
transformers.__version__)"; } > "$OUT/machine.txt" 2>&1
timeout 150 python3 -m pytest -o addopts= -q -rs -p no:warnings -p no:cacheprovider --timeout 140 \
    tests/gpu/test_gpu_state.py > "$OUT/gpu_tests_state.log" 2>&1
echo "== tests done at $(( $(date +%s) - T0 )) s"; tail -n 3 "$OUT/gpu_tests_state.log"

R=/tmp/probe_runs; mkdir -p $R
P="configs/fun_asr_nano.yaml data.profile=brisk/bench/profiles/aishell1_like.jsonl train.max_steps=120
   train.device=cuda probe.enabled=true train.progress=false train.log_every=40 train.tensorboard=false
   train.export=none train.save_final=false data.num_workers=4 train.overwrite=true"
timeout "$(left 220)" python3 -m brisk train $P train.output_dir=$R/eager_ref speed.frozen_eval=true \
    "speed.sdpa_backends=[flash,efficient,math]" > $R/eager_ref.log 2>&1 || echo "eager_ref exited with $?"
timeout "$(left 340)" python3 -m brisk train $P train.output_dir=$R/preset speed.preset=fast > $R/preset.log 2>&1 \
    || echo "preset exited with $?"
python3 -m brisk probe compare $R/eager_ref $R/preset --tolerances kernel_noise --out "$OUT/probe_preset_vs_eager_ref.md" \
    > /tmp/cmp.txt 2>&1; echo "== probe preset vs eager_ref: exit $?"; head -n 1 /tmp/cmp.txt
cp $R/eager_ref.log $R/preset.log "$OUT/" 2>/dev/null
echo "call took $(( $(date +%s) - T0 )) s"
