"""The static import graph of `dpsynth/`: no cycles, and every arrow points down the layers.

Every module is parsed (nothing is imported), imports inside functions included, so a cycle
cannot hide behind a function-level import. The layers, bottom up:

    0  top-level helpers (dpsynth.fileio, .logs, .tokens, .binding, ...)
    1  dpsynth.dp, dpsynth.data, dpsynth.dedup    (each may import layer 0 and each other)
    2  dpsynth.beam, dpsynth.models
    3  dpsynth.train
    4  dpsynth.generate, dpsynth.evaluate
    5  dpsynth.experiment, dpsynth.release_audit
    6  the entry points inside the package (dpsynth.cli, dpsynth.demo)

The commands of `dpsynth.cli.COMMANDS` (one table, "module:function" strings imported on use)
are edges of the graph too: `dpsynth.cli` -> each command's module, whose entry points
(`trainers/`, `beam_jobs/`) sit beside the CLI in layer 6 and are nodes of the graph.

Run `python tests/test_imports.py` for the figures (cycles, arrows back up, function-level imports).
"""

from __future__ import annotations

import ast
import collections
import functools
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dpsynth"

# Unit (subpackage, or top-level module) -> layer; a unit not named here is a layer-0 helper.
LAYERS = {
    "dpsynth.dp": 1, "dpsynth.data": 1, "dpsynth.dedup": 1,
    "dpsynth.beam": 2, "dpsynth.models": 2,
    "dpsynth.train": 3,
    "dpsynth.generate": 4, "dpsynth.evaluate": 4,
    "dpsynth.experiment": 5, "dpsynth.release_audit": 5,
    "dpsynth.cli": 6, "dpsynth.demo": 6,
}
ENTRY_POINT_PACKAGES = ("trainers", "beam_jobs")


