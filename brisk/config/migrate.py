"""Older configs and run folders: keys that moved to a family's section, and the old ``task:`` word."""

from __future__ import annotations

import dataclasses
import logging

from .. import families
from ..errors import ConfigError
from ..formats.brisk_keys import MOVED_KEYS, OLD_TASK_WORDS
from .tree import Config


def read_moved(tree: dict, where) -> dict:
    """``tree`` with each MOVED_KEYS key of an older config read as its new key. A value goes into the run's
    family's own section when that section has the key (the family that owns it, or one that extends its section
    to borrow its parts), with one line in the log; an unset one (every run folder an older brisk saved holds them
    all) or one for a family that never read it is dropped."""
    family = families.get((tree.get("model") or {}).get("family") or families.DEFAULT)
    own = {f.name for f in dataclasses.fields(family.config)} if family.config is not None else set()
    for old, new in MOVED_KEYS.items():
        section, key = old.split(".")
        if key not in (tree.get(section) or {}):
            continue
        value = tree[section][key]
        tree = {**tree, section: {k: v for k, v in tree[section].items() if k != key}}
        new_key = new.split(".")[1]
        if value is None or new_key not in own:
            continue
        logging.getLogger("brisk").warning("config: %s: %s is now %s.%s (read as that; write the new key)", where, old,
                                           family.name, new_key)
        tree = {**tree, family.name: {new_key: value, **(tree.get(family.name) or {})}}
    return tree


def shadowed(base: dict, tree: dict) -> dict:
    """``base`` (an included file) without the family-section keys whose old names ``tree`` (the including file)
    gives, so that an older file's own value still wins over its base's once merged (read_moved then moves it)."""
    shared = {f.name for f in dataclasses.fields(Config)}
    gone = {new.split(".")[1] for old, new in MOVED_KEYS.items()
            if old.split(".")[1] in (tree.get(old.split(".")[0]) or {})}
    if not gone:
        return base
    return {k: ({kk: vv for kk, vv in v.items() if kk not in gone} if k not in shared and isinstance(v, dict) else v)
            for k, v in base.items()}


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


