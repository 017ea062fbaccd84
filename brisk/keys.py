"""How a config key is declared: its default and its one-line meaning (``--help-config`` prints it), as TRL's
``field(metadata={"help": ...})``, and what the key is to the rest of brisk; and the checks several sections
share. brisk.config's sections and each family's own section (Family.config) declare their keys with it, so the
general code learns which keys are paths or travel with an export from the declaration (brisk.config.roles),
never from a list naming a family. On the ground floor, importing nothing of brisk but the errors: a family's
spec uses it while brisk.config may not be importable yet."""

from __future__ import annotations

from dataclasses import MISSING, field
from typing import Any, Callable

from .errors import ConfigError

PATH_ROLES = ("in", "out")
RESUME_ROLES = ("refused", "free")


def key(default: Any = MISSING, help: str = "", *, factory: Callable[[], Any] | None = None,  # noqa: A002
        path: str | None = None, inference: bool = False, exported: str | None = None,
        resume: str | None = None):
    """A dataclass field: ``default`` (or ``factory()`` for a list or dict) and ``help``, its meaning.

    ``path``: the value is a file or folder, resolved against the folder of the YAML file that gives it; "in"
    must exist, "out" is created. ``inference``: it changes what a trained model computes, so an export records
    it in brisk.json (brisk.formats.brisk_keys). ``exported``: the file the export copies it into the folder as
    (an ``inference`` path key). ``resume``: what a change of it does to a resumed run, where its section's rule
    is not the answer (brisk.formats.run_config.refused): "refused" (it changes the data learnt from) or "free"
    (it changes no shape and no computed number)."""
    if path not in (None, *PATH_ROLES):
        raise ValueError(f"key(path={path!r}): use one of {PATH_ROLES}")
    if resume not in (None, *RESUME_ROLES):
        raise ValueError(f"key(resume={resume!r}): use one of {RESUME_ROLES}")
    meta = {"help": help, "path": path, "inference": inference or exported is not None, "exported": exported,
            "resume": resume}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def check_every(name: str, k: int) -> None:
    """An every-k-th-layer setting: 0 (off), 1 (every layer) or k."""
    if k < 0:
        raise ConfigError(f"{name}={k}: use 0 (off), 1 (every layer) or k (every k-th layer)")
