"""Reading a config: YAML files (with ``include:``), key=value overrides, a model folder's own settings, paths
resolved and checked; the shipped configs and data; saving a run's config and telling two apart."""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Any

import yaml

from .. import families
from ..errors import ConfigError
from ..formats.brisk_keys import keys_tree, read_keys_file
from ..formats.funasr import FAMILY, funasr_folder_config, funasr_folder_data_config
from ..formats.hf import hf_folder_model_config, is_hf_folder
from ..plan import check_rules, expand_preset
from .build import _known_path, _none_word, _nulls, _set_dotted, build_config, did_you_mean, parse_override
from .migrate import read_moved, shadowed, without_task
from .roles import path_keys
from .tree import Config

# Run folders are where the user is, not where the config file is: a relative train.output_dir, in a YAML
# file too, is taken from the current folder (so two checkouts or two shells never share a run folder). Every
# other path key (declared with key(path=...), brisk.config.roles) is resolved against the folder of the YAML
# file it appears in.
CWD_KEYS = {"train.output_dir"}


def yaml_error(e: yaml.YAMLError) -> str:
    """':line:column: not valid YAML: what PyYAML found' (one line; PyYAML's own message takes eight)."""
    mark = getattr(e, "problem_mark", None)
    where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
    what = " ".join(x for x in (getattr(e, "problem", None), getattr(e, "context", None)) if x) or str(e).splitlines()[0]
    return f"{where}: not valid YAML: {what}"


def _resolve_paths(tree: dict, base: Path, keys: set[str]) -> None:
    for key in keys:
        node = tree
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.get(p) if isinstance(node, dict) else None
            if node is None:
                break
        if isinstance(node, dict) and isinstance(node.get(parts[-1]), str) and not _none_word(node[parts[-1]]):
            p = Path(node[parts[-1]]).expanduser()
            full = p if p.is_absolute() else (base / p).resolve()
            if not full.exists() and not p.is_absolute():  # data/demo/... as the docs write it: the shipped set
                full = shipped_data(p) or full
            node[parts[-1]] = str(full)


def _flatten(tree: dict, prefix: str = "") -> set[str]:
    out = set()
    for k, v in tree.items():
        key = f"{prefix}.{k}" if prefix else k
        out.add(key)
        if isinstance(v, dict):
            out |= _flatten(v, key)
    return out


SHIPPED = Path(__file__).resolve().parent.parent / "configs"  # the configs/ of the repository, shipped in the package


def shipped_config(name: str) -> Path | None:
    """A config shipped with brisk, by name (``fun_asr_nano`` or ``fun_asr_nano.yaml``); None if there is none."""
    if "/" in name or "\\" in name:
        return None
    path = SHIPPED / (name if name.endswith((".yaml", ".yml")) else f"{name}.yaml")
    return path if path.is_file() else None


BUNDLED = Path(__file__).resolve().parent.parent / "bundled"  # the repository's data/: the demo sets, shipped too


def shipped_data(path: str | Path) -> Path | None:
    """``data/demo/...`` or ``data/chat_demo/...`` (as the docs write them) -> the file shipped with brisk, when the
    path names one; None otherwise. Used only where the path does not exist as given, so a user's own data/
    always wins."""
    parts = Path(path).parts
    if len(parts) < 2 or parts[0] != "data":
        return None
    found = BUNDLED.joinpath(*parts[1:])
    return found if found.exists() else None


def data_path(path: str) -> str:
    """A data file named on the command line: as given if it exists, else the shipped file of that name."""
    if Path(path).exists():
        return path
    found = shipped_data(path)
    return str(found) if found is not None else path


def shipped_names() -> list[str]:
    return sorted(p.stem for p in SHIPPED.glob("*.yaml"))


