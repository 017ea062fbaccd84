#!/usr/bin/env bash
# Issue 35, round 14: two device calls (<= 10 minutes each, one H200), from the repo root with .whl/ and
# bench/tmp/wholerun_data carried:
#   OUT=$OUT PART=1 bash bench/gpu_round14.sh   # GPU tests after round 13's mends + speed.graph_capture=seen;
#                                                # the profile of preset + static layers + flex with pinned batches
#   OUT=$OUT PART=2 bash bench/gpu_round14.sh   # whole runs: the preset, + static layers + flex, + graph_capture=seen
#   OUT=$OUT PART=3 bash bench/gpu_round14.sh   # probe of static layers + flex + seen; bench and profile after the
#                                                # per-tensor norm casts became one (configs/bench_preset35.yaml)
# Predictions (bench/LOG.md, round 14):
#   part 1: the tests pass; with pinned batches the profile's long idle gaps (device waiting for the host) fall to
#     < 0.3 ms a step, and the ~1.7 ms between the bench's 27.6 ms and the 25.9 ms of kernels is short gaps
#     (kernel to kernel inside the graphs: ~2,900 kernels x ~0.6 us);
#   part 2: warm whole runs within 3 s of each other (the steps differ by 1.8 ms x ~144); static layers cost
#     ~25 s more cold (one compile a bucket, 15 buckets); graph_capture=seen compiles only the buckets the data
#     reaches and takes back most of it.
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-bench/tmp/gpu_out}
mkdir -p "$OUT" /tmp/keep
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/soundfile*.whl .whl/cffi*.whl .whl/pycparser*.whl .whl/jiwer*.whl .whl/rapidfuzz*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=/tmp/pycache
unset PYTHONDONTWRITEBYTECODE
export TORCHINDUCTOR_CACHE_DIR=/tmp/brisk_inductor
left() { local s=$(( $1 - ($(date +%s) - T0) )); echo $(( s > 10 ? s : 10 )); }
{ date -u; nvidia-smi -L; python3 -c "import torch, transformers, triton; print('torch', torch.__version__,
'transformers', transformers.__version__, 'triton', triton.__version__)"; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
WD=bench/tmp/wholerun_data
STATIC="speed.compile_dynamic=false speed.flex_attention=true"

if [ "${PART:-1}" = 1 ]; then
    timeout 330 python3 -m pytest -o addopts="" -q -rs -p no:warnings --timeout 320 tests/gpu/test_flex_attention_cuda.py \
        "tests/gpu/test_gpu_state.py::test_seen_capture_captures_a_bucket_at_its_first_batch_and_trains_as_ahead" \
        "tests/gpu/test_gpu_state.py::test_release_frees_every_graph_and_a_later_step_captures_again" \
        > "$OUT/gpu_tests.log" 2>&1 &
    timeout 120 python3 tools/make_nano_folder.py --out /tmp/nano > /tmp/keep/make_nano.log 2>&1
    wait
    echo "== tests done at $(( $(date +%s) - T0 )) s"; tail -n 6 "$OUT/gpu_tests.log"
    timeout "$(left 560)" python3 -m brisk profile configs/bench_prompt.yaml model.path=/tmp/nano \
        data.train=$WD/train.jsonl speed.preset=fast speed.pack_buckets=[1280,1536,1792,2048,2304,2560] \
        --out /tmp/profile14 > /tmp/keep/profile.log 2>&1 || echo "profile exited with $?"
    cp /tmp/profile14/profile.md "$OUT/profile_static_flex.md" 2>/dev/null
    gzip -c /tmp/profile14/trace.json > "$OUT/trace_static_flex.json.gz" 2>/dev/null
    head -n 8 "$OUT/profile_static_flex.md"
