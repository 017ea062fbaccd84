"""The rooms of brisk and who may import whom (docs/architecture.md): no import circle between modules, and no
room importing a room on a higher floor. Every import counts, the ones inside functions too; only imports under
``if TYPE_CHECKING:`` (annotations) do not."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "brisk"

# Floor of each room (a top-level module or package of brisk); a room imports its own floor or lower ones.
FLOORS = {
    "brisk": 0, "errors": 0, "files": 0, "formats": 0, "safe_load": 0,
    "config": 1, "config_help": 1, "config_llm": 1, "plan": 1,
    "models": 2, "data": 2, "adapters": 2, "memory": 2,
    "speed": 3, "distributed": 3,
    "diagnose": 4, "probe": 4, "eval": 4,
    "train": 5,
    "bench": 6,
    "cli": 7, "__main__": 7,
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = ("brisk",) + path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in node.body:
                lines.update(range(sub.lineno, sub.end_lineno + 1))
    return lines


def import_graph() -> dict[str, set[str]]:
    mods = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = _type_checking_lines(tree)
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        targets = set()
        for node in ast.walk(tree):
            if getattr(node, "lineno", None) in skip:
                continue
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                for cand in [mod] + [f"{mod}.{a.name}" for a in node.names]:
                    if cand in mods:
                        targets.add(cand)
            elif isinstance(node, ast.Import):
                targets.update(a.name for a in node.names if a.name in mods)
        targets.discard(name)
        graph[name] = targets
    return graph


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state and (found := visit(m)):
                return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (found := visit(n)):
            return found
    return None


def test_every_room_has_a_floor():
    rooms = {_room(m) for m in _modules()}
    assert rooms <= set(FLOORS), f"rooms without a floor in FLOORS: {sorted(rooms - set(FLOORS))}"


def test_no_import_circle():
    assert find_cycle(import_graph()) is None, " -> ".join(find_cycle(import_graph()))


def test_no_room_imports_a_higher_floor():
    bad = [f"{a} imports {b}" for a, targets in sorted(import_graph().items()) for b in sorted(targets)
           if FLOORS[_room(b)] > FLOORS[_room(a)]]
    assert not bad, "\n".join(bad)


def test_the_checks_catch_what_they_should():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
