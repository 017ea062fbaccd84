#!/usr/bin/env bash
# The GPU calls of one session, each part one device call (10 minutes at most). Run from the repo root on the
# GPU machine with the wheels in .whl/ (see the device README) and the whole-run data in bench/tmp/wholerun_data:
#   bash bench/gpu_session.sh tests2   # 2 GPUs: the GPU tests, then the 2-GPU tests
#   bash bench/gpu_session.sh scaling2 # 2 GPUs: the scaling table (bench/scaling.py)
#   bash bench/gpu_session.sh stack    # 1 GPU: compile_scope=stack against per-layer (bench/configs/bench_stack.yaml)
#   bash bench/gpu_session.sh wholerun # 1 GPU: whole run cold + warm, then the fast path on FunASR's prompt
#   bash bench/gpu_session.sh fastpath # 1 GPU: bench/configs/bench_fastpath.yaml, then a profile of the best arm
#   bash bench/gpu_session.sh funasr   # 1 GPU: FunASR's own trainer, then brisk's preset cold and warm, same data
#                                      #   and folder (wheels: .whl/funasr, bench/funasr_arm.py lists them)
#   bash bench/gpu_session.sh asrstep  # 1 GPU: Qwen3-ASR like for like (every weight training), the frozen tower
#   bash bench/gpu_session.sh asrdecode # 1 GPU: Qwen3-ASR decoding against transformers' generate, batch 1 and 64
#   bash bench/gpu_session.sh chatgraph # 1 GPU: the graphed chat step against the fast arm and the seed's loop
#   bash bench/gpu_session.sh onepass  # 1 GPU: seed 004's measure for Qwen3 1.7B, one pass over 2,000
#                                      #   conversations: the seed's loop, TRL + Liger, brisk (wheels: .whl, .whl/bench)
# Everything worth keeping goes to $OUT (at most 8 files come back: logs are packed into one .tgz).
set -uo pipefail
T0=$(date +%s)  # the call's clock: every budget below counts from here (a call is 600 s at most)
OUT=${OUT:-bench/tmp/gpu_out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/pycache
unset PYTHONDONTWRITEBYTECODE  # the image forbids .pyc files: 8 s of every start-up (bench/results/2026-11-29-h200-whole-run)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
left() { local s=$(( $1 - ($(date +%s) - T0) )); echo $(( s > 10 ? s : 10 )); }  # of a budget of $1 s, at least 10
{ date -u; nvidia-smi -L; python -c "import torch, transformers; print('torch', torch.__version__, 'transformers',
transformers.__version__, 'cudnn', torch.backends.cudnn.version())"; nproc; df -h /tmp | tail -1; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

case "${1:-}" in
tests2)  # 2 GPUs
    CUDA_VISIBLE_DEVICES=0 timeout 240 python -m pytest -o addopts="" -q -rs -p no:warnings --durations=8 tests/gpu \
        --ignore=tests/gpu/test_multigpu.py 2>&1 | tee "$OUT/gpu_tests.log" | tail -n 15
    timeout "$(left 570)" python -m pytest -o addopts="" -v -rs -p no:warnings --durations=5 tests/gpu/test_multigpu.py \
        2>&1 | tee "$OUT/multigpu_tests.log" | tail -n 12
    ;;
scaling2)  # 2 GPUs: 1-GPU and 2-GPU runs of torch defaults and the fast path (~4 x 60 s)
    timeout "$(left 570)" python bench/scaling.py --steps 40 --timeout 120 --out /tmp/scaling
    cp /tmp/scaling/scaling.md "$OUT/scaling.md" 2>/dev/null
    tar czf "$OUT/scaling_logs.tgz" -C /tmp $(cd /tmp && ls scaling/*.log scaling/*.json scaling/*/report.md 2>/dev/null)
    ;;
stack)  # 1 GPU: per-layer against whole-stack compile, cold cache (the stack's compile takes minutes)
    timeout "$(left 570)" python -m brisk bench bench/configs/bench_stack.yaml speed.inductor_cache_dir=/tmp/ind_stack \
        --out /tmp/stack 2>&1 | grep -v -i warn | tail -n 30
    cp /tmp/stack/bench.md "$OUT/stack_bench.md"; cp /tmp/stack/bench.json "$OUT/stack_bench.json"
    ;;
wholerun)
    timeout 400 python bench/whole_run.py --out /tmp/wr --work /tmp/wr_work --pycache /tmp/pycache --timeout 150
    cp /tmp/wr/whole_run.md /tmp/wr/whole_run.json /tmp/wr/whole_run_logs.tgz "$OUT/"
    # the same warm run with the two opt-in step switches of issue 15 (the bench's default arms leave them off)
    timeout 120 python bench/whole_run.py --out /tmp/wr_lh --work /tmp/wr_work --pycache /tmp/pycache --timeout 110 \
        --arms warm speed.label_head=true speed.fresh_grads=true | tail -n 20
    cp /tmp/wr_lh/whole_run.md "$OUT/whole_run_label_head_fresh_grads.md"
    timeout "$(left 570)" python -m brisk bench bench/configs/bench_prompt.yaml model.path=/tmp/wr_work/nano_folder \
        data.train=bench/tmp/wholerun_data/train.jsonl speed.inductor_cache_dir=/tmp/wr_work/inductor_cache --out /tmp/prompt 2>&1 | tail -n 14
    cp /tmp/prompt/bench.md "$OUT/prompt_bench.md"; cp /tmp/prompt/bench.json "$OUT/prompt_bench.json"
    ;;
