"""`dpsynth/dp/` does only DP: no module of it imports models or training (parsed with `ast`, so
imports inside functions and `importlib.import_module("...")` calls count too)."""

import ast
import pathlib

import pytest

import dpsynth

DP_DIR = pathlib.Path(dpsynth.__file__).parent / "dp"
FORBIDDEN = ("dpsynth.models", "dpsynth.train")


def _imported_names(tree: ast.AST) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against dpsynth.dp
                base = ".".join(["dpsynth", "dp"][: max(0, 2 - (node.level - 1))])
                mod = f"{base}.{node.module}" if node.module else base
            else:
                mod = node.module or ""
            out.append((node.lineno, mod))
            out += [(node.lineno, f"{mod}.{a.name}") for a in node.names]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("import_module", "__import__"):
                out.append((node.lineno, node.args[0].value))
    return out


def _violations(source: str) -> list[tuple[int, str]]:
    return [(line, name) for line, name in _imported_names(ast.parse(source))
            if any(name == f or name.startswith(f + ".") for f in FORBIDDEN)]


def test_dp_package_imports_nothing_from_models_or_train():
    files = sorted(DP_DIR.glob("*.py"))
    assert len(files) >= 10  # the package was found
    bad = {f.name: v for f in files if (v := _violations(f.read_text()))}
    assert bad == {}, f"dpsynth/dp must not import models/ or train/: {bad}"


@pytest.mark.parametrize("source", [
    "from dpsynth.models import Transformer",
    "import dpsynth.train.core",
    "def f():\n    from dpsynth.train import checkpoint",
    "from dpsynth import train",
    "import importlib\nimportlib.import_module('dpsynth.models.lora')",
    "from ..train import lm",
])
def test_the_check_catches_every_import_form(source):
    assert _violations(source)


def test_the_check_allows_dp_and_third_party_imports():
    assert not _violations("import jax\nfrom dpsynth.dp import accounting\nfrom dpsynth.data.tokenizers import BOS_ID")
