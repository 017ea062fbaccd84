"""Older configs and run folders: keys that moved to a family's section, and the old ``task:`` word."""

from __future__ import annotations

import logging

from .. import families
from ..errors import ConfigError
from ..formats.brisk_keys import MOVED_KEYS, OLD_TASK_WORDS


def read_moved(tree: dict, where) -> dict:
    """``tree`` with each MOVED_KEYS key of an older config read as its new key: a value given for the family
    that now owns the key goes into its section (one line in the log); an unset one (every run folder an older
    brisk saved holds them all) or one for another family, which never read it, is dropped."""
    for old, new in MOVED_KEYS.items():
        section, key = old.split(".")
        if key not in (tree.get(section) or {}):
            continue
        value = tree[section][key]
        tree = {**tree, section: {k: v for k, v in tree[section].items() if k != key}}
        owner, new_key = new.split(".")
        if value is None or ((tree.get("model") or {}).get("family") or families.DEFAULT) != owner:
            continue
        logging.getLogger("brisk").info("config: %s: %s is now %s (read as that)", where, old, new)
        tree = {**tree, owner: {new_key: value, **(tree.get(owner) or {})}}
    return tree


def without_task(tree: dict, where) -> dict:
    """The old top-level ``task:`` is no longer read. A run folder saved by an older brisk holds it beside its
    model.family, which says the same: it is dropped. Alone, or naming another family, it is one line."""
    if "task" not in tree:
        return tree
    word = tree["task"]
    meant = OLD_TASK_WORDS.get(word)
    if meant is not None and (tree.get("model") or {}).get("family") == meant:
        return {k: v for k, v in tree.items() if k != "task"}
    instead = f"model.family: {meant}" if meant else f"model.family (one of {', '.join(families.names())})"
    shipped = {"causal_lm": "; its shipped configs start at sft_demo", "fun_asr_nano": "; its demo config is demo"}
    raise ConfigError(f"{where}: task: {word} is no longer read; write {instead} instead{shipped.get(meant, '')}")