fastpath)
    TORCHINDUCTOR_CACHE_DIR=/tmp/brisk_inductor timeout 440 python -m brisk bench bench/configs/bench_fastpath.yaml \
        --out /tmp/fp 2>&1 | tail -n 16
    cp /tmp/fp/bench.md "$OUT/bench_fastpath.md"; cp /tmp/fp/bench.json "$OUT/bench_fastpath.json"
    timeout "$(left 570)" python -m brisk profile bench/configs/bench_nano.yaml speed.packing=true speed.cuda_graph=true \
        speed.frozen_eval=true speed.encoder_dtype=bf16 speed.compile=true speed.label_head=true \
        speed.label_rows_frac=0.3 speed.fresh_grads=true --steps 3 --warmup 8 --out /tmp/prof 2>&1 | sed -n 1,40p
    cp /tmp/prof/profile.md "$OUT/profile_best.md"; gzip -c /tmp/prof/trace.json > "$OUT/profile_best_trace.json.gz"
    ;;
funasr)  # ~200 s FunASR (4 epochs, validation and a checkpoint each), ~75 s brisk cold, ~35 s warm, ~36 s the folder
    timeout "$(left 570)" python bench/whole_run.py --arms funasr,cold,warm --speed preset --out /tmp/wrf \
        --work /tmp/wrf_work --pycache /tmp/pycache --timeout 260 | tail -n 40
    cp /tmp/wrf/whole_run.md /tmp/wrf/whole_run.json /tmp/wrf/whole_run_logs.tgz "$OUT/"
    ;;
onepass)  # Qwen3 1.7B only: the Qwen3.5 2B loop's pass (~2.9M tokens at ~4,800 tokens/s) is longer than a call
    timeout "$(left 570)" python bench/sft_bench.py --one-pass --conversations 2000 --models qwen3_1p7b \
        --batch-tokens 8192 --arms a_loop,d4_brisk_fast_compile,b_trl_liger --wheels .whl --budget-s 520 \
        --no-profile --out /tmp/onepass 2>&1 | tail -n 12
    cp /tmp/onepass/results.jsonl "$OUT/onepass_results.jsonl"; tar czf "$OUT/onepass_logs.tgz" -C /tmp onepass
    ;;
asrstep)  # 1 GPU: Qwen3-ASR like for like, every weight training (recipe, graphed, eager twin) and the frozen tower
    timeout "$(left 570)" python bench/qwen3_asr_bench.py --arms recipe,brisk_fast_all,brisk_fast_all_nograph,brisk_fast \
        --steps 20 --runs 2 --wheels .whl/tf --work /tmp/q3b --out /tmp/q3b_out --budget-s 520 2>&1 | tail -n 12
    cp /tmp/q3b_out/results.jsonl "$OUT/qwen3_asr_bench.jsonl"; tar czf "$OUT/qwen3_asr_bench_logs.tgz" -C /tmp q3b_out
    ;;
asrdecode)  # 1 GPU: Qwen3-ASR decoding, transformers' generate against brisk's decoders, batch 1 and 64
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site_asr .whl/tf/*.whl
    PYTHONPATH=/tmp/site_asr:$PYTHONPATH timeout "$(left 570)" python bench/qwen3_asr_decode_bench.py --out /tmp/q3d \
        2>&1 | tail -n 30
    cp /tmp/q3d/decode.md /tmp/q3d/decode.json "$OUT/"
    ;;
chatgraph)  # 1 GPU: the chat step graphed (Qwen3.5 2B and Qwen3 1.7B, 6 steps each) against the fast arm and the loop
    timeout "$(left 570)" python bench/sft_bench.py --models qwen3_5_2b,qwen3_1p7b --batch-tokens 4096 \
        --arms a_loop,d_brisk_fast,d6_brisk_fast_graph,d7_brisk_fast_compile_graph --wheels .whl --budget-s 520 \
        --out /tmp/chatgraph 2>&1 | tail -n 14
    cp /tmp/chatgraph/results.jsonl "$OUT/chatgraph_results.jsonl"; tar czf "$OUT/chatgraph_logs.tgz" -C /tmp chatgraph
    ;;
*)
    echo "usage: bash bench/gpu_session.sh tests2|scaling2|stack|wholerun|fastpath|funasr|onepass|asrstep|asrdecode|chatgraph"; exit 2 ;;
esac
echo "part ${1} done in $(( $(date +%s) - T0 )) s"
