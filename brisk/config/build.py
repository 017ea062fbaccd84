"""A config tree (nested dicts from YAML and overrides) into the typed Config: values coerced to each key's type,
unknown keys named with a suggestion, the family's own section built from its dataclass."""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any

import yaml

from .. import families
from ..errors import ConfigError
from ..formats.brisk_keys import moved
from .migrate import owns, without_task
from .roles import declared
from .tree import Config


def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def optional_keys(cls: Any = None, prefix: str = "") -> list[str]:
    """Dotted keys whose type admits None (--help-config prints their unset default as none)."""
    out = []
    for name, tp in typing.get_type_hints(cls or Config).items():
        key = f"{prefix}.{name}" if prefix else name
        if dataclasses.is_dataclass(tp):
            out += optional_keys(tp, key)
        elif typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp):
            out.append(key)
    return out


def _nulls(tree: dict) -> None:
    """`none` (as --help-config prints an unset default) -> null, for every key that may be null; before the
    paths are resolved, so data.valid=none is no file named none."""
    for key in optional_keys():
        node, parts = tree, key.split(".")
        for p in parts[:-1]:
            node = node.get(p) if isinstance(node, dict) else None
        if isinstance(node, dict) and _none_word(node.get(parts[-1])):
            node[parts[-1]] = None


def _none_word(value: Any) -> bool:
    return isinstance(value, str) and value.strip().lower() == "none"


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check (and gently convert) ``value`` against the annotation ``tp``; raise naming ``key``."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if (value is None or _none_word(value)) and type(None) in args:
            return None  # `none`, as --help-config prints an unset default, means null
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{key}: got {value!r}")
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping of {tp.__name__} keys, got {value!r}")
        return build(tp, value, key)
    if origin is list:
        (item,) = typing.get_args(tp)
        if isinstance(value, (tuple, list)):
            return [_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
        raise ConfigError(f"{key}: expected a list, got {value!r} (write it as [a, b, c])")
    if tp is dict or origin is dict:
        if isinstance(value, dict):
            return dict(value)
        raise ConfigError(f"{key}: expected a mapping, got {value!r}")
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads 1e-3 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    if tp is Any:
        return value
    raise ConfigError(f"{key}: unsupported type {_type_name(tp)}")


def build(cls, data: dict, prefix: str = ""):
    """Build dataclass ``cls`` from a dict, refusing unknown keys."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        where = f"{prefix}." if prefix else ""
        raise ConfigError(
            f"unknown config key {where}{unknown[0]}; valid keys under {prefix or 'the top level'}: {', '.join(sorted(names))}"
        )
    kwargs = {}
    for name, value in data.items():
        key = f"{prefix}.{name}" if prefix else name
        kwargs[name] = _coerce(value, hints[name], key)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except TypeError as e:  # pragma: no cover - dataclass signature errors
        raise ConfigError(f"{prefix}: {e}") from e


def _known_path(key: str) -> bool:
    """Is ``key`` (dotted) a valid leaf or node of Config? Free-form dicts accept any sub-key."""
    cls: Any = Config
    parts = key.split(".")
    if parts[0] == "sections":
        return False
    own = _family_sections()
    if parts[0] in own:
        cls, parts = own[parts[0]], parts[1:]
    for i, part in enumerate(parts):
        if not dataclasses.is_dataclass(cls):
            return False
        hints = typing.get_type_hints(cls)
        if part not in hints:
            return False
        tp = hints[part]
        if tp is dict:
            return True  # e.g. model.llm.config.hidden_size
        cls = tp
    return True


def _family_sections() -> dict[str, type]:
    """{family name: its config dataclass} of every registered family that has keys of its own."""
    return {f.name: f.config for f in families.all_families() if f.config is not None}


def build_config(tree: dict) -> Config:
    """A Config from a merged tree: the shared sections, then the run's family's own (``Config.sections``)."""
    rest, sections = _with_sections(tree)
    cfg = build(Config, rest)
    cfg.sections = sections
    return cfg


def _with_sections(tree: dict) -> tuple[dict, dict]:
    """The tree without the family sections, and those sections built: only the run's family's may be given."""
    own = _family_sections()
    given = {k: tree[k] for k in tree if k in own}
    rest = {k: v for k, v in tree.items() if k not in own}
    family = families.get((rest.get("model") or {}).get("family") or families.DEFAULT).name
    for name in given:
        if name != family:
            raise ConfigError(f"{name}: the config section of model.family={name}, but model.family is {family}; "
                              f"leave out the {name} section (its keys are that family's) or set model.family={name}")
    built = {}
    if family in own:
        data = given.get(family) or {}
        if not isinstance(data, dict):
            keys = ", ".join(f.name for f in dataclasses.fields(own[family]))
            raise ConfigError(f"{family}: give a mapping of its keys ({keys})")
        built[family] = build(own[family], data, prefix=family)
    return rest, built


def leaf_keys() -> list[str]:
    """Every dotted leaf key of the config tree (a free-form mapping is one leaf), the families' own sections
    included."""
    return [key for key, _ in declared()]


def did_you_mean(key: str) -> str:
    """' (did you mean x.y?)' for a misspelt dotted key, or ''."""
    close = difflib.get_close_matches(key, leaf_keys(), n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""


def _set_dotted(tree: dict, key: str, value: Any) -> None:
    node = tree
    parts = key.split(".")
    for p in parts[:-1]:
        if not isinstance(node.get(p), dict):
            node[p] = {}
        node = node[p]
    node[parts[-1]] = value


def parse_override(text: str, family: str | None = None) -> tuple[str, Any]:
    """``key=value`` -> (key, the value as YAML). ``family``: the run's model family, when known, for the line
    an older key name gets."""
    if "=" not in text:
        if text.strip().endswith((".yaml", ".yml")):
            raise ConfigError(f"{text}: one config file a run; put the keys of both in one file (a file may start "
                              "with `include: other.yaml`) or give them as key=value")
        if _known_path(text.strip()):
            raise ConfigError(f"{text} has no value: did you mean key=value, for example {text.strip()}=VALUE?")
        raise ConfigError(f"override {text!r} is not key=value: did you mean key=value (for example train.max_steps=100)?")
    key, raw = text.split("=", 1)
    key = key.strip().lstrip("+")
    if key == "task":
        without_task({"task": raw.strip()}, f"override {text!r}")
    new = moved(key)
    if new is not None:
        if family is not None and not owns(family, new):
            raise ConfigError(f"override {text!r}: {key} is now {new}, a key of model.family={new.split('.')[0]}; "
                              f"model.family={family} has no such key: leave it out")
        raise ConfigError(f"override {text!r}: {key} is now {new}; give {new}={raw.strip()}")
    if not _known_path(key):
        parent = key.rsplit(".", 1)[0] if "." in key else ""
        raise ConfigError(f"unknown config key {key} (from override {text!r}){did_you_mean(key)}; "
                          "`brisk train --help-config` lists every key"
                          + (f" (those under {parent} too)" if parent and _known_path(parent) else ""))
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as e:
        raise ConfigError(f"override {text!r}: the value is not valid YAML ({getattr(e, 'problem', None) or e}); "
                          "quote it: key='value'") from None
    return key, value


