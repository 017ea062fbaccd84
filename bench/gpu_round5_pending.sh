#!/usr/bin/env bash
# What round 4b could not measure, in one device call (one H200, <= 9 minutes). From the repo root, with the wheels
# in .whl/ (soundfile, cffi, pycparser, jiwer, rapidfuzz, funasr, kaldiio, omegaconf, librosa, lazy_loader, soxr;
# transformers 5.24 in .whl/t524/) and bench/tmp/wholerun_data (tools/make_wholerun_data.py) carried:
#   OUT=$OUT bash bench/gpu_round5_pending.sh
# 1. GPU tests, side by side: the decoder's (the memory-release fix), the graphed training step's whole file
#    (after the family batch split: resume of a graphed run, tf32 scope, val decode on the packed path), the
#    Qwen3-ASR ones (transformers 5.24 first on their path);
# 2. issue 34: bench/decode_bench.py, the fused decode step's arms and FunASR's generate (ms a token, utts/s at
#    batches 1, 16, 64);
# 3. issue 31: the Qwen3-ASR recipe, the preset, the preset without speed.audio_varlen, 2 interleaved runs.
# Everything lands in $OUT/all.tgz (a call returns 8 files at most); the tables are printed last.
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-bench/tmp/gpu_out}; WHL=${WHL:-.whl}
mkdir -p "$OUT" /tmp/site /tmp/t524 /tmp/r
left() { local s=$(( $1 - ($(date +%s) - T0) )); echo $(( s > 10 ? s : 10 )); }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $WHL/soundfile*.whl $WHL/cffi*.whl \
    $WHL/pycparser*.whl $WHL/jiwer*.whl $WHL/rapidfuzz*.whl $WHL/funasr*.whl $WHL/kaldiio*.whl $WHL/omegaconf*.whl \
    $WHL/librosa*.whl $WHL/lazy_loader*.whl $WHL/soxr*.whl 2>&1 | tail -n 2
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/t524 $WHL/t524/transformers*.whl 2>&1 | tail -n 2
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/pycache TORCHINDUCTOR_CACHE_DIR=/tmp/brisk_inductor
python3 -c "import transformers; from transformers import Qwen3ForCausalLM" || { echo "transformers does not import: stop"; exit 1; }
{ date -u; nvidia-smi -L; python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers',
transformers.__version__)"; } > /tmp/r/machine.txt 2>&1

PT="python3 -m pytest -o addopts= -q -rs -p no:warnings -p no:cacheprovider --timeout 150"
timeout 170 $PT tests/gpu/test_device_features_gpu.py tests/gpu/test_fast_decode_gpu.py > /tmp/r/gpu_tests_decode.log 2>&1 &
timeout 170 $PT tests/gpu/test_gpu_state.py > /tmp/r/gpu_tests_state.log 2>&1 &
PYTHONPATH=$PYTHONPATH:/tmp/t524 timeout 170 $PT tests/gpu/test_qwen3_asr_cuda.py \
    tests/gpu/test_qwen3_asr_audio_varlen_cuda.py > /tmp/r/gpu_tests_qwen3_asr.log 2>&1 &
wait
echo "== part 1 done at $(( $(date +%s) - T0 )) s"

timeout "$(left 380)" python3 bench/decode_bench.py --out /tmp/r/decode \
    --arms fast_compile_buckets,fast_compile,plain,fast_eos,funasr,fast_llm --plain-profile 1 --slow-utts 4 --repeats 2 \
    --budget "$(( $(left 380) - 40 ))" > /tmp/r/decode.log 2>&1
echo "decode_bench exit $?"

timeout "$(left 535)" python3 bench/qwen3_asr_bench.py --wheels $WHL --out /tmp/r/q31 \
    --arms recipe,brisk_fast,brisk_fast_nav --steps 20 --warmup 5 --runs 2 --budget-s "$(( $(left 535) - 10 ))" \
    > /tmp/r/q31.log 2>&1
echo "qwen3_asr_bench exit $?"

tar czf "$OUT/all.tgz" -C /tmp --exclude="checkpoint-*" --exclude="*.safetensors" --exclude="*.pt" r
cat /tmp/r/machine.txt
echo "== GPU tests"; for f in decode state qwen3_asr; do tail -n 3 /tmp/r/gpu_tests_$f.log; done
echo "== decode"; cat /tmp/r/decode/decode_bench.md 2>/dev/null || tail -n 5 /tmp/r/decode.log
echo "== Qwen3-ASR"; grep "^|" /tmp/r/q31.log | tail -n 5
echo "call took $(( $(date +%s) - T0 )) s"