def read_yaml(path: Path, _seen: tuple = ()) -> dict:
    """A config file as a dict, its paths resolved; ``include: other.yaml`` pulls in a base file first."""
    if not path.is_file():
        if not _seen and path.parent == Path(".") and path.suffix in ("", ".yaml", ".yml"):  # maybe a shipped name
            import difflib

            close = difflib.get_close_matches(path.stem, shipped_names(), n=1, cutoff=0.75)
            raise ConfigError(f"config file {path} does not exist, nor a shipped config of that name "
                              f"({', '.join(shipped_names())})" + (f"; did you mean {close[0]}?" if close else ""))
        shipped = path.stem if not _seen and path.stem in shipped_names() else None  # e.g. configs/x.yaml elsewhere
        raise ConfigError(f"config file {path} does not exist" +
                          (f" here; brisk ships one of that name: brisk train {shipped}" if shipped else ""))
    if path.resolve() in _seen:
        raise ConfigError(f"{path}: include cycle")
    try:
        tree = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 ({e.reason} at byte {e.start + 1}); save it as UTF-8") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}{yaml_error(e)}") from None
    if not isinstance(tree, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections (model, data, train, ...)")
    _nulls(tree)
    _resolve_paths(tree, path.parent.resolve(), (path_keys() - CWD_KEYS) & _flatten(tree))
    base = tree.pop("include", None)
    if base is not None:
        base_path = Path(base) if Path(base).is_absolute() else path.parent / base
        if not base_path.is_file():  # include: demo (a shipped config's name), as `brisk train demo` takes it
            shipped = shipped_config(str(base)) if Path(str(base)).parent == Path(".") else None
            if shipped is None:
                raise ConfigError(f"{path}: include: {base}: no file {base_path}, nor a shipped config of that "
                                  f"name ({', '.join(shipped_names())})")
            base_path = shipped
        tree = _merge(shadowed(read_yaml(base_path, _seen + (path.resolve(),)), tree), tree)
    return tree


def load_config(path: str | Path | None = None, overrides: list[str] | None = None, check_paths: bool = True) -> Config:
    """YAML file (optional) + dotted overrides -> a checked ``Config``."""
    if path is not None and not Path(path).exists():
        path = shipped_config(str(path)) or path  # a shipped config's bare name, as `brisk train demo` takes it
    tree: dict = read_yaml(Path(path)) if path is not None else {}
    tree = read_moved(without_task(tree, path), path)
    unknown = sorted(k for k in _flatten(tree) if not _known_path(k))
    if unknown:  # named with its file here; build() below no longer knows where a key came from
        raise ConfigError(f"{path}: unknown config key {unknown[0]}{did_you_mean(unknown[0])}; "
                          "`brisk train --help-config` lists every key")
    cli: dict = {}
    given = [parse_override(t) for t in overrides or [] if t.split("=", 1)[0].strip().lstrip("+") == "model.family"]
    family = given[-1][1] if given else (tree.get("model") or {}).get("family") or families.DEFAULT
    for text in overrides or []:
        key, value = parse_override(text, family)
        _set_dotted(cli, key, value)
    _nulls(cli)
    _resolve_paths(cli, Path.cwd(), path_keys() & _flatten(cli))
    model = _merge(tree, cli).get("model") or {}
    folder = model.get("path")
    if folder and model.get("family", FAMILY) == FAMILY:  # another family refuses model.path in one line (its rule)
        tree = _with_model_folder(tree, folder)
    merged = expand_preset(_merge(tree, cli))
    _resolve_paths(merged, Path.cwd(), CWD_KEYS & _flatten(merged))
    cfg = build_config(merged)
    check_rules(cfg)  # which switches go together: before any model exists
    if not Path(cfg.train.output_dir).is_absolute():  # the default
        cfg.train.output_dir = str((Path.cwd() / cfg.train.output_dir).resolve())
    if check_paths:
        check_files(cfg)
    if check_paths or cfg.model.llm.path is None:
        from .llm import check_llm_config

        check_llm_config(cfg.model.llm)
    return cfg


# What a FunASR folder says about training rather than the architecture: defaults the YAML may change.
POLICY_KEYS = ("model.encoder.freeze", "model.adaptor.freeze", "model.encoder.activation_checkpoint", "model.llm.freeze",
               "model.llm.dtype", "model.llm.lora", "model.llm.activation_checkpoint", f"{FAMILY}.ctc.freeze")


def _with_model_folder(tree: dict, folder: str) -> dict:
    """A FunASR model folder defines the architecture: its sizes, front end and LLM folder replace those of the
    YAML file (whose inline LLM config is dropped). Training policy (freeze flags, LLM dtype) and the data keys
    of its dataset_conf (prompt class, sys_prompt, ...) set in the YAML win over the folder's; command-line
    overrides win over both."""
    if is_hf_folder(folder):  # a transformers-native Fun-ASR-Nano folder: sizes and LLM config from config.json
        found = hf_folder_model_config(folder)
        tree = _merge(tree, found)
        tree["model"]["llm"].update(path=None, config=found["model"]["llm"]["config"])
        return _with_export_keys(_merge({"data": {"tokenizer": str(folder)}}, tree), folder)
    return _with_export_keys(_with_funasr_folder(tree, folder), folder)


def _with_export_keys(tree: dict, folder: str) -> dict:
    """A brisk export's brisk.json (brisk.formats.brisk_keys): its front end and splicing win over the YAML, as
    the folder's sizes do; its prompt keys and LLM dtype are defaults the YAML may change."""
    found = read_keys_file(folder)
    if found is None:
        return tree
    keys = keys_tree(found["keys"])
    model = keys.get("model", {})
    policy = {"llm": model.pop("llm", {})}
    tree = _merge(tree, {k: v for k, v in keys.items() if k != "data"})  # with the family's own section
    return _merge({"model": policy, "data": keys.get("data", {})}, tree)


def _with_funasr_folder(tree: dict, folder: str) -> dict:
    found = funasr_folder_config(folder)
    policy: dict = {}
    for key in POLICY_KEYS:
        *parts, name = key.split(".")
        node = found
        for p in parts:
            node = node.get(p) or {}
        if name in node:
            _set_dotted(policy, key, node.pop(name))
    tree = _merge(tree, found)
    if "path" in found["model"].get("llm", {}):
        tree["model"]["llm"]["config"] = {}
    return _merge({**policy, "data": funasr_folder_data_config(folder)}, tree)


def _merge(a: dict, b: dict) -> dict:
    """``b`` over ``a``, dict by dict: also inside model.llm.config's free-form keys, so that
    ``model.llm.config.audio_config.n_window_infer=100`` changes that one key of a nested sub-config."""
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def get_dotted(cfg: Any, key: str) -> Any:
    node = cfg
    for part in key.split("."):
        node = node[part] if isinstance(node, dict) else getattr(node, part)
    return node


def check_files(cfg: Config) -> None:
    tree = cfg.to_dict()  # the run's family's own section included
    for key in sorted(path_keys("in")):
        try:
            value = get_dotted(tree, key)
        except KeyError:  # another family's section, or a moved key's old name
            continue
        if value is None:
            continue
        if any(c in str(value) for c in "*?[") and key in ("data.train", "data.valid"):  # chat data: a glob of files
            if not glob.glob(os.path.expanduser(str(value)), recursive=True):
                raise ConfigError(f"{key}: {value} matches no files")
        elif not Path(value).exists():
            raise ConfigError(f"{key}: {value} does not exist")


def config_changes(saved: dict, now: dict, ignore: set[str] = frozenset()) -> list[str]:
    """'key: old -> new' for every dotted key that differs, a key one side lacks included (keys in ``ignore``
    aside). The keys are brisk.formats.run_config.flat's, as a resume's refusals name them."""
    from ..formats.run_config import flat_now

    a, b = flat_now(saved), flat_now(now)  # an older brisk's names read as the new ones
    out = []
    for key in sorted(set(a) | set(b)):
        if key in ignore or a.get(key) == b.get(key):
            continue
        out.append(f"{key}: {a.get(key, '(absent)')!r} -> {b.get(key, '(absent)')!r}")
    return out



def save_config(cfg: Config, path: Path) -> None:
    path.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False, allow_unicode=True), encoding="utf-8")
