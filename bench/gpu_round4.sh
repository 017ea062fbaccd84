#!/usr/bin/env bash
# Round 4's closing GPU call (one H200, <= 9 minutes), on merged main. From the repo root on the GPU machine with
# the wheels in .whl/ (transformers 5.24 in .whl/t524/, used only for the Qwen3-ASR test):
#   OUT=$OUT bash bench/gpu_round4.sh
# 1. every GPU test (not the multi-GPU file) with fla-core and liger-kernel on the path, transformers 5.17;
# 2. the Qwen3-ASR GPU test with transformers 5.24;
# 3. configs/bench_levers35.yaml (issue 35: preset, + optimizer_in_backward, + liger; same batches, interleaved)
#    on the AISHELL-1-like stream, while time is left.
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-bench/tmp/gpu_out}
mkdir -p "$OUT" /tmp/k /tmp/t524
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/soundfile*.whl .whl/cffi*.whl .whl/pycparser*.whl .whl/jiwer*.whl .whl/rapidfuzz*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/k .whl/fla_core*.whl .whl/liger_kernel*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/t524 .whl/t524/transformers*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD:/tmp/k PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/pycache
unset PYTHONDONTWRITEBYTECODE
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TORCHINDUCTOR_CACHE_DIR=/tmp/brisk_inductor
left() { local s=$(( $1 - ($(date +%s) - T0) )); echo $(( s > 10 ? s : 10 )); }
{ date -u; nvidia-smi -L; git log -1 --format='main %h %s' 2>/dev/null; python3 -c "import torch, transformers, triton;
print('torch', torch.__version__, 'transformers', transformers.__version__, 'triton', triton.__version__)"; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

timeout "$(left 270)" python3 -m pytest -o addopts="" -q -rs -p no:warnings --durations=15 --timeout 150 tests/gpu \
    --ignore=tests/gpu/test_multigpu.py --ignore=tests/gpu/test_qwen3_asr_cuda.py 2>&1 | tee "$OUT/gpu_tests.log" | tail -n 30
PYTHONPATH=/tmp/site:$PWD:/tmp/t524 timeout "$(left 330)" python3 -m pytest -o addopts="" -q -rs -p no:warnings \
    --timeout 120 tests/gpu/test_qwen3_asr_cuda.py 2>&1 | tee "$OUT/gpu_tests_qwen3_asr.log" | tail -n 8

W="data.profile=brisk/bench/profiles/aishell1_like.jsonl data.train=null"
timeout "$(left 520)" python3 -m brisk bench configs/bench_levers35.yaml $W --out /tmp/levers35 \
    > "$OUT/bench_levers35.log" 2>&1 || echo "bench exited with $?"
cp /tmp/levers35/bench.md "$OUT/bench_levers35.md" 2>/dev/null
echo "== elapsed $(( $(date +%s) - T0 )) s"
grep "^|" /tmp/levers35/bench.md 2>/dev/null | head -8 || tail -n 15 "$OUT/bench_levers35.log"
