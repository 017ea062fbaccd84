#!/usr/bin/env bash
# Round 3's GPU calls, one device call a part (10 minutes at most each). From the repo root on the GPU machine,
# with the wheels in .whl/ and, for `compare`, the code before the change unpacked in .baseline/
# (git archive 7436a4a --prefix=.baseline/ | tar -x):
#   bash bench/gpu_round3.sh tests     # every GPU test (not the multi-GPU file), then the decoding benchmark
#   bash bench/gpu_round3.sh compare   # probe records: old vs new fast path, eager reference vs preset; bench
#   bash bench/gpu_round3.sh llm       # GPU tests to re-run, chat SFT (seed's loop, TRL + Liger, brisk), decoding
#   python3 bench/memory_speed.py --sizes 0.6B,1.7B,4B   # issue 23's memory/speed table (not run in round 3)
# Round 3b (second session; data from `python tools/make_wholerun_data.py --out bench/tmp/wholerun_data`, carried):
#   bash bench/gpu_round3.sh levers    # GPU tests, then the preset's two open levers (bench_levers.yaml)
#   LEVERS="speed.fresh_grads=true ..." bash bench/gpu_round3.sh prompt   # FunASR's workload, whole run, probe
#   bash bench/gpu_round3.sh sft       # chat SFT table (issue 21), then the memory/speed table (issue 23)
#   bash bench/gpu_round3.sh profile   # kernel classes of the fast path and the preset on FunASR's workload
# Round 3c (third session; bench/results/2026-12-01-h200-round3c/README.md):
#   bash bench/gpu_round3.sh sft2      # GPU test of the batched Gated DeltaNet path, chat table (2B, 9B) at 8k tokens
#   bash bench/gpu_round3.sh sft3      # the dense row like for like (TRL on the same batches), the hybrid's other arms
#   bash bench/gpu_round3.sh big       # the ~9B / 8B chat configs (LoRA), then configs/bench_buckets.yaml
#   bash bench/gpu_round3.sh final     # the 9B config as shipped, probe of the preset as shipped
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-bench/tmp/gpu_out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/soundfile*.whl .whl/cffi*.whl .whl/pycparser*.whl .whl/jiwer*.whl .whl/rapidfuzz*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/pycache
unset PYTHONDONTWRITEBYTECODE
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TORCHINDUCTOR_CACHE_DIR=/tmp/brisk_inductor
left() { local s=$(( $1 - ($(date +%s) - T0) )); echo $(( s > 10 ? s : 10 )); }
# The eager reference and the preset (plus "$1"), 120 real-size steps each, then the probe comparison;
# the second argument is the time budget (seconds since the start) the runs must end by.
probe_preset() {
    R=/tmp/probe_runs; mkdir -p $R
    P="configs/fun_asr_nano.yaml data.profile=brisk/bench/profiles/aishell1_like.jsonl train.max_steps=120
       train.device=cuda probe.enabled=true train.progress=false train.log_every=40 train.tensorboard=false
       train.export=none train.save_final=false data.num_workers=4 train.overwrite=true"
    for arm in eager_ref preset; do
        [ $arm = eager_ref ] && S="speed.frozen_eval=true speed.sdpa_backends=[flash,efficient,math]" || S="speed.preset=fast $1"
        timeout "$(left "$2")" python3 -m brisk train $P train.output_dir=$R/$arm $S > $R/$arm.log 2>&1 || echo "$arm exited with $?"
        grep -h "acceleration:\|preset" $R/$arm.log | head -3 | cut -c1-400; done
    python3 -m brisk probe compare $R/eager_ref $R/preset --tolerances kernel_noise --out "$OUT/probe_preset_vs_eager_ref.md" \
        > /tmp/cmp.txt 2>&1; echo "== probe preset vs eager_ref: exit $?"; tail -n 6 /tmp/cmp.txt
}
{ date -u; nvidia-smi -L; python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers',
transformers.__version__)"; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

case "${1:-}" in
tests)
    mkdir -p /tmp/k && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/k \
        .whl/fla_core*.whl .whl/liger_kernel*.whl
    PYTHONPATH=/tmp/site:$PWD:/tmp/k timeout 400 python3 -m pytest -o addopts="" -q -rs -p no:warnings \
        --durations=12 --timeout 150 tests/gpu --ignore=tests/gpu/test_multigpu.py 2>&1 | tee "$OUT/gpu_tests.log" | tail -n 25
    timeout "$(left 585)" python3 bench/decode_bench.py --out /tmp/decode --arms plain,fast --slow-utts 4 \
        --repeats 2 --budget "$(left 520)" 2>&1 | tail -n 14
    cp /tmp/decode/decode_bench.md /tmp/decode/decode_bench.json "$OUT/" 2>/dev/null
    ;;
