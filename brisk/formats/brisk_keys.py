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

# What older brisk versions wrote. The top-level `task:` word of older configs and brisk.json files -> the
# model.family it meant.
OLD_TASK_WORDS = {"speech": "fun_asr_nano", "chat": "causal_lm"}
# Keys that moved into a family's own section: old dotted key -> new one (brisk.config.migrate reads configs
# with it, read_keys_file below brisk.json files).
MOVED_KEYS = {"data.language": "qwen3_asr.language", "data.max_len": "causal_lm.max_len",
              "data.overlong": "causal_lm.overlong", "data.chat_template": "causal_lm.chat_template"}
# The files a brisk.json without a "files" entry names (an older brisk's).
OLD_FILE_KEYS = ("model.frontend.cmvn_file", "data.chat_template")


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
    for old, new in MOVED_KEYS.items():
        if old in keys:
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
