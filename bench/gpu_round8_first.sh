#!/usr/bin/env bash
# Round 8's first device call (one H200, <= 9.5 minutes; carry .whl and bench/tmp/wholerun_data):
#   OUT=$OUT bash bench/gpu_round8_first.sh
# What rounds 6-7 left unrun or failing on the GPU (bench/results/2026-12-02-h200-round7/README.md):
# 1. tests/gpu/test_llm_step_cuda.py and test_optim_in_backward_cuda.py (the graph capture now keeps the previous
#    norm instead of zeroing it: the checkpoint restores it; new: a graphed resume under clip_by_previous_norm and
#    label_head_recompute inside the captured step) (Qwen3 fp32 compiled == eager failed in Inductor's searchsorted lowering;
#    block_causal_mask now counts boundaries with a comparison) while fla's kernels for 16 value heads compile
#    beside it (bench/fla_warm.py 16: 143 s cold in round 7);
# 2. then tests/gpu/test_llm_kernels_cuda.py alone with the rest of 450 s (round 7's 240 s limit killed it in
#    its first test: fla's first compiles): its new test, fla's host syncs a step do not grow with the layers;
#    and tests/gpu/test_kernel_doctor_cuda.py (the doctor on CUDA: every kernel within its bound, the compiled layer);
# 3. bench/decode_bench.py at batch 64, the default compile mode as the process's first arm (round 7 call 4:
#    250 ms a batch outside every timed stage, 74.4 utts/s over 5 passes) with --host-profile (cProfile of one
#    whole-batch transcribe: host_*.txt) and 5 passes, then its batch-1 row; before it, bench/read_scaling.py
#    (40 files read on 1-15 threads: round 7's reads were 5x slower than the threads allow);
# 4. `brisk doctor --kernels` on Qwen3 1.7B with speed.compile: its compiled-decoder-layer check's first GPU run.
# Everything lands in $OUT/all.tgz; the summary is printed last.
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-bench/tmp/gpu_out}; WHL=${WHL:-.whl}
R=/tmp/r8; mkdir -p "$OUT" $R /tmp/site
left() { local s=$(( $1 - ($(date +%s) - T0) )); echo $(( s > 10 ? s : 10 )); }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $WHL/soundfile*.whl $WHL/cffi*.whl \
    $WHL/pycparser*.whl $WHL/jiwer*.whl $WHL/rapidfuzz*.whl $WHL/fla_core*.whl $WHL/liger_kernel*.whl $WHL/funasr*.whl \
    $WHL/kaldiio*.whl $WHL/omegaconf*.whl $WHL/librosa*.whl $WHL/lazy_loader*.whl $WHL/soxr*.whl 2>&1 | tail -n 2
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/pycache \
    TORCHINDUCTOR_CACHE_DIR=/tmp/brisk_inductor TRITON_CACHE_DIR=/tmp/triton_cache TOKENIZERS_PARALLELISM=false
{ date -u; nvidia-smi -L; git log -1 --format='commit %h %s' 2>/dev/null; python3 -c "import torch, triton, transformers
print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"; } \
    > $R/machine.txt 2>&1

# 1. the step tests beside fla's compiles
timeout 200 python3 bench/fla_warm.py 16 > $R/fla_warm.log 2>&1 &
timeout 240 python3 -m pytest -o addopts= -v -rA --tb=short -p no:warnings -p no:cacheprovider \
    tests/gpu/test_llm_step_cuda.py tests/gpu/test_optim_in_backward_cuda.py > $R/gpu_tests_step.log 2>&1
echo "== step tests exit $? at $(( $(date +%s) - T0 )) s"
wait
# 2. the kernel tests alone
timeout "$(left 450)" python3 -m pytest -o addopts= -v -rA --tb=short -p no:warnings -p no:cacheprovider \
    tests/gpu/test_llm_kernels_cuda.py tests/gpu/test_kernel_doctor_cuda.py > $R/gpu_tests_kernels.log 2>&1
echo "== kernel tests exit $? at $(( $(date +%s) - T0 )) s"
# 3. batch-64 decode, host profile; first how reading 40 files scales with threads on this host
python3 bench/read_scaling.py bench/tmp/wholerun_data/audio/valid --files 40 > $R/read_scaling.md 2>&1
timeout "$(left 520)" python3 bench/decode_bench.py --out $R/decode --arms fast_compile_buckets_multi_enc16 \
    --batches 64,1 --repeats 1 --passes 5 --host-profile --budget "$(( $(left 520) - 10 ))" > $R/decode.log 2>&1
echo "== decode_bench exit $? at $(( $(date +%s) - T0 )) s"
# 4. the kernel doctor with its new compiled-layer check (Qwen3 1.7B, compile on)
timeout "$(left 590)" python3 -m brisk doctor --kernels configs/sft_qwen3_1p7b.yaml speed.preset=fast \
    speed.compile=true > $R/doctor_1p7b.md 2>&1
echo "== doctor exit $? at $(( $(date +%s) - T0 )) s"

tar czf "$OUT/all.tgz" -C /tmp r8 2>/dev/null
{ cat $R/machine.txt; grep -E "PASSED|FAILED|ERROR|passed|failed" $R/gpu_tests_step.log $R/gpu_tests_kernels.log | tail -n 30
  grep -E "^\| brisk" $R/decode/decode_bench.md 2>/dev/null | cut -c1-260; head -n 40 $R/decode/host_*b64.txt 2>/dev/null
  grep -E "^\| " $R/doctor_1p7b.md 2>/dev/null; cat $R/read_scaling.md
} > "$OUT/summary.md"
echo "== done in $(( $(date +%s) - T0 )) s"; cat "$OUT/summary.md"
