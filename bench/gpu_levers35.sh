#!/usr/bin/env bash
# Issue 35's levers in one device call (<= 8 minutes; one H200). From the repo root on the GPU machine, with the
# wheels in .whl/ and, for FunASR's workload, bench/tmp/wholerun_data from
# `python tools/make_wholerun_data.py --out bench/tmp/wholerun_data` (carried; without it the bench runs on the
# AISHELL-1-like stream):
#   OUT=$OUT bash bench/gpu_levers35.sh
# 1. GPU tests of the two levers (side-stream updates == fused AdamW on the same gradients; graphed step with
#    them; liger on the speech decoder against the eager modules);
# 2. configs/bench_levers35.yaml: preset, + optimizer_in_backward, + liger (same batches, interleaved);
# 3. probes, 120 real-size steps each, kernel_noise tolerances: the eager reference against the preset +
#    optimizer_in_backward without clipping (the switch alone), then with FunASR's clipping (by the previous norm
#    against the step's own), then the preset alone while time is left.
# Logs and tables under $OUT; the last lines printed are the bench table and the probe verdicts.
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-bench/tmp/gpu_out}
mkdir -p "$OUT" /tmp/k
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/soundfile*.whl .whl/cffi*.whl .whl/pycparser*.whl .whl/jiwer*.whl .whl/rapidfuzz*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/k .whl/liger_kernel*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD:/tmp/k PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/pycache
unset PYTHONDONTWRITEBYTECODE
export TORCHINDUCTOR_CACHE_DIR=/tmp/brisk_inductor
left() { local s=$(( $1 - ($(date +%s) - T0) )); echo $(( s > 10 ? s : 10 )); }
{ date -u; nvidia-smi -L; python3 -c "import torch, transformers, triton; print('torch', torch.__version__,
'transformers', transformers.__version__, 'triton', triton.__version__)"; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

# 1. GPU tests
timeout 100 python3 -m pytest -o addopts="" -q -rs -p no:warnings --timeout 90 \
    tests/gpu/test_optim_in_backward_cuda.py tests/gpu/test_speech_liger_cuda.py 2>&1 | tee "$OUT/gpu_tests.log" | tail -n 6

# 2. the bench: FunASR's workload when its data is here, else the AISHELL-1-like stream
if [ -f bench/tmp/wholerun_data/train.jsonl ]; then
    timeout 100 python3 tools/make_nano_folder.py --out /tmp/nano > "$OUT/make_nano.log" 2>&1 || tail -n 3 "$OUT/make_nano.log"
    W="model.path=/tmp/nano data.train=bench/tmp/wholerun_data/train.jsonl"; echo "workload: FunASR's prompt (bench_prompt)"
else
    W="data.profile=brisk/bench/profiles/aishell1_like.jsonl data.train=null"; echo "workload: AISHELL-1-like stream (no wholerun data)"
fi
echo "$W" > "$OUT/workload.txt"
timeout "$(left 330)" python3 -m brisk bench configs/bench_levers35.yaml $W --out /tmp/levers35 \
    > "$OUT/bench_levers35.log" 2>&1 || echo "bench exited with $?"
cp /tmp/levers35/bench.md "$OUT/bench_levers35.md" 2>/dev/null; cp /tmp/levers35/bench.json "$OUT/" 2>/dev/null

# 3. probes against the eager reference (as gpu_round3.sh's probe_preset). First without clipping (the switch
# alone: it should keep the numbers to kernel noise), then with FunASR's optim.grad_clip=5.0 (the switch clips by
# the previous step's norm; the reference by the step's own), then the preset alone if time is left (round 3c:
# 1,349 of 1,350 gates).
R=/tmp/probe_runs; mkdir -p $R
P="configs/fun_asr_nano.yaml data.profile=brisk/bench/profiles/aishell1_like.jsonl train.max_steps=120
   train.device=cuda probe.enabled=true train.progress=false train.log_every=40 train.tensorboard=false
   train.export=none train.save_final=false data.num_workers=4 train.overwrite=true"
REF="speed.frozen_eval=true speed.sdpa_backends=[flash,efficient,math]"
OIB="speed.preset=fast speed.optimizer_in_backward=true"
for arm in eager_ref_noclip preset_oib_noclip eager_ref preset_oib preset; do
    [ $(( 570 - ($(date +%s) - T0) )) -lt 45 ] && { echo "$arm: no time left"; continue; }
    case $arm in
        eager_ref_noclip) S="$REF optim.grad_clip=0";;
        preset_oib_noclip) S="$OIB optim.grad_clip=0";;
        eager_ref) S="$REF";;
        preset_oib) S="$OIB speed.clip_by_previous_norm=true";;
        preset) S="speed.preset=fast";;
    esac
    timeout "$(left 570)" python3 -m brisk train $P train.output_dir=$R/$arm $S > $R/$arm.log 2>&1 || echo "$arm exited with $?"
    grep -h "acceleration:\|optimizer_in_backward:" $R/$arm.log | head -2 | cut -c1-300
done
PAIRS="eager_ref_noclip:preset_oib_noclip eager_ref:preset_oib eager_ref:preset preset:preset_oib"
for pair in $PAIRS; do a=${pair%:*}; b=${pair#*:}
    [ -f $R/$a/probe.rank0.jsonl ] && [ -f $R/$b/probe.rank0.jsonl ] || continue
    python3 -m brisk probe compare $R/$a $R/$b --tolerances kernel_noise --out "$OUT/probe_${b}_vs_$a.md" \
        > "$OUT/probe_${b}_vs_$a.txt" 2>&1; echo "probe $b vs $a: exit $?"; done
tar czf "$OUT/probe_runs.tgz" -C /tmp --exclude='*.pt' --exclude=checkpoints --exclude=tb probe_runs 2>/dev/null

echo "== elapsed $(( $(date +%s) - T0 )) s"
echo "== bench ($(cat "$OUT/workload.txt"))"; grep "^|" /tmp/levers35/bench.md 2>/dev/null | head -8
for pair in $PAIRS; do a=${pair%:*}; b=${pair#*:}
    [ -f "$OUT/probe_${b}_vs_$a.md" ] && { echo "== probe $b vs $a"; head -n 1 "$OUT/probe_${b}_vs_$a.md"; }; done
