"""What each config key is to the rest of brisk, read from its declaration (``keys.key``): which keys are paths,
which an export records in brisk.json and which files it copies. The shared sections and every registered
family's own section (under the family's name) are walked, so a family's keys take part without a list naming
them. Computed on each call: a family registered later (an entry point, --family-module) counts too."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Iterator

from .. import families
from ..formats.brisk_keys import old_names
from .tree import Config


def declared() -> Iterator[tuple[str, dataclasses.Field]]:
    """(dotted key, its field) for every leaf key: the shared sections', then each family section's."""
    yield from _walk(Config, "")
    for family in families.all_families():
        if family.config is not None:
            yield from _walk(family.config, family.name)


def _walk(cls: Any, prefix: str) -> Iterator[tuple[str, dataclasses.Field]]:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.metadata.get("internal"):
            continue
        key = f"{prefix}.{f.name}" if prefix else f.name
        if dataclasses.is_dataclass(hints[f.name]):
            yield from _walk(hints[f.name], key)
        else:
            yield key, f


def path_keys(role: str | None = None) -> set[str]:
    """Keys holding a file or folder path ("in": must exist, "out": created; None: both). A key that moved
    keeps its role under its old name, so an older YAML file's relative path is resolved as it always was."""
    keys = {k for k, f in declared() if f.metadata.get("path") and role in (None, f.metadata["path"])}
    return keys | {old for new in keys for old in old_names(new)}


def resume_roles() -> dict[str, str]:
    """{key: "refused" | "free"} for the keys whose resume role is declared (brisk.formats.run_config.refused reads
    it before its sections' rule)."""
    return {k: f.metadata["resume"] for k, f in declared() if f.metadata.get("resume")}


def exported_keys() -> dict[str, str | None]:
    """{key: None, or the file name the export copies it to} for every key that changes what a trained model
    computes (brisk.formats.brisk_keys records them)."""
    return {k: f.metadata.get("exported") for k, f in declared() if f.metadata.get("inference")}
