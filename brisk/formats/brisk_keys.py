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

# What older brisk versions wrote. The top-level `task:` word of older configs and brisk.json files -> the
# model.family it meant.
OLD_TASK_WORDS = {"speech": "fun_asr_nano", "chat": "causal_lm"}
# Keys that moved into a family's own section: old dotted key -> new one; a key under an old section that moved
# whole moves with it (``moved``). brisk.config.migrate reads configs with it, read_keys_file below brisk.json
# files. Fun-ASR-Nano's sizes and front end left the model section; whether its encoder and adaptor train
# (model.encoder.freeze, model.adaptor.freeze, model.encoder.activation_checkpoint) stayed, shared with Qwen3-ASR.
_SANM_KEYS = ("output_size", "attention_heads", "linear_units", "num_blocks", "tp_blocks", "kernel_size",
              "sanm_shift", "dropout_rate", "attention_dropout_rate")
_ADAPTOR_KEYS = ("downsample_rate", "ffn_dim", "n_layer", "attention_heads", "dropout_rate", "use_low_frame_rate")
MOVED_KEYS = {"data.language": "qwen3_asr.language", "data.max_len": "causal_lm.max_len",
              "data.overlong": "causal_lm.overlong", "data.chat_template": "causal_lm.chat_template",
              "model.frontend": "fun_asr_nano.frontend", "model.ctc": "fun_asr_nano.ctc",
              **{f"model.encoder.{k}": f"fun_asr_nano.encoder.{k}" for k in _SANM_KEYS},
              **{f"model.adaptor.{k}": f"fun_asr_nano.adaptor.{k}" for k in _ADAPTOR_KEYS}}
# The files a brisk.json without a "files" entry names (an older brisk's).
OLD_FILE_KEYS = ("model.frontend.cmvn_file", "data.chat_template")


def moved(key: str) -> str | None:
    """The new name of an older dotted key (one that moved, or one under a section that moved whole), or None."""
    for old, new in MOVED_KEYS.items():
        if key == old or key.startswith(old + "."):
            return new + key[len(old):]
    return None


def old_names(key: str) -> list[str]:
    """The older names of a dotted key (``moved``'s inverse)."""
    return [old + key[len(new):] for old, new in MOVED_KEYS.items() if key == new or key.startswith(new + ".")]


def _get(tree: dict, key: str):
    node = tree
    for part in key.split("."):
        node = node[part]
    return node


def inference_keys(cfg_tree: dict, family: str, declared: dict[str, str | None]) -> dict:
    """brisk.json's content for a run's config (a dict): {"family", "keys": {dotted key: value}, "files": [keys
    naming a file]}. ``declared`` is {key: None, or the file's name in the export folder} for the keys that change
    what the model computes (brisk.config.roles.exported_keys); those of sections the run lacks (another family's)
    are left out, and files are named by their name in the folder (the caller copies them there)."""
    keys, files = {}, []
    for key, name in declared.items():
        try:
            value = _get(cfg_tree, key)
        except (KeyError, TypeError):
            continue
        if name is not None and value:
            value = name
            files.append(key)
        keys[key] = value
    return {"family": family, "keys": keys, "files": files}


def read_keys_file(folder: str | Path) -> dict | None:
    """The folder's brisk.json (files resolved against the folder), or None when it has none. Keys an older brisk
    wrote under their old names are read under their new ones (dropped where another family owns them)."""
    folder = Path(folder)
    f = folder / KEYS_FILE
    if not f.is_file():
        return None
    raw = json.loads(f.read_text(encoding="utf-8"))
    family = raw.get("family") or OLD_TASK_WORDS.get(raw.get("task")) or "fun_asr_nano"
    keys = dict(raw.get("keys") or {})
    for key in raw.get("files", OLD_FILE_KEYS):
        if keys.get(key):
            keys[key] = str(folder / keys[key])
    for old in list(keys):
        new = moved(old)
        if new is not None:
            value = keys.pop(old)
            if new.split(".")[0] == family:
                keys.setdefault(new, value)
    return {"family": family, "keys": keys}


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
