"""`brisk train --help-config`: every config key with its type, default and one-line meaning.

The meaning is the comment on the key's line in brisk/config.py (read from the source, so there is one
place to write it); a section's meaning is its class docstring. A model family's own section (``Family.config``)
follows, its meanings from each field's ``metadata["help"]``.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import typing
from functools import lru_cache

from . import config as C


@lru_cache(maxsize=None)
def field_comments(cls) -> dict[str, str]:
    """{field: comment} from the ``name: type = default  # comment`` lines of a dataclass's source, with the
    comment-only lines aligned under it (``    #      more words``) joined on."""
    out, last = {}, None
    for line in inspect.getsource(cls).splitlines():
        m = re.match(r"^    (\w+): .*?=.*?  # (.*)$", line)
        if m:
            last = m.group(1)
            out[last] = m.group(2).strip()
            continue
        more = re.match(r"^    #\s{2,}(.*)$", line)  # aligned under the comment above, not a comment of its own
        if more and last is not None:
            out[last] += " " + more.group(1).strip()
        else:
            last = None
    return out


def _type(tp) -> str:
    text = str(tp).replace("typing.", "").replace("<class '", "").replace("'>", "").replace("brisk.config.", "")
    return re.sub(r"\bNoneType\b", "None", text)


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


def rows(cls=C.Config, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(key, type, default, meaning) for every leaf key, in declaration order, a section's own keys before its
    subsections' (so each section is printed once)."""
    out, nested = [], []
    hints = typing.get_type_hints(cls)
    comments = field_comments(cls)
    for f in dataclasses.fields(cls):
        if f.metadata.get("internal"):
            continue
        key = f"{prefix}{f.name}"
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            nested += rows(tp, key + ".")
            continue
        meaning = f.metadata.get("help") or comments.get(f.name, "")
        if f.name == "config" and tp is dict:
            meaning += " (keys of the transformers config class of model_type, e.g. hidden_size)"
        out.append((key, _type(tp), _show(_default(f)), meaning))
    return out + nested


def sections(cls=C.Config, prefix: str = "") -> list[tuple[str, str]]:
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
    from . import families

    return [row for f in families.all_families() if f.config is not None for row in rows(f.config, f.name + ".")]


def help_text() -> str:
    from . import families

    docs = dict(sections())
    docs.update({f.name: f"model.family={f.name} only: {f.summary}" for f in families.all_families()})
    lines = ["Every config key: type, default, meaning. Set keys in a YAML file or as key=value after it,",
             "e.g. brisk train demo train.max_epochs=3 optim.lr=1e-3 (a shipped config by name: demo, fun_asr_nano, ...; or a file)"]
    every = rows() + family_rows()
    width = max(len(k) for k, *_ in every)
    section = None
    for key, tp, default, meaning in every:
        sec = key.rsplit(".", 1)[0] if "." in key else "top level"
        if sec != section:
            section = sec
            lines += ["", f"[{sec}]" + (f"  {docs[sec]}" if docs.get(sec) else "")]
        lines.append(f"  {key:<{width}}  {tp:<18} {default:<14} {meaning}")
    return "\n".join(lines).lstrip("\n") + "\n"