@functools.cache
def modules() -> dict[str, pathlib.Path]:
    """Dotted module name -> file, for every module of the package (read once: callers do not edit it)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _function_level(tree: ast.AST) -> set[int]:
    """ids of the import nodes that sit inside a function body."""
    inner = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            inner.update(id(n) for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom)))
    return inner


def imports(name: str, path: pathlib.Path) -> list[tuple[str, int, bool]]:
    """(imported module, line, inside a function) for each name the module imports.

    `from pkg import sub` names `pkg.sub` when that is a module, `pkg` otherwise; relative
    imports are resolved against `name`.
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    inner = _function_level(tree)
    known = modules()
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                here = here[:len(here) - node.level + 1]
                base = ".".join(here + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        out += [(t, node.lineno, id(node) in inner) for t in dict.fromkeys(targets)]
    return out


def unit(module: str) -> str:
    """The subpackage (`dpsynth.dp`) or top-level module (`dpsynth.cli`) a module belongs to."""
    return ".".join(module.split(".")[:2])


def _owner(target: str, known: dict) -> str | None:
    while target and target not in known:
        target = target.rpartition(".")[0]
    return target or None


def entry_modules() -> dict[str, pathlib.Path]:
    """Dotted module name -> file, for the entry points outside the package (`trainers/`, `beam_jobs/`)."""
    return {f"{pkg}.{path.stem}": path for pkg in ENTRY_POINT_PACKAGES
            for path in sorted((ROOT / pkg).glob("*.py")) if path.stem != "__init__"}


def commands() -> dict[str, str]:
    """`dpsynth.cli.COMMANDS` read from the source (nothing imported): command -> "module:function"."""
    tree = ast.parse((PACKAGE / "cli.py").read_text())
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (node.targets[0] if isinstance(node, ast.Assign) else None)
        if isinstance(target, ast.Name) and target.id == "COMMANDS":
            return {name: spec[0] for name, spec in ast.literal_eval(node.value).items()}
    raise AssertionError("dpsynth/cli.py has no COMMANDS table")


def graph() -> dict[str, set[str]]:
    """Module -> the modules it imports (anywhere in the file), and `dpsynth.cli` -> each command's module."""
    known = {**modules(), **entry_modules()}
    edges: dict[str, set[str]] = {m: set() for m in known}
    for name, path in known.items():
        for target, _, _ in imports(name, path):
            owner = _owner(target, known)
            if owner is not None and owner != name:
                edges[name].add(owner)
    edges["dpsynth.cli"].update(spec.split(":")[0] for spec in commands().values())
    return edges


def unit_graph() -> dict[str, set[str]]:
    """Unit -> the other units it imports (the package's own `__init__` is the unit `dpsynth`)."""
    out: dict[str, set[str]] = collections.defaultdict(set)
    for src, targets in graph().items():
        out[unit(src)]
        out[unit(src)].update(unit(t) for t in targets if unit(t) != unit(src))
    return dict(out)


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(found)


def layer(module: str) -> int:
    if module.split(".")[0] in ENTRY_POINT_PACKAGES:
        return LAYERS["dpsynth.cli"]  # the entry points sit beside the CLI that dispatches to them
    return LAYERS.get(unit(module), 0)


def arrows_back_up() -> list[tuple[str, str]]:
    """(importer, imported) pairs where the imported module sits in a higher layer."""
    return sorted((src, dst) for src, targets in graph().items() for dst in targets if layer(dst) > layer(src))


def function_level_imports() -> list[tuple[str, int, str]]:
    """(module, line, imported) for every import inside a function body."""
    return [(name, line, target) for name, path in modules().items()
            for target, line, inner in imports(name, path) if inner]


def test_no_cycles_between_subpackages():
    assert cycles(unit_graph()) == []


def test_no_cycles_between_modules():
    assert cycles(graph()) == []


def test_dp_imports_none_of_the_layers_above():
    above = {"dpsynth.models", "dpsynth.train", "dpsynth.generate", "dpsynth.evaluate", "dpsynth.experiment"}
    bad = [(src, dst) for src, targets in graph().items() if unit(src) == "dpsynth.dp"
           for dst in targets if unit(dst) in above]
    assert bad == []


def test_models_do_not_import_train():
    bad = [(src, dst) for src, targets in graph().items() if unit(src) == "dpsynth.models"
           for dst in targets if unit(dst) == "dpsynth.train"]
    assert bad == []


def test_every_arrow_points_down():
    assert arrows_back_up() == []


def test_library_does_not_import_entry_points():
    bad = [(name, line, target) for name, path in modules().items() for target, line, _ in imports(name, path)
           if target.split(".")[0] in ENTRY_POINT_PACKAGES]
    assert bad == []


def test_every_command_is_a_visible_edge_to_its_main():
    """The command table is one table the graph sees: each entry names a module of the graph
    (an entry point or a package module) that defines the function it names."""
    known = {**modules(), **entry_modules()}
    cli_edges = graph()["dpsynth.cli"]
    for name, spec in commands().items():
        module, _, func = spec.partition(":")
        assert module in known, f"{name}: {module} is not a module"
        assert module in cli_edges
        defined = {n.name for n in ast.parse(known[module].read_text()).body if isinstance(n, ast.FunctionDef)}
        assert func in defined, f"{name}: {module} defines no {func}()"


def test_parser_sees_function_level_and_relative_imports(tmp_path):
    """Imports inside functions are found and flagged, relative ones resolved (so no cycle can hide)."""
    path = tmp_path / "x.py"
    path.write_text("import os\nfrom . import checkpoint\n\ndef f():\n    from ..models import config\n"
                    "    import dpsynth.fileio\n")
    assert imports("dpsynth.train.x", path) == [
        ("os", 1, False), ("dpsynth.train.checkpoint", 2, False), ("dpsynth.models.config", 5, True),
        ("dpsynth.fileio", 6, True)]


def test_cycles_finds_every_strongly_connected_component():
    edges = {"a": {"b"}, "b": {"a", "c"}, "c": {"d"}, "d": {"c"}, "e": {"a"}}
    assert cycles(edges) == [["a", "b"], ["c", "d"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def figures() -> dict:
    """The counts reported before and after a refactor of the layering."""
    return {"module_cycles": cycles(graph()), "unit_cycles": cycles(unit_graph()),
            "arrows_back_up": arrows_back_up(), "function_level_imports": len({(m, line) for m, line, _ in function_level_imports()})}


if __name__ == "__main__":
    f = figures()
    print(f"cycles between subpackages: {len(f['unit_cycles'])} {f['unit_cycles']}")
    print(f"cycles between modules: {len(f['module_cycles'])} {f['module_cycles']}")
    print(f"arrows back up: {len(f['arrows_back_up'])}")
    for src, dst in f["arrows_back_up"]:
        print(f"  {src} -> {dst}")
    print(f"function-level import statements: {f['function_level_imports']}")
