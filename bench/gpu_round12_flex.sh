#!/usr/bin/env bash
# Issue 35, item 3: speed.flex_attention with the FlexAttention call compiled on its own, static per row length
# (brisk/speed/flex.py static_flex), in one device call (<= 10 minutes; one H200; round 11's call of the same
# shape took 203 s). From the repo root on the GPU machine, with the wheels in .whl/ and bench/tmp/wholerun_data
# (carried):
#   OUT=$OUT bash bench/gpu_round12_flex.sh
# 1. (side by side, none of it timed) tests/gpu/test_flex_attention_cuda.py, the real-size nano folder, and three
#    probe runs of 120 steps (AISHELL-1-like batches, FunASR's clipping): the eager reference, the preset, the
#    preset + flex_attention; then the kernel_noise comparisons of both against the reference;
# 2. configs/bench_flex35.yaml on FunASR's workload: the preset against the preset + flex_attention, interleaved,
#    with pack_buckets cut to the lengths that workload's rows reach (both arms alike: each step lands in the same
#    bucket either way; fewer cold compiles of the static call).
# 3. brisk profile of the preset + flex_attention on the same workload (the step's new split), if time is left.
# Prediction (round 11, attention35 --flex-only: the call 0.301 -> 0.129 ms a layer, varlen 0.203, 28 layers):
# the preset + flex median ~27.4 ms against the preset's ~29.5; the probe meets the preset's own gates.
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

# 1. tests, the nano folder and the probes, side by side (correctness only)
timeout 300 python3 -m pytest -o addopts="" -q -rs -p no:warnings --timeout 290 \
    tests/gpu/test_flex_attention_cuda.py > "$OUT/gpu_tests.log" 2>&1 &
WD=bench/tmp/wholerun_data
timeout 120 python3 tools/make_nano_folder.py --out /tmp/nano > "$OUT/make_nano.log" 2>&1 &
R=/tmp/probe_runs; mkdir -p $R
P="configs/fun_asr_nano.yaml data.profile=brisk/bench/profiles/aishell1_like.jsonl train.max_steps=120
   train.device=cuda probe.enabled=true train.progress=false train.log_every=40 train.tensorboard=false
   train.export=none train.save_final=false data.num_workers=2 train.overwrite=true"
ARMS="eager_ref preset preset_flex"
for arm in $ARMS; do
    case $arm in
        eager_ref) S="speed.frozen_eval=true speed.sdpa_backends=[flash,efficient,math]";;
        preset) S="speed.preset=fast";;
        preset_flex) S="speed.preset=fast speed.flex_attention=true";;
    esac
    (timeout 300 python3 -m brisk train $P train.output_dir=$R/$arm $S > $R/$arm.log 2>&1 || echo "probe run $arm exited with $?") &
done
wait
echo "== part 1 done at $(( $(date +%s) - T0 )) s"; tail -n 6 "$OUT/gpu_tests.log"
for arm in $ARMS; do grep -h "acceleration:\|flex_attention:" $R/$arm.log | head -2 | cut -c1-300; done
PAIRS="eager_ref:preset eager_ref:preset_flex preset:preset_flex"
for pair in $PAIRS; do a=${pair%:*}; b=${pair#*:}
    [ -f $R/$a/probe.rank0.jsonl ] && [ -f $R/$b/probe.rank0.jsonl ] || { echo "probe $b vs $a: a run is missing"; continue; }
    python3 -m brisk probe compare $R/$a $R/$b --tolerances kernel_noise --out "$OUT/probe_${b}_vs_$a.md" \
        > "$OUT/probe_${b}_vs_$a.txt" 2>&1; echo "probe $b vs $a: exit $?"; done
tar czf "$OUT/probe_runs.tgz" -C /tmp --exclude='*.pt' --exclude=checkpoints --exclude=tb probe_runs 2>/dev/null

# 2. the bench on FunASR's workload
W="model.path=/tmp/nano data.train=$WD/train.jsonl speed.pack_buckets=[1280,1536,1792,2048,2304,2560]"
timeout "$(left ${BENCH_END:-480})" python3 -m brisk bench configs/bench_flex35.yaml $W --out /tmp/flex35 \
    > "$OUT/bench_flex35.log" 2>&1 || echo "bench exited with $? (the table holds the runs that finished)"
cp /tmp/flex35/bench.md "$OUT/bench_flex35.md" 2>/dev/null; cp /tmp/flex35/bench.json "$OUT/" 2>/dev/null
grep -h "bench: .* run [0-9]*: mean" "$OUT/bench_flex35.log" | sed 's/.*bench: /  /'

# 3. the step's split with the switch (kernel classes: GEMMs, attention, optimizer, Inductor, other), if time is left
timeout "$(left ${PROFILE_END:-590})" python3 -m brisk profile configs/bench_prompt.yaml $W speed.preset=fast \
    speed.flex_attention=true --out /tmp/profile_flex > "$OUT/profile_flex.log" 2>&1 || echo "profile exited with $?"
tar czf "$OUT/profile_flex.tgz" -C /tmp --exclude='*.json.gz' --exclude='*trace*' profile_flex 2>/dev/null

echo "== elapsed $(( $(date +%s) - T0 )) s"
for pair in $PAIRS; do a=${pair%:*}; b=${pair#*:}
    [ -f "$OUT/probe_${b}_vs_$a.md" ] && { echo "== probe $b vs $a"; head -n 1 "$OUT/probe_${b}_vs_$a.md";
        grep "unmet" "$OUT/probe_${b}_vs_$a.md" | head -n 4; }; done
echo "== bench"; cat /tmp/flex35/bench.md 2>/dev/null