compare)
    R=/tmp/probe_runs; mkdir -p $R
    P="configs/fun_asr_nano.yaml data.profile=brisk/bench/profiles/aishell1_like.jsonl train.max_steps=120
       train.device=cuda probe.enabled=true train.progress=false train.log_every=40 train.tensorboard=false
       train.export=none train.save_final=false data.num_workers=4 train.overwrite=true"
    FAST="speed.packing=true speed.cuda_graph=true speed.frozen_eval=true speed.encoder_dtype=bf16 speed.compile=true"
    run() { local name=$1 code=$2; shift 2; echo "== $name ($code)";
        PYTHONPATH=/tmp/site:$code timeout "${LIMIT:-150}" python3 -m brisk train $P train.output_dir=$R/$name "$@" \
            > $R/$name.log 2>&1 || echo "   $name exited with $?"; grep -h "acceleration:" $R/$name.log | cut -c1-220; }
    run old_fast "$PWD/.baseline" $FAST
    run new_fast "$PWD" $FAST
    run new_preset "$PWD" speed.preset=fast
    run new_eager_ref "$PWD" speed.frozen_eval=true "speed.sdpa_backends=[flash,efficient,math]"
    for pair in "old_fast new_fast" "new_eager_ref new_preset" "new_eager_ref new_fast"; do set -- $pair
        python3 -m brisk probe compare $R/$1 $R/$2 --tolerances kernel_noise --out "$OUT/probe_$2_vs_$1.md" \
            > /tmp/cmp.txt 2>&1; echo "== probe $2 vs $1: exit $?"; tail -n 4 /tmp/cmp.txt; done
    for rep in 1 2; do  # old and new code, alternating: the same bench config, the same batches
        PYTHONPATH=/tmp/site:$PWD/.baseline timeout "$(left 560)" python3 -m brisk bench configs/bench_refactor.yaml \
            bench.runs=1 --out /tmp/bench_old$rep > /tmp/bench_old$rep.log 2>&1; tail -n 3 /tmp/bench_old$rep/bench.md
        timeout "$(left 575)" python3 -m brisk bench configs/bench_preset.yaml bench.runs=1 --out /tmp/bench_new$rep \
            > /tmp/bench_new$rep.log 2>&1; tail -n 4 /tmp/bench_new$rep/bench.md; done
    for f in bench_old1 bench_new1 bench_old2 bench_new2; do echo "## $f"; cat /tmp/$f/bench.md 2>/dev/null; done > "$OUT/benches.md"
    tar czf "$OUT/compare_runs.tgz" -C /tmp --exclude='*.pt' --exclude=checkpoints --exclude=tb probe_runs \
        $(cd /tmp && ls bench_*.log bench_old*/bench.json bench_new*/bench.json 2>/dev/null)
    ;;
llm)
    # the GPU tests that failed in the first call for a missing wheel (jiwer) or a test of the old mechanism
    timeout 200 python3 -m pytest -o addopts="" -q -rs -p no:warnings --timeout 120 tests/gpu/test_lora_gpu.py \
        tests/gpu/test_label_head_cuda.py "tests/gpu/test_gpu_state.py::test_fused_projections_train_like_the_plain_ones_on_the_fast_path" \
        "tests/gpu/test_gpu_state.py::test_val_decode_on_the_packed_cuda_path" \
        "tests/gpu/test_gpu_state.py::test_graphed_probe_module_norms_are_before_clipping" \
        "tests/gpu/test_gpu_state.py::test_bf16_encoder_run_exports_the_fp32_encoder_bit_identical" \
        2>&1 | tee "$OUT/gpu_tests_rerun.log" | tail -n 8
    # fla's gated delta rule backward refuses Triton < 3.7.1 on Hopper (this image: Triton 3.6): no fla arms
    # the preset without sdpa_backends (with it: 25.1 ms and 5,499 kernels against the fast path's 20.3 / 3,408)
    timeout "$(left 400)" python3 -m brisk bench configs/bench_preset.yaml bench.runs=1 --out /tmp/bench_preset \
        > /tmp/bench_preset.log 2>&1; tail -n 5 /tmp/bench_preset/bench.md; cp /tmp/bench_preset/bench.md "$OUT/bench_preset.md"
    [ -n "${SFT:-}" ] && timeout "$(left 430)" python3 bench/sft_bench.py --wheels .whl --no-fla --out /tmp/sft --budget-s "$(left 360)" \
        --steps 5 --arms a_loop,d_brisk_fast,b_trl_liger,p_loop_packed,c_brisk_default 2>&1 \
        | tee "$OUT/sft_bench.log" | tail -n 16
    tar czf "$OUT/sft_logs.tgz" -C /tmp sft 2>/dev/null
    timeout "$(left 590)" python3 bench/decode_bench.py --out /tmp/decode --arms plain,fast --slow-utts 4 \
        --repeats 1 --budget "$(left 560)" 2>&1 | tail -n 12
    cp /tmp/decode/decode_bench.md "$OUT/" 2>/dev/null
    ;;