elif [ "${PART}" = 3 ]; then
    # side by side, untimed: two GPU tests of graph_capture=seen and the probes (the eager reference, and the
    # preset since round 14 through `brisk train`: static layers + flex + seen, the preset's 15 buckets); then the
    # bench of round 13's preset against this one, after the norms fix (the bench captures every bucket ahead)
    timeout 120 python3 tools/make_nano_folder.py --out /tmp/nano > /tmp/keep/make_nano.log 2>&1 &
    timeout 200 python3 -m pytest -o addopts="" -q -rs -p no:warnings --timeout 190 \
        "tests/gpu/test_gpu_state.py::test_validation_replays_audio_graphs_but_captures_none" \
        "tests/gpu/test_gpu_state.py::test_seen_capture_captures_a_bucket_at_its_first_batch_and_trains_as_ahead" \
        > "$OUT/gpu_tests.log" 2>&1 &
    R=/tmp/probe_runs; mkdir -p $R
    P="configs/fun_asr_nano.yaml data.profile=brisk/bench/profiles/aishell1_like.jsonl train.max_steps=120
       train.device=cuda probe.enabled=true train.progress=false train.log_every=40 train.tensorboard=false
       train.export=none train.save_final=false data.num_workers=2 train.overwrite=true"
    for arm in eager_ref static_seen; do
        case $arm in
            eager_ref) S="speed.frozen_eval=true speed.sdpa_backends=[flash,efficient,math]";;
            static_seen) S="speed.preset=fast";;  # static layers + flex + seen since round 14
        esac
        (timeout 210 python3 -m brisk train $P train.output_dir=$R/$arm $S > $R/$arm.log 2>&1 || echo "probe run $arm exited with $?") &
    done
    wait
    echo "== probes done at $(( $(date +%s) - T0 )) s"
    python3 -m brisk probe compare $R/eager_ref $R/static_seen --tolerances kernel_noise --out "$OUT/probe_static_seen_vs_eager_ref.md" \
        > /tmp/keep/probe.txt 2>&1; echo "probe static_seen vs eager_ref: exit $?"
    head -n 1 "$OUT/probe_static_seen_vs_eager_ref.md"; grep "unmet" "$OUT/probe_static_seen_vs_eager_ref.md" | head -n 4
    grep -h "graph_capture\|captured\|capturing" $R/static_seen.log | cut -c1-200 | head -n 12
    cp $R/*.log /tmp/keep/ 2>/dev/null; cp $R/static_seen/slow_steps.jsonl /tmp/keep/ 2>/dev/null
    timeout "$(left ${BENCH_END:-470})" python3 -m brisk bench configs/bench_preset35.yaml model.path=/tmp/nano \
        data.train=$WD/train.jsonl --out /tmp/preset35 > /tmp/keep/bench_preset35.log 2>&1 \
        || echo "bench exited with $? (the table holds the runs that finished)"
    cp /tmp/preset35/bench.md "$OUT/bench_preset35.md" 2>/dev/null
    grep -h "bench: .* run [0-9]*: mean" /tmp/keep/bench_preset35.log | sed 's/.*bench: /  /'
    # the profile of the preset (kernels a step before the norms fix: 2,961 in part 1), unless NO_PROFILE
    [ -n "${NO_PROFILE:-}" ] || timeout "$(left ${PROFILE_END:-560})" python3 -m brisk profile configs/bench_prompt.yaml model.path=/tmp/nano \
        data.train=$WD/train.jsonl speed.preset=fast speed.pack_buckets=[1280,1536,1792,2048,2304,2560] \
        --out /tmp/profile14b > /tmp/keep/profile_b.log 2>&1 || echo "profile exited with $?"
    cp /tmp/profile14b/profile.md "$OUT/profile_static_flex_after.md" 2>/dev/null
    head -n 6 "$OUT/profile_static_flex_after.md"
else
    timeout 120 python3 tools/make_nano_folder.py --out /tmp/nano > /tmp/keep/make_nano.log 2>&1
    n=0
    for arm in preset static seen; do
        n=$((n + 1))
        case $arm in
            # as run at 73e19bb, before the preset took static layers + flex + seen (round 13's preset named)
            preset) S="speed.compile_dynamic=true speed.flex_attention=false speed.graph_capture=ahead";;
            static) S="$STATIC speed.graph_capture=ahead";;
            seen) S="$STATIC speed.graph_capture=seen";;
        esac
        timeout "$(left $((40 + n * 180)))" python3 bench/whole_run.py --speed preset --model /tmp/nano --data $WD \
            --out /tmp/wr_$arm --work /tmp/wr_${arm}_work --timeout 150 $S > /tmp/keep/whole_run_$arm.log 2>&1 \
            || echo "whole run $arm exited with $?"
        cp /tmp/wr_$arm/whole_run.md "$OUT/whole_run_$arm.md" 2>/dev/null
        cp /tmp/wr_$arm/whole_run_logs.tgz /tmp/keep/whole_run_logs_$arm.tgz 2>/dev/null
        grep -h "whole_run: .*: rc" /tmp/keep/whole_run_$arm.log | sed "s/^/$arm /"
        grep -c "capturing a graph for bucket" /tmp/wr_${arm}_work/*.out 2>/dev/null | sed "s/^/$arm captures mid-run: /"
    done
fi
tar czf "$OUT/keep.tgz" -C /tmp keep 2>/dev/null
echo "== elapsed $(( $(date +%s) - T0 )) s"
