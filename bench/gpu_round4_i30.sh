#!/usr/bin/env bash
# Issue 30's GPU call (one H200; bench/results/2026-12-01-h200-round4/README.md, "Issue 30"). From the repo root
# on the GPU machine with fla-core 0.6.0 and liger-kernel wheels in $WHL (default .whl):
#   bash bench/gpu_round4_i30.sh check   # kernel check table, GPU tests, fla-vs-batched probe, chat bench (2B)
#   bash bench/gpu_round4_i30.sh doctor  # brisk doctor --kernels on the 2B chat config
#   bash bench/gpu_round4_i30.sh check2  # second call: the check's shapes in parallel processes (fla compiles and
#                                        # autotunes per head count: minutes each, one CPU core), with the probe
#                                        # beside it, then the doctor alone, the GPU tests, the batched chat arm
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-bench/tmp/gpu_out}; WHL=${WHL:-.whl}
mkdir -p "$OUT" /tmp/k
left() { local s=$(( $1 - ($(date +%s) - T0) )); echo $(( s > 10 ? s : 10 )); }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/k $WHL/fla_core*.whl $WHL/liger_kernel*.whl || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $WHL/soundfile*.whl $WHL/cffi*.whl \
    $WHL/pycparser*.whl $WHL/jiwer*.whl $WHL/rapidfuzz*.whl 2>/dev/null  # brisk's own needs where the image lacks them
export PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/pycache TORCHINDUCTOR_CACHE_DIR=/tmp/brisk_inductor TOKENIZERS_PARALLELISM=false
{ date -u; nvidia-smi -L; python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton',
triton.__version__, 'transformers', transformers.__version__)"; } > "$OUT/machine.txt" 2>&1; cat "$OUT/machine.txt"
case "${1:-}" in
check)
    env PYTHONPATH=$PWD:/tmp/k:/tmp/site timeout "$(left 170)" python3 bench/gdn_check.py --out "$OUT" > "$OUT/gdn_check.log" 2>&1
    echo "gdn_check exit $?"; grep -c "| \*\*NO\*\* |" "$OUT/gdn_check.md"; tail -n 8 "$OUT/gdn_check.md"
    env PYTHONPATH=$PWD:/tmp/k:/tmp/site timeout "$(left 290)" python3 -m pytest -o addopts="" -q -rs -p no:warnings --timeout 100 \
        tests/gpu/test_gdn_check_cuda.py tests/gpu/test_llm_kernels_cuda.py 2>&1 | tee "$OUT/gpu_tests.log" | tail -n 12
    P=/tmp/probe; for arm in fla batched batched_fp32; do
        [ $arm = fla ] && PP=$PWD:/tmp/k:/tmp/site || PP=$PWD:/tmp/site
        env PYTHONPATH=$PP timeout "$(left 360)" python3 bench/fla_probe.py --arm $arm --out $P > $P.$arm.log 2>&1 || echo "probe $arm exit $?"; done
    python3 bench/fla_probe.py --compare $P > "$OUT/fla_probe.md" 2>&1; echo "probe compare exit $?"; tail -n 20 "$OUT/fla_probe.md"
    cat $P.*.log | grep -v "^\[transformers\]" | tail -n 5
    env PYTHONPATH=$PWD:/tmp/site timeout "$(left 575)" python3 bench/sft_bench.py --wheels $WHL --out /tmp/sft --budget-s "$(left 480)" \
        --steps 4 --batch-tokens 8192 --models qwen3_5_2b --arms a_loop,d_brisk_fast,d2_brisk_fast_batched 2>&1 \
        | tee "$OUT/sft_bench.log" | tail -n 8
    tar czf "$OUT/logs.tgz" -C /tmp sft probe probe.fla.log probe.batched.log probe.batched_fp32.log 2>/dev/null
    ;;
doctor)
    env PYTHONPATH=$PWD:/tmp/k:/tmp/site timeout "$(left 300)" python3 -m brisk doctor --kernels configs/sft_qwen3_5_2b.yaml \
        speed.preset=fast 2>&1 | tee "$OUT/doctor_kernels.md" | tail -n 40
    ;;
check2)
    P=/tmp/probe; ( for arm in fla batched batched_fp32; do
        [ $arm = fla ] && PP=$PWD:/tmp/k:/tmp/site || PP=$PWD:/tmp/site
        env PYTHONPATH=$PP timeout "$(left 330)" python3 bench/fla_probe.py --arm $arm --out $P > $P.$arm.log 2>&1 || echo "probe $arm exit $?"; done ) &
    env PYTHONPATH=$PWD:/tmp/k:/tmp/site timeout "$(left 330)" python3 bench/gdn_check.py --jobs 8 --out /tmp/gdn > "$OUT/gdn_check.log" 2>&1
    echo "gdn_check exit $?"; [ -f /tmp/gdn/gdn_check.md ] || python3 bench/gdn_check.py --merge --out /tmp/gdn > /dev/null
    cp /tmp/gdn/gdn_check.md /tmp/gdn/gdn_check.json "$OUT/" 2>/dev/null
    grep -c "| \*\*NO\*\* |" /tmp/gdn/gdn_check.md; grep "^- " /tmp/gdn/gdn_check.md | head; wait
    python3 bench/fla_probe.py --compare $P > "$OUT/fla_probe.md" 2>&1; echo "probe compare exit $?"; grep -c "| yes |" "$OUT/fla_probe.md"; grep "NO" "$OUT/fla_probe.md" | head -5
    env PYTHONPATH=$PWD:/tmp/k:/tmp/site timeout "$(left 420)" python3 -m brisk doctor --kernels configs/sft_qwen3_5_2b.yaml \
        speed.preset=fast > "$OUT/doctor_kernels.md" 2>&1; echo "doctor exit $?"; grep "^|\|^- " "$OUT/doctor_kernels.md" | head -20
    env PYTHONPATH=$PWD:/tmp/k:/tmp/site timeout "$(left 510)" python3 -m pytest -o addopts="" -q -rs -p no:warnings --timeout 200 \
        tests/gpu/test_gdn_check_cuda.py tests/gpu/test_llm_kernels_cuda.py 2>&1 | tee "$OUT/gpu_tests.log" | tail -n 8
    env PYTHONPATH=$PWD:/tmp/site timeout "$(left 580)" python3 bench/sft_bench.py --wheels $WHL --out /tmp/sft --budget-s 60 \
        --steps 4 --batch-tokens 8192 --models qwen3_5_2b --arms d2_brisk_fast_batched 2>&1 | tail -n 3 > "$OUT/sft_bench_d2.log"
    cat "$OUT/sft_bench_d2.log"
    tar czf "$OUT/logs.tgz" -C /tmp gdn probe probe.fla.log probe.batched.log probe.batched_fp32.log sft 2>/dev/null
    ;;
*) echo "usage: bash bench/gpu_round4_i30.sh check|doctor"; exit 2 ;;
esac
echo "part ${1} done in $(( $(date +%s) - T0 )) s"
