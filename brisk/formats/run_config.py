"""A run's saved config against another: which keys differ, and which of those change the model or the data.

    changes(saved, now) -> {key: (old, new)}       refused(key, roles) -> bool
    saved_config(run_dir, resume_from)             checkpoint_config(path)      (read only)
    check_run_files(run_dir, weights, roles)       (brisk eval / export / transcribe RUN)

A change of the model's shapes or of the data it learns from is ``refused``: a resume with it is one ConfigError
line (brisk.train.run_state.check, before the run folder is locked or written), and a run folder whose
config.yaml and checkpoint disagree on it is one line for evaluation and export. Configs are plain dicts here
(Config.to_dict(), or the YAML a run saved), so this module sits on the ground floor and both training and
evaluation use it.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from ..errors import ConfigError
from .brisk_keys import moved

# The shared sections that hold neither the model nor the data: a change of their keys is free on a resume unless
# a key declares otherwise (brisk.keys.key(resume=...)).
RUN_SECTIONS = ("optim", "train", "speed", "diagnose", "probe", "bench")


def flat(tree: dict, prefix: str = "") -> dict:
    """Dotted leaves of a config dict; a free-form mapping (model.llm.config, data.prompt_conf) key by key."""
    out = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flat(v, key + "."))
        else:
            out[key] = v
    return out


def refused(key: str, roles: dict[str, str]) -> bool:
    """Does changing ``key`` on a resume change the model's shapes or the data? ``roles`` is each key's declared
    answer (brisk.config.roles.resume_roles: "refused" or "free"; a free-form mapping's sub-keys take their key's);
    where none is declared, the section's: a run section's keys are free, a data key is free, a model key and a
    family section's key are refused. An older brisk's name of a key that moved is judged as the key it became."""
    key = moved(key) or key
    role = roles.get(key) or next((r for k, r in roles.items() if key.startswith(k + ".")), None)
    if role is not None:
        return role == "refused"
    section = key.split(".")[0]
    return section not in RUN_SECTIONS and section != "data"


def flat_now(tree: dict) -> dict:
    """``flat(tree)`` with an older brisk's names of moved keys read as today's: a key that only moved is no
    change."""
    return {moved(k) or k: v for k, v in flat(tree).items()}


def changes(saved: dict, now: dict, older_names: bool = False) -> dict[str, tuple]:
    """{key: (saved value, new value)} for every dotted key that differs. A config key one side lacks (a run
    saved by an older brisk) is no change; a key of the free-form LLM config one side lacks is one."""
    # older_names: either side may be an older brisk's (a checkpoint kept from before a key moved)
    a, b = (flat_now(side) if older_names else flat(side) for side in (saved, now))
    keys = (set(a) & set(b)) | {k for k in set(a) ^ set(b) if k.startswith("model.llm.config.")}
    return {k: (a.get(k, "(absent)"), b.get(k, "(absent)")) for k in sorted(keys) if a.get(k) != b.get(k)}


def describe(diff: dict[str, tuple]) -> str:
    return "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in diff.items())


def saved_config(run_dir: Path, resume_from: str | None = None) -> tuple[dict | None, Path | None]:
    """The config the run was trained with: the chosen checkpoint's (train.resume_from), else the folder's
    config.yaml; (None, None) when there is neither (nothing to resume)."""
    if resume_from:
        return checkpoint_config(Path(resume_from)), Path(resume_from)
    f = run_dir / "config.yaml"
    if f.is_file():
        try:
            return yaml.safe_load(f.read_text(encoding="utf-8")) or {}, f
        except yaml.YAMLError:
            return None, None
    return None, None


def checkpoint_config(path: Path) -> dict | None:
    """The config saved in a brisk checkpoint, read through mmap (the weights are not read); None otherwise."""
    from ..safe_load import load_torch_file

    if not path.is_file() or path.suffix == ".safetensors":
        return None
    try:
        ckpt = load_torch_file(path)
    except (RuntimeError, OSError, ValueError, ConfigError):
        return None
    return ckpt.get("config") if isinstance(ckpt, dict) else None


def check_run_files(run_dir: str | Path, weights: Path | None, roles: dict[str, str]) -> None:
    """A run's checkpoint and its config.yaml must describe the same model and data: else one ConfigError line
    naming the keys (a resume refused on main once rewrote config.yaml; evaluation then built the wrong model)."""
    run_dir = Path(run_dir)
    if weights is None:
        return
    ck = checkpoint_config(Path(weights))
    saved, _ = saved_config(run_dir)
    if ck is None or saved is None:
        return
    bad = {k: v for k, v in changes(ck, saved, older_names=True).items() if refused(k, roles)}
    if bad:
        raise ConfigError(f"{run_dir}: its config.yaml and {Path(weights).name} disagree on the model or data: "
                          f"{describe(bad)} (checkpoint -> config.yaml); restore config.yaml from the checkpoint's "
                          "values, or pass --weights with a checkpoint of this config")
