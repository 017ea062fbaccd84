#!/usr/bin/env bash
# Issue 34, the decode step (helper i34b): the fused step (one q/k/v and one gate/up GEMM a layer, attention over
# a bucket of the filled slots, a graph per span; brisk/eval/decode_step.py) on one H200. From the repo root on
# the GPU machine, the wheels in .whl/ (soundfile, cffi, pycparser, jiwer, rapidfuzz, funasr, kaldiio, omegaconf,
# librosa, lazy_loader):
#   OUT=$OUT bash bench/gpu_round4_i34b.sh        # ~5 minutes, at most 6; results in $OUT
# Parts (each with its own limit): the device features' and the decoder's GPU tests (170 s), then
# bench/decode_bench.py (arms fast_compile, plain, fast_compile_buckets, fast_eos, fast, fast_llm, funasr at
# batches 1, 16, 64, in that order of need: arms not started 60 s before the call's 350 s are skipped, and each
# finished arm is in the table already). The test summary and the bench's table are printed last.
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-bench/tmp/gpu_out}
WHL=${WHL:-.whl}
BUDGET=${BUDGET:-350}  # seconds the whole call may take
mkdir -p "$OUT"
left() { local s=$(( $1 - ($(date +%s) - T0) )); echo $(( s > 10 ? s : 10 )); }
timeout 60 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$WHL"/soundfile*.whl "$WHL"/cffi*.whl "$WHL"/pycparser*.whl "$WHL"/jiwer*.whl "$WHL"/rapidfuzz*.whl \
    "$WHL"/funasr*.whl "$WHL"/kaldiio*.whl "$WHL"/omegaconf*.whl 2>&1 | tail -n 3
# FunASR's arm: funasr.utils.load_utils imports librosa at the top (it calls librosa.resample only for audio that
# is not 16 kHz); librosa 0.11 loads its submodules lazily, so the wheel and lazy_loader's (~270 KB) are enough,
# without numba, llvmlite or scikit-learn; but soxr's wheel too: transformers' audio_utils imports soxr whenever
# librosa is importable, so librosa without soxr breaks every transformers model import (round 4b's last call:
# 12 GPU tests failed on `Could not import module 'Qwen3ForCausalLM'`). Absent wheels: the arm
# says so in the table.
ls "$WHL"/librosa*.whl "$WHL"/lazy_loader*.whl > /dev/null 2>&1 && timeout 30 python3 -m pip install -q --no-index \
    --no-deps --no-compile --no-cache-dir --target /tmp/site "$WHL"/librosa*.whl "$WHL"/lazy_loader*.whl "$WHL"/soxr*.whl 2>&1 | tail -n 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/pycache
unset PYTHONDONTWRITEBYTECODE
export TORCHINDUCTOR_CACHE_DIR=/tmp/brisk_inductor
{ date -u; nvidia-smi -L; git log -1 --format='commit %h %s' 2>/dev/null
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
} > "$OUT/machine.txt" 2>&1

timeout 170 python3 -m pytest -o addopts="" -q -rs -p no:warnings --durations=8 -p no:cacheprovider \
    tests/gpu/test_device_features_gpu.py tests/gpu/test_fast_decode_gpu.py -s > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests exit $?" >> "$OUT/gpu_tests.log"

BENCH_LEFT=$(left "$BUDGET")
timeout "$BENCH_LEFT" python3 bench/decode_bench.py --out "$OUT/decode" --arms fast_compile,plain,fast_compile_buckets,fast_eos,fast,fast_llm,funasr \
    --plain-profile 1 --slow-utts 4 --repeats 2 --budget "$(( BENCH_LEFT - 60 ))" > "$OUT/decode.log" 2>&1
echo "decode_bench exit $?" >> "$OUT/decode.log"

cat "$OUT/machine.txt"
echo "== GPU tests (tail of $OUT/gpu_tests.log)"
grep -v "^$" "$OUT/gpu_tests.log" | grep -v "UserWarning\|warnings.warn" | tail -n 22
echo "== decode_bench (per-arm lines in $OUT/decode.log)"
grep -i "error\|Traceback\|refused\|failing" "$OUT/decode.log" | head -n 8
tail -n 1 "$OUT/decode.log"
cat "$OUT/decode/decode_bench.md" 2>/dev/null || echo "no table: see $OUT/decode.log"
echo "call took $(( $(date +%s) - T0 )) s"
