"""`brisk train --help-config`: every config key with its type, default and one-line meaning.

A key's meaning is its field's ``metadata["help"]`` (``brisk.keys.key``); a section's meaning is its class
docstring. A model family's own section (``Family.config``) follows, declared the same way.
"""

from __future__ import annotations

import dataclasses
import re
import typing

from .load import get_dotted
from .tree import Config


def _type(tp) -> str:
    text = str(tp).replace("typing.", "").replace("<class '", "").replace("'>", "")
    return re.sub(r"\bNoneType\b", "None", re.sub(r"brisk\.config\.\w+\.", "", text))


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _show(v) -> str:
    if v is None:
        return "none"
    if v == "":
        return '""'
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, list) and v and dataclasses.is_dataclass(v[0]):
        return "[...]"
    return str(v)


def rows(cls=Config, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(key, type, default, meaning) for every leaf key, in declaration order, a section's own keys before its
    subsections' (so each section is printed once)."""
    out, nested = [], []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.metadata.get("internal"):
            continue
        key = f"{prefix}{f.name}"
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            nested += rows(tp, key + ".")
            continue
        meaning = f.metadata.get("help", "")
        if f.name == "config" and tp is dict:
            meaning += " (keys of the transformers config class of model_type, e.g. hidden_size)"
        out.append((key, _type(tp), _show(_default(f)), meaning))
    return out + nested


def sections(cls=Config, prefix: str = "") -> list[tuple[str, str]]:
    out = []
    for f in dataclasses.fields(cls):
        tp = typing.get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(tp) and not f.metadata.get("internal"):
            doc = (" ".join(tp.__doc__.strip().split("\n\n")[0].split())
                   if tp.__doc__ and not tp.__doc__.startswith(tp.__name__ + "(") else "")
            out.append((prefix + f.name, doc))
            out += sections(tp, prefix + f.name + ".")
    return out


def family_rows() -> list[tuple[str, str, str, str]]:
    """Each registered family's own keys (its ``config`` section), after the shared ones."""
    from .. import families

    return [row for f in families.all_families() if f.config is not None for row in rows(f.config, f.name + ".")]


def help_text(cfg: Config | None = None, name: str = "") -> str:
    """The table of every key; with a run's ``cfg`` (`brisk train CONFIG --help-config`) the value column is that
    config's, a value other than the default marked with *."""
    from .. import families

    docs = dict(sections())
    for f in families.all_families():
        docs[f.name] = f"model.family={f.name} only: {f.summary}"
        if f.config is not None:  # its sub-sections (fun_asr_nano.frontend, ...) with their own descriptions
            docs.update({k: f"model.family={f.name} only: {d}" for k, d in sections(f.config, f.name + ".")})
    tree = cfg.to_dict() if cfg is not None else None
    own = {f.name for f in families.all_families()}
    lines = ["Every config key: type, default, meaning. Set keys in a YAML file or as key=value after it,",
             "e.g. brisk train demo train.max_epochs=3 optim.lr=1e-3 (a shipped config by name: demo, fun_asr_nano, ...; or a file)"]
    if tree is not None:
        lines = [f"Every config key: type, its value in {name} (* where it is not the default), meaning.",
                 "`brisk train --help-config` without a config lists the defaults."]
    every = rows() + family_rows()
    width = max(len(k) for k, *_ in every)
    section = None
    for key, tp, default, meaning in every:
        value = default
        if tree is not None:
            if key.split(".")[0] in own and key.split(".")[0] not in tree:
                continue  # another family's own section: this config cannot set it
            now = _show(get_dotted(tree, key))
            value = now if now == default else now + " *"
        sec = key.rsplit(".", 1)[0] if "." in key else "top level"
        if sec != section:
            section = sec
            lines += ["", f"[{sec}]" + (f"  {docs[sec]}" if docs.get(sec) else "")]
        if len(value) > 14:  # a long list: the meaning on the next line, in its column
            lines += [f"  {key:<{width}}  {tp:<18} {value}", f"  {'':<{width}}  {'':<18} {'':<14} {meaning}"]
        else:
            lines.append(f"  {key:<{width}}  {tp:<18} {value:<14} {meaning}")
    return "\n".join(lines).lstrip("\n") + "\n"

