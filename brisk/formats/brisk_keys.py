"""``brisk.json`` in an exported model folder: the settings that change what the model computes and that the
folder's own format has no place for (the chat template training labelled with, the LLM's compute dtype,
FunASR's front end in a transformers folder, the prompt keys). Written by brisk.models.export, read back
when the folder is loaded (``model.path=FOLDER``, ``brisk eval FOLDER``), so an export computes as its run did.
Files travel inside the folder and are named relative to it, never as a path back to the training machine.
"""

from __future__ import annotations

import json
from pathlib import Path

KEYS_FILE = "brisk.json"
CMVN_NAME = "am.mvn"  # FunASR's own name for the CMVN file in a model folder
TEMPLATE_NAME = "chat_template_training.jinja"

# Dotted keys that change what a trained model computes at inference (front end, prompt, template, dtype).
INFERENCE_KEYS = (
    "model.frontend.fs", "model.frontend.n_mels", "model.frontend.frame_length", "model.frontend.frame_shift",
    "model.frontend.window", "model.frontend.lfr_m", "model.frontend.lfr_n", "model.frontend.dither",
    "model.frontend.cmvn_file", "model.frontend.upscale_samples", "model.adaptor.use_low_frame_rate",
    "model.llm.dtype", "data.sys_prompt", "data.do_think", "data.multiturn_max", "data.max_token_length",
    "data.prompt_class", "data.prompt_conf", "data.max_len", "data.overlong", "data.chat_template",
)
# The top-level `task:` word of older configs and brisk.json files -> the model.family it meant.
OLD_TASK_WORDS = {"speech": "fun_asr_nano", "chat": "causal_lm"}
# Keys naming a file the export copies into the folder under this name.
FILE_KEYS = {"model.frontend.cmvn_file": CMVN_NAME, "data.chat_template": TEMPLATE_NAME}


def _get(tree: dict, key: str):
    node = tree
    for part in key.split("."):
        node = node[part]
    return node


def inference_keys(cfg_tree: dict, family: str) -> dict:
    """{"family": model.family, "keys": {dotted key: value}} for a run's config (a dict): files renamed to their name in
    the export folder (the caller copies them there)."""
    keys = {}
    for key in INFERENCE_KEYS:
        value = _get(cfg_tree, key)
        if key in FILE_KEYS and value:
            value = FILE_KEYS[key]
        keys[key] = value
    return {"family": family, "keys": keys}


def read_keys_file(folder: str | Path) -> dict | None:
    """The folder's brisk.json (files resolved against the folder), or None when it has none."""
    folder = Path(folder)
    f = folder / KEYS_FILE
    if not f.is_file():
        return None
    raw = json.loads(f.read_text(encoding="utf-8"))
    keys = dict(raw.get("keys") or {})
    for key in FILE_KEYS:
        if keys.get(key):
            keys[key] = str(folder / keys[key])
    old = OLD_TASK_WORDS.get(raw.get("task"))  # brisk.json of an older brisk
    return {"family": raw.get("family") or old or "fun_asr_nano", "keys": keys}


def keys_tree(keys: dict) -> dict:
    """Dotted keys -> a nested config tree."""
    out: dict = {}
    for key, value in keys.items():
        node = out
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return out