levers)
    mkdir -p /tmp/k && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/k \
        .whl/fla_core*.whl .whl/liger_kernel*.whl
    PYTHONPATH=/tmp/site:$PWD:/tmp/k timeout 250 python3 -m pytest -o addopts="" -q -rs -p no:warnings \
        --durations=8 --timeout 120 tests/gpu --ignore=tests/gpu/test_multigpu.py 2>&1 | tee "$OUT/gpu_tests.log" | tail -n 22
    TORCH_LOGS=recompiles timeout "$(left 590)" python3 -m brisk bench configs/bench_levers.yaml --out /tmp/levers \
        > "$OUT/bench_levers.log" 2>&1; tail -n 12 /tmp/levers/bench.md; cp /tmp/levers/bench.md "$OUT/bench_levers.md"
    ;;
prompt)
    timeout 120 python3 tools/make_nano_folder.py --out /tmp/nano > "$OUT/make_nano.log" 2>&1 || tail "$OUT/make_nano.log"
    timeout "$(left 270)" python3 -m brisk bench configs/bench_prompt.yaml model.path=/tmp/nano \
        data.train=bench/tmp/wholerun_data/train.jsonl --out /tmp/bench_prompt > /tmp/bench_prompt.log 2>&1
    tail -n 12 /tmp/bench_prompt/bench.md; cp /tmp/bench_prompt/bench.md "$OUT/bench_prompt.md"
    timeout "$(left 450)" python3 bench/whole_run.py --speed preset --model /tmp/nano --data bench/tmp/wholerun_data \
        --out /tmp/wr --work /tmp/wr_work --timeout 150 ${LEVERS:-} 2>&1 | tail -n 16
    cp /tmp/wr/whole_run.md /tmp/wr/whole_run.json /tmp/wr/whole_run_logs.tgz "$OUT/" 2>/dev/null
    probe_preset "${LEVERS:-}" 590
    ;;
sft)
    timeout "$(left 380)" python3 bench/sft_bench.py --wheels .whl --no-fla --out /tmp/sft --budget-s "$(left 300)" \
        --steps 5 --arms a_loop,d_brisk_fast,b_trl_liger,p_loop_packed,c_brisk_default 2>&1 | tee "$OUT/sft_bench.log" | tail -n 16
    tar czf "$OUT/sft_logs.tgz" -C /tmp sft 2>/dev/null
    OUT=/tmp/ms timeout "$(left 585)" python3 bench/memory_speed.py --sizes 0.6B,1.7B,4B --budget "$(left 540)" \
        2>&1 | tee "$OUT/memory_speed.log" | tail -n 14
    cp /tmp/ms/memory_speed.md /tmp/ms/memory_speed.json "$OUT/" 2>/dev/null
    ;;
profile)
    [ -f /tmp/nano/model.pt ] || timeout 120 python3 tools/make_nano_folder.py --out /tmp/nano > "$OUT/make_nano.log" 2>&1
    W="model.path=/tmp/nano data.train=bench/tmp/wholerun_data/train.jsonl"
    FASTP="speed.packing=true speed.cuda_graph=true speed.frozen_eval=true speed.encoder_dtype=bf16 speed.compile=true"
    # preset_3b: the preset before round 3c added the 1,792 and 2,304 buckets; preset: as shipped
    OLD_BUCKETS="speed.pack_buckets=[256,384,512,640,768,896,1024,1280,1536,2048,2560,3072,4096]"
    for arm in ${ARMS:-fast preset_3b preset}; do
        case $arm in fast) S="$FASTP";; preset_3b) S="speed.preset=fast $OLD_BUCKETS";; preset) S="speed.preset=fast";; esac
        timeout "$(left 560)" python3 -m brisk profile configs/bench_prompt.yaml $W $S --out /tmp/prof_$arm \
            > /tmp/prof_$arm.log 2>&1 || echo "profile $arm exited with $?"
        cp /tmp/prof_$arm/profile.md "$OUT/profile_prompt_$arm.md" 2>/dev/null; grep -A14 -i "kernel class" /tmp/prof_$arm/profile.md | head -16
    done
    ;;
