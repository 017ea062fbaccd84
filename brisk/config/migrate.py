"""Older configs and run folders: keys that moved to a family's section, and the old ``task:`` word."""

from __future__ import annotations

import dataclasses
import logging
import typing

from .. import families
from ..errors import ConfigError
from ..formats.brisk_keys import MOVED_KEYS, OLD_TASK_WORDS
from .tree import Config

_ABSENT = object()


def read_moved(tree: dict, where, say: bool = True) -> dict:
    """``tree`` with each MOVED_KEYS key (or section) of an older config read as its new key. A value goes into the
    run's family's own section when that section has the key (the family that owns it, or one that extends its
    section to borrow its parts), with one line in the log; an unset one (every run folder an older brisk saved
    holds them all) or one for a family that never read it is dropped. ``say``: the log line (once a file)."""
    family = families.get((tree.get("model") or {}).get("family") or families.DEFAULT)
    read = []
    for old, new in MOVED_KEYS.items():
        value, tree = _popped(tree, old.split("."))
        if value is _ABSENT:
            continue
        path = new.split(".")[1:]
        if value is None or value == {} or family.config is None or not _declares(family.config, path):
            continue
        read.append((old, f"{family.name}.{'.'.join(path)}"))
        section = tree.get(family.name) or {}
        tree = {**tree, family.name: _merged_under(section, path, value)}
    if read and say:
        logging.getLogger("brisk").warning("config: %s: %s (read as that; write the new keys)", where, _named(read))
    return tree


def _named(read: list[tuple[str, str]]) -> str:
    """'a.b.{x, y} are now under c.b; ...': the moves of one section to one other, in one clause."""
    groups: dict[tuple[str, str], list[str]] = {}
    for old, new in read:
        (a, leaf), (b, leaf_new) = old.rsplit(".", 1), new.rsplit(".", 1)
        groups.setdefault((a, b) if leaf == leaf_new else (old, new), []).append(leaf if leaf == leaf_new else "")
    out = []
    for (a, b), leaves in groups.items():
        if len(leaves) > 1:
            out.append(f"{a}.{{{', '.join(leaves)}}} are now under {b}")
        else:
            out.append(f"{a}.{leaves[0]} is now {b}.{leaves[0]}" if leaves[0] else f"{a} is now {b}")
    return "; ".join(out)


def owns(family: str, key: str) -> bool:
    """Does the family's own section declare ``key`` (``<section>.<path>``, the section its owner's name; a family
    that extends another's section owns its keys too)?"""
    fam = families.get(family)
    return fam.config is not None and _declares(fam.config, key.split(".")[1:])


def shadowed(base: dict, tree: dict) -> dict:
    """``base`` (an included file) without the family-section keys whose old names ``tree`` (the including file)
    gives, so that an older file's own value still wins over its base's once merged (read_moved then moves it)."""
    shared = {f.name for f in dataclasses.fields(Config)}
    for old, new in MOVED_KEYS.items():
        value = _popped(tree, old.split("."))[0]
        if value is _ABSENT:
            continue
        # a section that moved whole (model.frontend): only the keys the older file gives, the base keeps the rest
        paths = [new.split(".")[1:] + leaf for leaf in _leaves(value)]
        for section in [k for k, v in base.items() if k not in shared and isinstance(v, dict)]:
            for path in paths:
                base = {**base, section: _popped(base[section], path)[1]}
    return base


def _leaves(value) -> list[list[str]]:
    """The key paths under a value: [[]] for a plain value, [["a"], ["b", "c"]] for {a: 1, b: {c: 2}}."""
    if not isinstance(value, dict) or not value:
        return [[]]
    return [[k] + rest for k, v in value.items() for rest in _leaves(v)]


def _popped(tree: dict, path: list[str]) -> tuple:
    """(the value at ``path`` or _ABSENT, ``tree`` without it); ``tree`` itself is left as it was."""
    head, rest = path[0], path[1:]
    if not isinstance(tree, dict) or head not in tree:
        return _ABSENT, tree
    if not rest:
        return tree[head], {k: v for k, v in tree.items() if k != head}
    value, inner = _popped(tree[head], rest)
    return value, tree if value is _ABSENT else {**tree, head: inner}


def _declares(cls, path: list[str]) -> bool:
    """Does the dataclass ``cls`` have the (nested) key ``path``?"""
    for part in path:
        if not dataclasses.is_dataclass(cls) or part not in {f.name for f in dataclasses.fields(cls)}:
            return False
        cls = typing.get_type_hints(cls)[part]
    return True


def _merged_under(section: dict, path: list[str], value) -> dict:
    """``section`` with ``value`` at ``path``; what ``section`` already gives there wins (the new name over the old)."""
    head, rest = path[0], path[1:]
    have = section.get(head, _ABSENT)
    if rest:
        inner = _merged_under(have if isinstance(have, dict) else {}, rest, value)
    elif isinstance(value, dict) and isinstance(have, dict):
        inner = {**value, **have}
    else:
        inner = value if have is _ABSENT else have
    return {**section, head: inner}


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
