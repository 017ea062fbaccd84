"""The GPU tests run only on a GPU machine, so a renamed keyword in brisk breaks them unseen on the CPU (a
`build_model(..., task=...)` left after `task` was removed failed 3 GPU tests). Here every call in tests/gpu to a
function or class imported from brisk is checked against its signature: each keyword it passes must exist."""

from __future__ import annotations

import ast
import importlib
import inspect

import pytest

from .conftest import REPO

GPU_TESTS = sorted((REPO / "tests" / "gpu").glob("test_*.py"))


def brisk_imports(tree: ast.Module) -> dict[str, object]:
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("brisk"):
            module = importlib.import_module(node.module)
            for alias in node.names:
                obj = getattr(module, alias.name, None)
                if callable(obj):
                    names[alias.asname or alias.name] = obj
    return names


@pytest.mark.parametrize("path", GPU_TESTS, ids=lambda p: p.name)
def test_gpu_tests_pass_only_keywords_that_brisk_accepts(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imported = brisk_imports(tree)
    bad = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in imported):
            continue
        try:
            params = inspect.signature(imported[node.func.id]).parameters
        except (TypeError, ValueError):  # a builtin without a signature
            continue
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            continue
        bad += [f"{path.name}:{node.lineno}: {node.func.id}(..., {kw.arg}=...)" for kw in node.keywords
                if kw.arg is not None and kw.arg not in params]
    assert not bad, "keywords the function does not take:\n" + "\n".join(bad)
