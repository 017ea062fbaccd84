"""The rooms of brisk and who may import whom (docs/architecture.md): no import circle between modules, and no
room importing a room on a higher floor. Every import counts, the ones inside functions too; only imports under
``if TYPE_CHECKING:`` (annotations) do not."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "brisk"

# Floor of each room (a top-level module or package of brisk); a room imports its own floor or lower ones.
FLOORS = {
    "brisk": 0, "errors": 0, "files": 0, "keys": 0, "formats": 0, "safe_load": 0, "swap": 0, "versions": 0,
    "config": 1, "plan": 1, "families": 1,
    "models": 2, "data": 2, "adapters": 2, "memory": 2,
    "speed": 3, "distributed": 3,
    "diagnose": 4, "probe": 4, "eval": 4,
    "family": 4.5,  # a model family's own package, brisk/families/<name>/ (the registry's spec aside)
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


def _family_package(module: str) -> str | None:
    """``brisk.families.<name>...`` of a family package (a folder under brisk/families/): that name."""
    parts = module.split(".")
    if len(parts) > 2 and parts[1] == "families" and (ROOT / "families" / parts[2]).is_dir():
        return parts[2]
    return None


def _room(module: str) -> str:
    if _family_package(module):
        return "family"
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


# ------------------------------------------------------------------------------------------- families
# A family is asked, never named (docs/architecture.md): a family's code lives in its own package,
# brisk/families/<name>/, which no other room imports, and the general rooms hold no family's name.
GENERAL = ("plan", "speed", "memory", "distributed", "train", "eval", "diagnose", "probe", "bench", "models", "data")


def test_no_room_imports_a_family_package_and_no_family_another():
    bad = []
    for a, targets in sorted(import_graph().items()):
        for b in sorted(targets):
            fam_b = _family_package(b)
            if fam_b and fam_b != _family_package(a):
                bad.append(f"{a} imports {b}")
    assert not bad, "a family's package is its own (ask brisk.families for its parts):\n" + "\n".join(bad)


def test_a_family_spec_imports_no_torch_when_loaded():
    """The plan reads a family's spec before torch is imported: the spec's module-level imports are the registry's
    and the standard library's; its parts import the family's modules inside their functions."""
    specs = sorted((ROOT / "families").glob("*/__init__.py"))
    own_keys = sorted((ROOT / "families").glob("*/config.py"))  # a family's own keys, which its spec imports
    for init in specs + own_keys:
        tree = ast.parse(init.read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.level:  # the registry's floor, the errors, how keys are declared
                allowed = ((2, "registry"), (2, "contract"), (3, "errors"), (3, "keys"))
                assert (node.level, node.module) in allowed + (((1, "config"),) if init in specs else ()), \
                    f"{init}: {ast.unparse(node)}"
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
                assert not any(n.split(".")[0] in ("torch", "transformers", "brisk") for n in names), \
                    f"{init}: {ast.unparse(node)}"


def test_every_part_of_a_family_imports_what_exists():
    """Each lazily imported part (``from .data import speech_dataset`` inside a spec function) names a module of the
    family's package that defines it."""
    mods = _modules()
    for init in sorted((ROOT / "families").glob("*/__init__.py")):
        package = f"brisk.families.{init.parent.name}"
        for node in ast.walk(ast.parse(init.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                module = f"{package}.{node.module}"
                assert module in mods, f"{init}: no module {module}"
                tree = ast.parse(mods[module].read_text(encoding="utf-8"))
                defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
                for a in node.names:
                    assert a.name in defined, f"{init}: {module} defines no {a.name}"


def _family_words() -> set[str]:
    """Every family name, read from the family specs (no import)."""
    words = set()
    for path in (ROOT / "families").glob("*/__init__.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.keyword) and node.arg == "name" and isinstance(node.value, ast.Constant):
                words.add(node.value.value)
    return words - {""}


def family_names_in(tree: ast.AST, words: set[str]) -> list[str]:
    """Lines that hold a family name as a string constant (docstrings aside)."""
    docs = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            docs.add(id(body[0].value))
    return [f"line {n.lineno}: {n.value!r}" for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
            and n.value in words]


def test_no_general_room_names_a_model_family():
    words = _family_words()
    assert {"fun_asr_nano", "causal_lm", "qwen3_asr"} <= words
    bad = []
    for name, path in sorted(_modules().items()):
        if _room(name) not in GENERAL:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        bad += [f"{name} {hit}" for hit in family_names_in(tree, words)]
    assert not bad, "general rooms name a model family (ask brisk.families instead):\n" + "\n".join(bad)


def test_the_family_checks_catch_what_they_should():
    tree = ast.parse('def f(cfg):\n    """qwen3_asr"""\n    return cfg.model.family == "causal_lm"\n')
    assert family_names_in(tree, {"causal_lm", "qwen3_asr"}) == ["line 3: 'causal_lm'"]
    assert _family_package("brisk.families.qwen3_asr.model") == "qwen3_asr"
    assert _family_package("brisk.families.registry") is None


def test_memory_does_not_import_the_models_room():
    bad = [f"{a} imports {b}" for a, targets in import_graph().items() if _room(a) == "memory"
           for b in targets if _room(b) == "models"]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("first", ["brisk.plan", "brisk.families", "brisk.config", "brisk.diagnose.report", "brisk.cli"])
def test_a_room_imports_alone_in_a_fresh_process(first):
    """Importing any room first works (no import cycle through a family's spec) and registers every built-in
    family with its preset."""
    import subprocess
    import sys

    code = (f"import {first}\nfrom brisk import families\nfrom brisk.plan import presets\n"
            "assert set(presets()['fast']) == set(families.names()) == set(families.BUILT_IN), presets()")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT.parent)
    assert r.returncode == 0, r.stderr[-2000:]
