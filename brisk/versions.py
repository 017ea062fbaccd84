"""Which releases brisk is tested on: the floors brisk's package metadata requires (pyproject.toml) and the last set
the tests passed on (``constraints.txt``, shipped with the package, usable as ``pip install -c``). ``brisk doctor``
names every installed package outside that range in one line each."""

from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError, requires, version
from pathlib import Path

CONSTRAINTS = Path(__file__).with_name("constraints.txt")
DIST = "brisk-train"


def _release(text: str) -> tuple[int, ...]:
    """'2.13.0+cpu' -> (2, 13, 0); '5.25.0rc1' -> (5, 25, 0)."""
    return tuple(int(x) for x in re.findall(r"\d+", text.split("+")[0].split("rc")[0].split("a")[0])[:3])


def last_tested() -> dict[str, str]:
    """package -> the newest release the tests passed on (constraints.txt's ``<=`` pins)."""
    out = {}
    for line in CONSTRAINTS.read_text(encoding="utf-8").splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)\s*<=\s*([0-9][^\s;#]*)", line)
        if m:
            out[m.group(1).lower()] = m.group(2)
    return out


def floors() -> dict[str, str]:
    """package -> the lowest release brisk's metadata allows (``>=`` in its requirements, extras included)."""
    try:
        reqs = requires(DIST) or []
    except PackageNotFoundError:  # run from a checkout that was not installed
        return {}
    out = {}
    for r in reqs:
        m = re.match(r"^([A-Za-z0-9_.-]+)\s*(?:\[[^]]*\])?\s*\(?>=\s*([0-9][^,;\s)]*)", r)
        if m:
            out.setdefault(m.group(1).lower(), m.group(2))
    return out


def outside_tested() -> list[str]:
    """One line for each installed package below its floor or newer than the last tested release."""
    lines = []
    low, high = floors(), last_tested()
    for name in sorted(set(low) | set(high)):
        try:
            have = version(name)
        except PackageNotFoundError:
            continue
        if name in low and _release(have) < _release(low[name]):
            lines.append(f"{name} {have} is below brisk's floor {low[name]}")
        elif name in high and _release(have) > _release(high[name]):
            lines.append(f"{name} {have} is newer than the last release brisk was tested on ({high[name]}): if a "
                         f"run fails, try `pip install -c {CONSTRAINTS}`")
    return lines