sft2)
    # round 3c: the batched Gated DeltaNet path (GPU test without fla on the path), then the chat table at
    # 8,192 padded tokens a batch (the seed's loop ran out of memory at 16,384 on Qwen3.5 2B)
    timeout 120 python3 -m pytest -o addopts="" -q -rs -p no:warnings --timeout 100 tests/gpu/test_llm_kernels_cuda.py \
        -k batched 2>&1 | tee "$OUT/gpu_tests_batched.log" | tail -n 4
    timeout "$(left 590)" python3 bench/sft_bench.py --wheels .whl --no-fla --out /tmp/sft --budget-s "$(left 470)" \
        --steps 4 --batch-tokens 8192 --models ${MODELS:-qwen3_5_2b,qwen3_5_9b} \
        --arms ${SFT_ARMS:-a_loop,d_brisk_fast,b2_trl_liger_nockpt} 2>&1 | tee "$OUT/sft_bench.log" | tail -n 12
    tar czf "$OUT/sft_logs.tgz" -C /tmp sft 2>/dev/null
    ;;
sft3)
    # round 3c: the dense model's row like for like (TRL on the same batches, with and without its default
    # gradient checkpointing), the hybrid's remaining arms, at 8,192 padded tokens a batch
    timeout "$(left 330)" python3 bench/sft_bench.py --wheels .whl --no-fla --out /tmp/sft --budget-s "$(left 250)" \
        --steps 4 --batch-tokens 8192 --models qwen3_1p7b \
        --arms a_loop,d_brisk_fast,b_trl_liger,b2_trl_liger_nockpt,c_brisk_default 2>&1 | tee "$OUT/sft_bench_dense.log" | tail -n 8
    timeout "$(left 590)" python3 bench/sft_bench.py --wheels .whl --no-fla --out /tmp/sft_h --budget-s "$(left 500)" \
        --steps 4 --batch-tokens 8192 --models qwen3_5_2b \
        --arms d1_brisk_fast_per_sequence,c_brisk_default,p_loop_packed,b_trl_liger 2>&1 | tee "$OUT/sft_bench_hybrid.log" | tail -n 7
    tar czf "$OUT/sft_logs.tgz" -C /tmp sft sft_h 2>/dev/null
    ;;
big)
    # round 3c: the ~9B chat configs (LoRA on every decoder linear layer: full fine-tuning's 16 bytes a parameter
    # do not fit one H200), then the preset with and without finer pack buckets on FunASR's workload
    timeout 300 python3 bench/sft_bench.py --wheels .whl --no-fla --out /tmp/sft_big --budget-s 230 --steps 4 \
        --models qwen3_5_9b,qwen3_8b --arms d_brisk_fast,c_brisk_default 2>&1 | tee "$OUT/sft_bench_big.log" | tail -n 7
    tar czf "$OUT/sft_big_logs.tgz" -C /tmp sft_big 2>/dev/null
    [ -f /tmp/nano/model.pt ] || timeout 120 python3 tools/make_nano_folder.py --out /tmp/nano > "$OUT/make_nano.log" 2>&1
    timeout "$(left 590)" python3 -m brisk bench configs/bench_buckets.yaml model.path=/tmp/nano \
        data.train=bench/tmp/wholerun_data/train.jsonl --out /tmp/bench_buckets > "$OUT/bench_buckets.log" 2>&1
    tail -n 8 /tmp/bench_buckets/bench.md; cp /tmp/bench_buckets/bench.md "$OUT/bench_buckets.md"
    ;;
final)
    # round 3c: the hybrid ~9B config as shipped (LoRA + activation checkpointing), then the probe of the preset
    # as shipped (finer pack buckets now) against the eager reference
    timeout 200 python3 bench/sft_bench.py --wheels .whl --no-fla --out /tmp/sft_9b --budget-s 100 --steps 4 \
        --models qwen3_5_9b --arms d_brisk_fast 2>&1 | tee "$OUT/sft_bench_9b.log" | tail -n 3
    tar czf "$OUT/sft_9b_logs.tgz" -C /tmp sft_9b 2>/dev/null
    probe_preset "" 520
    cp $R/eager_ref.log $R/preset.log "$OUT/" 2>/dev/null
    ;;
*)
    echo "usage: bash bench/gpu_round3.sh tests|compare|llm|levers|prompt|sft|sft2|sft3|big|final|profile"; exit 2 ;;
esac
echo "part ${1} done in $(( $(date +%s) - T0 )) s"
