"""The rooms of brisk and who may import whom (docs/architecture.md): no import circle between modules, and no
room importing a room on a higher floor. Every import counts, the ones inside functions too; only imports under
``if TYPE_CHECKING:`` (annotations) do not."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "brisk"

# Floor of each room (a top-level module or package of brisk); a room imports its own floor or lower ones.
FLOORS = {
    "brisk": 0, "errors": 0, "files": 0, "formats": 0, "safe_load": 0, "swap": 0, "versions": 0,
    "config": 1, "config_help": 1, "config_llm": 1, "plan": 1, "families": 1,
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


# ------------------------------------------------------------------------------------------- families
# The rooms that call a model family's hooks and never name one (a family is asked, never named: docs/architecture.md). data's own modules of one
# family (chat.py, prompt.py, context.py, qwen3_asr.py, ...) are the family's; its general modules are these.
GENERAL = ("plan", "speed", "memory", "distributed", "train", "eval", "diagnose", "probe", "bench")
GENERAL_DATA = ("brisk.data.loader", "brisk.data.collate", "brisk.data.sampler", "brisk.data.audio",
                "brisk.data.check", "brisk.data.jsonl")
FAMILY_MODULES = ("brisk.eval.decode", "brisk.eval.chat_eval", "brisk.eval.qwen3_asr_decode")  # a family's decoding
FAMILY_LOADERS = {"brisk.data.loader": ("speech_dataset", "chat_dataset")}  # family parts kept where they were


def _family_words() -> set[str]:
    """Every family name and old task word, read from the family modules (no import)."""
    words = set()
    for path in (ROOT / "families").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.keyword) and node.arg in ("name", "task") and isinstance(node.value, ast.Constant):
                words.add(node.value.value)
    return words - {""}


def family_names_in(tree: ast.AST, words: set[str], skip: tuple[str, ...] = ()) -> list[str]:
    """Lines that hold a family name or task word as a string constant (docstrings aside)."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in skip:
            skipped.update(range(node.lineno, node.end_lineno + 1))
    docs = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            docs.add(id(body[0].value))
    return [f"line {n.lineno}: {n.value!r}" for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
            and n.lineno not in skipped and (n.value in words or f"task {n.value}" in words)]


def test_no_general_room_names_a_model_family():
    words = _family_words()
    assert {"fun_asr_nano", "causal_lm", "qwen3_asr", "speech", "chat"} <= words
    bad = []
    for name, path in sorted(_modules().items()):
        general = _room(name) in GENERAL or name in GENERAL_DATA
        if not general or name in FAMILY_MODULES:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        bad += [f"{name} {hit}" for hit in family_names_in(tree, words, FAMILY_LOADERS.get(name, ()))]
    assert not bad, "general rooms name a model family (ask brisk.families instead):\n" + "\n".join(bad)


def test_the_family_check_catches_a_name():
    tree = ast.parse('def f(cfg):\n    """speech"""\n    return cfg.task == "chat"\n')
    assert family_names_in(tree, {"chat", "speech"}) == ["line 3: 'chat'"]


def test_every_family_part_names_a_function_that_exists():
    """A family's parts are imported when first called; each must exist, on a floor above the registry's."""
    import brisk.families as families

    mods = _modules()
    for fam in families.all_families():
        refs = [fam.build, fam.dataset, fam.readme, *fam.exporters.values(),
                *(r for r in (fam.recognizer, fam.val_recognizer, fam.eval_main, fam.eval_set, fam.prepare,
                                fam.folder_overrides, fam.graph_examples) if r is not None)]
        for ref in refs:
            module, _, attr = ref.target.partition(":")
            assert module in mods, f"{fam.name}: {ref.target}: no module {module}"
            tree = ast.parse(mods[module].read_text(encoding="utf-8"))
            defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
            assert attr in defined, f"{fam.name}: {ref.target}: {module} defines no {attr}"
            assert FLOORS[_room(module)] > FLOORS["families"], f"{fam.name}: {ref.target} sits on the registry's floor"


def test_memory_does_not_import_the_models_room():
    bad = [f"{a} imports {b}" for a, targets in import_graph().items() if _room(a) == "memory"
           for b in targets if _room(b) == "models"]
    assert not bad, "\n".join(bad)
