"""Where conversations come from: a jsonl, parquet files (one, a folder of them, a glob), or a ``datasets``
``save_to_disk`` folder; a split by name where the layout has splits; rows cut into work units.

Layouts and how a split is picked (``data.train_split`` / ``data.valid_split``):

- ``x.jsonl`` / ``x.parquet`` / ``x.arrow``: the file itself, no splits.
- a glob (``/d/train_sft-*.parquet``): the files it matches.
- a folder of parquet (or jsonl) files, as the hub ships ultrachat_200k (``data/train_sft-00000-of-00003-*.parquet``,
  ``test_sft-*``, ...): the files whose name starts with ``<split>-`` or ``<split>.``, or those under a
  ``<split>/`` sub-folder; a folder without split names is one data set.
- a ``save_to_disk`` folder: a DatasetDict (``dataset_dict.json`` and one folder a split) or a Dataset
  (``state.json`` naming its ``.arrow`` files, Arrow IPC streams).

A row is named in messages as ``file:line`` (jsonl, lines from 1) or ``file:row N`` (parquet and arrow, rows
from 0, as ``datasets`` indexes them).
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import DataError

TABLE_SUFFIXES = (".parquet", ".arrow", ".jsonl")
UNIT_ROWS = 1024  # conversations a work unit of parquet or arrow (a worker's task; progress moves by units)
UNIT_BYTES = 4 << 20  # bytes of jsonl a work unit
COLUMNS = ("messages", "prompt", "completion", "prompt_id", "key")  # what a chat row is read for


@dataclass(frozen=True)
class Unit:
    """A slice of one file that one worker reads and tokenises: rows [lo, hi) of a row group (parquet), of the
    table (arrow), or bytes [lo, hi) holding whole lines from line ``first_line`` (jsonl)."""

    file: str
    kind: str  # jsonl, parquet, arrow
    lo: int
    hi: int
    group: int = 0  # parquet row group
    first_line: int = 1  # jsonl


def kind_of(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return "parquet"
    if suffix == ".arrow":
        return "arrow"
    return "jsonl"


def _split_files(folder: Path, split: str | None, what: str) -> list[Path]:
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in TABLE_SUFFIXES
                   and not any(part.startswith(".") for part in p.relative_to(folder).parts))
    if not files:
        raise DataError(f"{what}={folder}: no .parquet, .arrow or .jsonl files in the folder")

    # Split names as the hub writes them: the stem before "-00000-of-00003..."; else a first-level sub-folder.
    sharded = {p.name.split("-")[0] for p in files if "-of-" in p.name} - {""}
    by_split: dict[str, list[Path]] = {}
    for p in files:
        rel = p.relative_to(folder).parts
        if sharded:
            s = next((n for n in sorted(sharded, key=len, reverse=True) if p.name.startswith(n + "-")), None)
        else:
            s = rel[0] if len(rel) > 1 else None
        if s is not None:
            by_split.setdefault(s, []).append(p)
    if not by_split or (split is None and len(by_split) == 1):
        if split is not None and split not in by_split:
            raise DataError(f"{what}={folder}: has no split named {split!r} (no files named {split}-*, no {split}/ "
                            "folder); leave the split unset to read every file")
        return files
    if split is None:
        raise DataError(f"{what}={folder}: holds splits {', '.join(sorted(by_split))}; pick one with "
                        f"{what}_split=NAME")
    if split not in by_split:
        raise DataError(f"{what}={folder}: no split {split!r}; it holds {', '.join(sorted(by_split))}")
    return by_split[split]


def _saved_dataset(folder: Path, split: str | None, what: str) -> list[Path]:
    if (folder / "dataset_dict.json").is_file():
        splits = json.loads((folder / "dataset_dict.json").read_text(encoding="utf-8")).get("splits", [])
        if split is None:
            if len(splits) != 1:
                raise DataError(f"{what}={folder}: a DatasetDict with splits {', '.join(splits)}; pick one with "
                                f"{what}_split=NAME")
            split = splits[0]
        if split not in splits:
            raise DataError(f"{what}={folder}: no split {split!r}; it holds {', '.join(splits)}")
        folder = folder / split
    state = folder / "state.json"
    if not state.is_file():
        raise DataError(f"{what}={folder}: not a datasets save_to_disk folder (no state.json)")
    names = [f["filename"] for f in json.loads(state.read_text(encoding="utf-8")).get("_data_files", [])]
    files = [folder / n for n in names]
    missing = [str(p) for p in files if not p.is_file()]
    if missing or not files:
        raise DataError(f"{what}={folder}: state.json names arrow files that are not there: {', '.join(missing[:3])}")
    return files


def resolve_files(path: str, split: str | None, what: str = "data.train") -> list[Path]:
    """The data files behind ``path`` (a file, folder or glob), for ``split`` where the layout has splits."""
    if any(c in path for c in "*?["):
        files = sorted(Path(p) for p in glob.glob(os.path.expanduser(path), recursive=True) if os.path.isfile(p))
        if not files:
            raise DataError(f"{what}={path}: the pattern matches no files")
        if split is not None:
            raise DataError(f"{what}={path}: a pattern names its files itself; leave {what}_split unset, or give "
                            "the folder and the split")
        return files
    p = Path(path).expanduser()
    if p.is_file():
        if split is not None:
            raise DataError(f"{what}={path}: a single file has no splits; leave {what}_split unset")
        return [p]
    if p.is_dir():
        if (p / "dataset_dict.json").is_file() or (p / "state.json").is_file():
            return _saved_dataset(p, split, what)
        return _split_files(p, split, what)
    raise DataError(f"data file {path} does not exist")


# --------------------------------------------------------------------------------------------- units
def _jsonl_units(path: Path) -> list[Unit]:
    units, line, start = [], 1, 0
    size = path.stat().st_size
    with path.open("rb") as f:
        while start < size:
            f.seek(start)
            block = f.read(UNIT_BYTES)
            end = start + len(block)
            if end < size:
                rest = f.readline()  # finish the last line
                block += rest
                end += len(rest)
            units.append(Unit(str(path), "jsonl", start, end, first_line=line))
            line += block.count(b"\n")
            start = end
    return units


def need_pyarrow(path) -> None:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise DataError(f"{path}: reading parquet and arrow files needs pyarrow: pip install 'brisk[data]' "
                        "(or pyarrow)") from None


def _parquet_units(path: Path) -> list[Unit]:
    need_pyarrow(path)
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(path).metadata
    except Exception as e:  # noqa: BLE001 - pyarrow raises several kinds for a damaged file
        raise DataError(f"{path}: not a readable parquet file ({e})") from None
    units = []
    for g in range(meta.num_row_groups):
        n = meta.row_group(g).num_rows
        units += [Unit(str(path), "parquet", lo, min(n, lo + UNIT_ROWS), group=g) for lo in range(0, n, UNIT_ROWS)]
    return units


def open_arrow(path: str):
    """An arrow file of ``save_to_disk`` (an IPC stream), memory-mapped: rows are read, not copied."""
    import pyarrow as pa

    source = pa.memory_map(str(path))
    try:
        return pa.ipc.open_stream(source).read_all()
    except pa.ArrowInvalid:
        return pa.ipc.open_file(source).read_all()


def _arrow_units(path: Path) -> list[Unit]:
    need_pyarrow(path)
    try:
        n = open_arrow(str(path)).num_rows
    except Exception as e:  # noqa: BLE001
        raise DataError(f"{path}: not a readable arrow file ({e})") from None
    return [Unit(str(path), "arrow", lo, min(n, lo + UNIT_ROWS)) for lo in range(0, n, UNIT_ROWS)]


def units_of(files: list[Path]) -> list[Unit]:
    out: list[Unit] = []
    for f in files:
        out += {"jsonl": _jsonl_units, "parquet": _parquet_units, "arrow": _arrow_units}[kind_of(f)](f)
    return out


def read_unit(unit: Unit):
    """Yield (where, row) for the unit's rows: row is a dict, or a DataError for a line that is not JSON."""
    if unit.kind == "jsonl":
        with open(unit.file, "rb") as f:
            f.seek(unit.lo)
            block = f.read(unit.hi - unit.lo)
        for n, raw in enumerate(block.split(b"\n"), unit.first_line):
            if not raw.strip():
                continue
            where = f"{unit.file}:{n}"
            try:
                yield where, json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                if isinstance(e, UnicodeDecodeError):
                    yield where, DataError(f"{where}: not UTF-8 (byte {e.start + 1} of the line); save the file as UTF-8")
                    continue
                msg = e.msg[:-3] if e.msg.endswith(" at") else e.msg
                yield where, DataError(f"{where}: not valid JSON ({msg}, column {e.colno})")
        return
    if unit.kind == "parquet":
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(unit.file)
        columns = [c for c in pf.schema_arrow.names if c in COLUMNS]
        table = pf.read_row_group(unit.group, columns=columns).slice(unit.lo, unit.hi - unit.lo)
        base = sum(pf.metadata.row_group(g).num_rows for g in range(unit.group)) + unit.lo  # rows of earlier groups
    else:
        table = open_arrow(unit.file).slice(unit.lo, unit.hi - unit.lo)
        table = table.select([c for c in table.column_names if c in COLUMNS])
        base = unit.lo
    for i, row in enumerate(table.to_pylist()):
        yield f"{unit.file}:row {base + i}", row
