#!/usr/bin/env bash
# Issue 35's levers in one device call (<= 9 minutes; one H200). From the repo root on the GPU machine, with the
# wheels in .whl/ and, for FunASR's workload, bench/tmp/wholerun_data from
# `python tools/make_wholerun_data.py --out bench/tmp/wholerun_data` (carried, ~9 MB; without it the bench runs
# on the AISHELL-1-like stream):
#   OUT=$OUT bash bench/gpu_levers35.sh
# 1. (at once, none of it timed) the GPU tests of the two levers (side-stream updates == fused AdamW on the same
#    gradients; graphed step with them; liger on the speech decoder against the eager modules), the real-size
#    nano folder, and four probe runs of 120 steps (AISHELL-1-like batches): the eager reference and the preset +
#    optimizer_in_backward, without clipping (the switch alone) and with FunASR's optim.grad_clip=5 (the switch
#    clipping by the previous step's norm, the reference by the step's own); then the kernel_noise comparisons;
# 2. bench/attention35.py: the attention kernels at the step's size (varlen against SDPA flash / efficient / cuDNN);
# 3. configs/bench_levers35.yaml on FunASR's workload: preset, + optimizer_in_backward, batch_tokens 12,000 and
#    24,000 (tokens/s; interleaved, 2 runs while time is left: the table is rewritten after every run).
# Logs and tables under $OUT; printed last: the probe verdicts, the attention table, the bench table.
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

# 1. tests, the nano folder and the probes, side by side (correctness only: nothing here is timed)
timeout 150 python3 -m pytest -o addopts="" -q -rs -p no:warnings --timeout 140 \
    tests/gpu/test_optim_in_backward_cuda.py tests/gpu/test_speech_liger_cuda.py > "$OUT/gpu_tests.log" 2>&1 &
WD=bench/tmp/wholerun_data
if [ -f $WD/train.jsonl ]; then
    timeout 120 python3 tools/make_nano_folder.py --out /tmp/nano > "$OUT/make_nano.log" 2>&1 &
fi
R=/tmp/probe_runs; mkdir -p $R
P="configs/fun_asr_nano.yaml data.profile=brisk/bench/profiles/aishell1_like.jsonl train.max_steps=120
   train.device=cuda probe.enabled=true train.progress=false train.log_every=40 train.tensorboard=false
   train.export=none train.save_final=false data.num_workers=2 train.overwrite=true"
REF="speed.frozen_eval=true speed.sdpa_backends=[flash,efficient,math]"
OIB="speed.preset=fast speed.optimizer_in_backward=true"
ARMS="eager_ref_noclip preset_oib_noclip eager_ref preset_oib"
for arm in $ARMS; do
    case $arm in
        eager_ref_noclip) S="$REF optim.grad_clip=0";;
        preset_oib_noclip) S="$OIB optim.grad_clip=0";;
        eager_ref) S="$REF";;
        preset_oib) S="$OIB speed.clip_by_previous_norm=true";;
    esac
    (timeout 230 python3 -m brisk train $P train.output_dir=$R/$arm $S > $R/$arm.log 2>&1 || echo "probe run $arm exited with $?") &
done
wait
echo "== part 1 done at $(( $(date +%s) - T0 )) s"; tail -n 4 "$OUT/gpu_tests.log"
for arm in $ARMS; do grep -h "acceleration:\|optimizer_in_backward:" $R/$arm.log | head -2 | cut -c1-300; done
PAIRS="eager_ref_noclip:preset_oib_noclip eager_ref:preset_oib preset_oib_noclip:preset_oib"
for pair in $PAIRS; do a=${pair%:*}; b=${pair#*:}
    [ -f $R/$a/probe.rank0.jsonl ] && [ -f $R/$b/probe.rank0.jsonl ] || { echo "probe $b vs $a: a run is missing"; continue; }
    python3 -m brisk probe compare $R/$a $R/$b --tolerances kernel_noise --out "$OUT/probe_${b}_vs_$a.md" \
        > "$OUT/probe_${b}_vs_$a.txt" 2>&1; echo "probe $b vs $a: exit $?"; done
tar czf "$OUT/probe_runs.tgz" -C /tmp --exclude='*.pt' --exclude=checkpoints --exclude=tb probe_runs 2>/dev/null

# 2. the attention kernels at this size (~30 s)
timeout "$(left 260)" python3 bench/attention35.py --out /tmp/attn35 > "$OUT/attention35.log" 2>&1 \
    || echo "attention35 exited with $?"
cp /tmp/attn35/attention35.md /tmp/attn35/attention35.json "$OUT/" 2>/dev/null

# 3. the bench: FunASR's workload when its data is here, else the AISHELL-1-like stream
if [ -f $WD/train.jsonl ] && [ -f /tmp/nano/model.pt ]; then
    W="model.path=/tmp/nano data.train=$WD/train.jsonl"; echo "workload: FunASR's prompt (bench_prompt)"
else
    W="data.profile=brisk/bench/profiles/aishell1_like.jsonl data.train=null"; echo "workload: AISHELL-1-like stream (no wholerun data or nano folder)"
fi
echo "$W" > "$OUT/workload.txt"
timeout "$(left ${BENCH_END:-535})" python3 -m brisk bench configs/bench_levers35.yaml $W --out /tmp/levers35 \
    > "$OUT/bench_levers35.log" 2>&1 || echo "bench exited with $? (the table holds the runs that finished)"
cp /tmp/levers35/bench.md "$OUT/bench_levers35.md" 2>/dev/null; cp /tmp/levers35/bench.json "$OUT/" 2>/dev/null
grep -h "bench: .* run [0-9]*: mean" "$OUT/bench_levers35.log" | sed 's/.*bench: /  /'

echo "== elapsed $(( $(date +%s) - T0 )) s"
for pair in $PAIRS; do a=${pair%:*}; b=${pair#*:}
    [ -f "$OUT/probe_${b}_vs_$a.md" ] && { echo "== probe $b vs $a"; head -n 1 "$OUT/probe_${b}_vs_$a.md";
        grep "unmet" "$OUT/probe_${b}_vs_$a.md" | head -n 4; }; done
echo "== attention (one layer, forward + backward)"; grep "^|" "$OUT/attention35.md" 2>/dev/null
echo "== bench ($(cat "$OUT/workload.txt"))"; cat /tmp/levers35/bench.md 2>/dev/null
