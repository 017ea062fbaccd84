#!/usr/bin/env bash
# Issue 30, item 5 (one H200, one call, <= 9 minutes): the seed's model sizes on one GPU with LoRA.
# From the repo root, with fla-core, liger-kernel, trl, datasets, dill and multiprocess wheels in $WHL (default .whl):
#   OUT=$OUT bash bench/gpu_round5_i30.sh
# 0. the memory floor of both configs (meta device, CPU) at 8,192 and 4,096 tokens; in the background fla's
#    Triton kernels compiled for 32 and 48 value heads (9B, 27B: minutes each on a cold cache, one CPU core each)
#    and the GPU test of the bf16 build;
# 1. sft_qwen3_5_9b.yaml (LoRA r 16, every layer checkpointed), brisk fast, 8,192 tokens a batch: tokens/s, peak;
# 2. sft_qwen3_5_27b_lora.yaml, brisk fast, 8,192 tokens: does it train on one H200, tokens/s, peak;
# 3. the 9B at 4,096 tokens a batch: peak against Unsloth's published 22 GB;
# 4. if time is left: TRL + Liger on the 9B with peft's LoRA (its users' way), TRL's gradient checkpointing.
#    fla 0.6's own entry refuses the gated backward on Hopper with Triton 3.6 (issue 30), so transformers' torch
#    Gated DeltaNet is what TRL's users get here; TRL_FLA=1 puts fla on its path anyway (expect the refusal).
# An arm that runs out of memory is one row ("out of memory at N tokens a batch", its peak). Everything lands in
# $OUT/all.tgz (a call returns 8 files at most); the table is printed last.
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-bench/tmp/gpu_out}; WHL=${WHL:-.whl}
R=/tmp/r5; W=/tmp/sftw  # results; bench data and the wheels' private folders
mkdir -p "$OUT" $R /tmp/site
left() { local s=$(( $1 - ($(date +%s) - T0) )); echo $(( s > 10 ? s : 10 )); }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $WHL/soundfile*.whl $WHL/cffi*.whl \
    $WHL/pycparser*.whl $WHL/jiwer*.whl $WHL/rapidfuzz*.whl 2>&1 | tail -n 2  # brisk's own needs the image lacks
python3 -m pip install -q --no-index --no-deps --no-compile --target $W/site_fla $WHL/fla_core*.whl $WHL/liger_kernel*.whl \
    2>&1 | tail -n 2  # the bench's own fla folder: the warm-up below compiles the very files its arms import
export PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/pycache TORCHINDUCTOR_CACHE_DIR=/tmp/brisk_inductor \
    TRITON_CACHE_DIR=/tmp/triton_cache TOKENIZERS_PARALLELISM=false PYTHONPATH=$PWD:/tmp/site
{ date -u; nvidia-smi -L; git log -1 --format='commit %h %s' 2>/dev/null; python3 -c "import torch, triton, transformers, peft;
print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__)"; } \
    > $R/machine.txt 2>&1; cat $R/machine.txt
B="python3 bench/sft_bench.py --wheels $WHL --work $W --no-profile --models"

# 0. estimates (CPU), fla warm-up and the build test (GPU, background), the bench data
( for n in 8192 4096; do python3 bench/sft_bench.py --estimate --models qwen3_5_9b,qwen3_5_27b_lora --batch-tokens $n; done \
    > $R/estimate.md 2>&1 ) &
PYTHONPATH=$PWD:$W/site_fla:/tmp/site timeout 170 python3 bench/fla_warm.py 32 48 > $R/fla_warm.log 2>&1 &
WARM=$!
timeout 120 python3 -m pytest -o addopts= -q -rs -p no:warnings -p no:cacheprovider --timeout 100 \
    tests/gpu/test_chat_build_cuda.py > $R/gpu_test_build.log 2>&1 &
python3 tools/make_chat_data.py ultrachat --out $W/data --n 600 --n-valid 8 --seed 7 > $R/data.log 2>&1
wait $WARM; echo "fla warm-up exit $? at $(( $(date +%s) - T0 )) s"; wait; cat $R/fla_warm.log | tail -n 4
echo "== part 0 done at $(( $(date +%s) - T0 )) s"; tail -n 3 $R/gpu_test_build.log

# 1.-3. brisk fast (fla, liger, packing, label_head, fused AdamW) on the LoRA configs
part() {  # name end_s model batch_tokens steps warmup arms [extra]
    local name=$1 end=$2 model=$3 tokens=$4 steps=$5 warmup=$6 arms=$7; shift 7
    # the bench kills its worker at budget + 60 s (30 s at least), before this timeout: the row is written either way
    timeout "$(( $(left $end) + 15 ))" $B $model --arms $arms --batch-tokens $tokens --steps $steps --warmup $warmup \
        --out $R/$name --budget-s "$(( $(left $end) > 66 ? $(left $end) - 65 : 1 ))" "$@" > $R/$name.log 2>&1
    echo "== $name exit $? at $(( $(date +%s) - T0 )) s"; grep '^{' $R/$name.log | cut -c1-400
}
part p1_9b_8192 ${END1:-280} qwen3_5_9b 8192 4 2 d_brisk_fast
part p2_27b_8192 ${END2:-400} qwen3_5_27b_lora 8192 3 1 d_brisk_fast
part p3_9b_4096 ${END3:-470} qwen3_5_9b 4096 4 1 d_brisk_fast
[ -n "${TRL_FLA:-}" ] && NOFLA="" || NOFLA="--no-fla"
part p4_9b_trl ${END4:-530} qwen3_5_9b 8192 2 1 b_trl_liger $NOFLA

cp $R/*.md $R/machine.txt "$OUT/" 2>/dev/null
tar czf "$OUT/all.tgz" -C /tmp --exclude='r5/*/trl' r5 2>/dev/null
echo "== done in $(( $(date +%s) - T0 )) s"
cat $R/estimate.md
python3 bench/sft_bench.py --table $R/p*/results.jsonl 2>/dev/null
