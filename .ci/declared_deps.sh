#!/usr/bin/env bash
# brisk installed with its declared dependencies alone (no test extras, no FunASR, no peft/trl/accelerate pulled in by
# them): each model family's demo trains a few steps, exports, and its export loads back and trains again. Then the
# same on the floor of transformers that pyproject.toml names (5.17). Run from the repo root:
#   bash .ci/declared_deps.sh [venv folder]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.ci-venv-deps}
T0=$(date +%s)
python3 -m venv "$VENV"
. "$VENV/bin/activate"
python -m pip install -q --upgrade pip
pip install -q torch==2.13.0 .   # not editable: what a user's `pip install` gets, package data included
W=$(mktemp -d)
cd "$W"  # away from the checkout: the installed package, its shipped configs and data, nothing else
echo "declared deps: $(python -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)')"
for pkg in peft trl accelerate funasr datasets; do
    python -c "import $pkg" 2>/dev/null && { echo "declared deps: $pkg is installed, the check would not be bare"; exit 1; }
done
common="train.max_steps=2 data.valid=null train.val_decode=0 train.progress=false train.tensorboard=false"
family() {  # name config export reload-key
    brisk train "$2" $common data.train=data/demo/valid.jsonl train.export="$3" train.output_dir="$W/$1" > "$W/$1.log" 2>&1 \
        || { tail -n 30 "$W/$1.log"; echo "declared deps: $1 demo failed"; exit 1; }
    brisk train "$2" $common data.train=data/demo/valid.jsonl train.export=none "$4=$W/$1/model-$3" \
        train.output_dir="$W/$1-reload" > "$W/$1-reload.log" 2>&1 \
        || { tail -n 30 "$W/$1-reload.log"; echo "declared deps: $1 reload of its $3 export failed"; exit 1; }
    echo "declared deps: $1: demo, $3 export and its reload ran"
}
chat() {
    brisk train sft_demo $common train.export=hf train.output_dir="$W/chat" > "$W/chat.log" 2>&1 \
        || { tail -n 30 "$W/chat.log"; echo "declared deps: chat demo failed"; exit 1; }
    brisk train sft_demo $common train.export=none model.llm.path="$W/chat/model-hf" train.output_dir="$W/chat-reload" \
        > "$W/chat-reload.log" 2>&1 || { tail -n 30 "$W/chat-reload.log"; echo "declared deps: chat reload failed"; exit 1; }
    echo "declared deps: chat: demo, hf export and its reload ran"
}
family speech demo funasr model.path
family asr qwen3_asr_demo hf model.llm.path
chat
rm -rf "$W"/speech* "$W"/asr* "$W"/chat*
# The floor of transformers pyproject.toml names.
pip install -q "transformers==5.17.0"
echo "floor: $(python -c 'import transformers; print("transformers", transformers.__version__)')"
family speech demo funasr model.path
family asr qwen3_asr_demo hf model.llm.path
chat
rm -rf "$W"
echo "declared deps and floor: 3 families, their exports and reloads, in $(( $(date +%s) - T0 )) s"
