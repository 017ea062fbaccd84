"""How a config key is declared: its default and its one-line meaning (``--help-config`` prints it), as TRL's
``field(metadata={"help": ...})``; and the checks several sections share."""

from __future__ import annotations

from dataclasses import MISSING, field
from typing import Any, Callable

from ..errors import ConfigError


def key(default: Any = MISSING, help: str = "", *, factory: Callable[[], Any] | None = None):  # noqa: A002
    """A dataclass field: ``default`` (or ``factory()`` for a list or dict) and ``help``, its meaning."""
    if factory is not None:
        return field(default_factory=factory, metadata={"help": help})
    return field(default=default, metadata={"help": help})


def check_every(name: str, k: int) -> None:
    """An every-k-th-layer setting: 0 (off), 1 (every layer) or k."""
    if k < 0:
        raise ConfigError(f"{name}={k}: use 0 (off), 1 (every layer) or k (every k-th layer)")
