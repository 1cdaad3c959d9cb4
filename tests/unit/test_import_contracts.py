"""The package's import graph: the layers contract (import-linter, configured in pyproject.toml), no import circle
between qkplast modules, and no private name taken from another qkplast module (both read from the source).

The circle and private-name checks parse every module with ``ast`` and count every import, also those inside
functions (a lazy import runs back up the layers as surely as a top-level one, only later).
"""

from __future__ import annotations

import ast
from pathlib import Path


from tests.helpers import ROOT

PACKAGE = ROOT / "qkplast"
#: Names starting with "_" that may still be imported: the version.
ALLOWED_NAMES = {"__version__"}
#: Modules with a "_" part in their path that may still be imported from: the version's home.
ALLOWED_MODULES = {"qkplast._version"}

def test_the_layers_contract_holds(capsys):
    """``lint-imports`` (run in this process, as its console script would) keeps every contract of pyproject.toml."""
    import importlinter.api  # noqa: F401  (configures import-linter's adapters, as its command line does)
    from importlinter.application.use_cases import lint_imports

    kept = lint_imports(config_filename=str(ROOT / "pyproject.toml"), cache_dir=None, no_logo=True)
    report = capsys.readouterr().out
    assert kept, report
    assert "1 kept, 0 broken" in report, report


# --------------------------------------------------------------------------- the imports, read from the source


def module_name(path: Path) -> str:
    """``qkplast/a/b.py`` -> ``qkplast.a.b``; ``qkplast/a/__init__.py`` -> ``qkplast.a``."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
SOURCES = [*MODULES.values(), *sorted((ROOT / "notebooks").glob("*.py")), *sorted((ROOT / "benchmarks").glob("*.py"))]


def parse(path: Path) -> tuple[ast.Module, str, bool]:
    """The tree of ``path``, its module name (the file's stem outside the package) and whether it is a package."""
    name = module_name(path) if path.is_relative_to(PACKAGE) else path.stem
    return ast.parse(path.read_text(), str(path)), name, path.name == "__init__.py"


def resolve(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    """The absolute module a ``from ... import`` names (a relative import resolved against ``importer``)."""
    if not node.level:
        return node.module or ""
    base = importer.split(".") if is_package else importer.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(tree: ast.Module, importer: str, is_package: bool) -> list[tuple[int, str, str | None, tuple]]:
    """Every import of a qkplast module at any depth: ``(line, module, imported name or None, (local name, module
    bound to it or None))``. ``from m import x`` where ``m.x`` is itself a module counts as an import of module
    ``m.x`` (name None); ``import qkplast.a`` binds ``qkplast``, ``import qkplast.a as b`` binds ``b``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, None, (a.asname, a.name) if a.asname else ("qkplast", "qkplast"))
                      for a in node.names if a.name.split(".")[0] == "qkplast"]
        elif isinstance(node, ast.ImportFrom):
            module = resolve(node, importer, is_package)
            if module.split(".")[0] == "qkplast":
                for a in node.names:
                    sub, local = f"{module}.{a.name}", a.asname or a.name
                    found.append((node.lineno, sub, None, (local, sub)) if sub in MODULES
                                 else (node.lineno, module, a.name, (local, None)))
    return sorted(found, key=lambda row: row[0])


# --------------------------------------------------------------------------- circles


def import_graph() -> dict[str, set[str]]:
    """Module -> the qkplast modules it imports (the module named, not the packages above it)."""
    graph = {}
    for name, path in MODULES.items():
        graph[name] = {module for _, module, _, _ in imports(*parse(path)) if module in MODULES and module != name}
    return graph


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """The modules ``start`` imports, directly or through others (``start`` itself only on a circle)."""
    seen, todo = set(), list(graph[start])
    while todo:
        v = todo.pop()
        if v not in seen:
            seen.add(v)
            todo += graph[v]
    return seen


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or not (strongly connected, more than one module)."""
    reach = {v: reachable(graph, v) for v in graph}
    groups = {frozenset({v} | {w for w in reach[v] if v in reach[w]}) for v in graph if v in reach[v]}
    return sorted(sorted(g) for g in groups)


def one_circle(graph: dict[str, set[str]], group: list[str]) -> str:
    """A shortest circle through the first module of ``group``, as ``a -> b -> ... -> a``."""
    start, paths, seen = group[0], [[group[0]]], {group[0]}
    while paths:
        path = paths.pop(0)
        for w in sorted(graph[path[-1]] & set(group)):
            if w == start:
                return " -> ".join(path + [start])
            if w not in seen:
                seen.add(w)
                paths.append(path + [w])
    raise AssertionError(f"no circle through {start} in {group}")


def describe(graph: dict[str, set[str]], groups: list[list[str]]) -> str:
    return "\n".join(f"{len(g)} modules ({', '.join(g)}), e.g. {one_circle(graph, g)}" for g in groups)


def test_circle_finder_finds_a_planted_circle_and_nothing_in_a_chain():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"d", "a"}}
    assert circles(graph) == [["a", "b", "c"]]
    assert one_circle(graph, ["a", "b", "c"]) == "a -> b -> c -> a"
    assert circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_import_circle():
    graph = import_graph()
    found = circles(graph)
    assert not found, "import circles between qkplast modules:\n" + describe(graph, found)


# --------------------------------------------------------------------------- private names


def is_private(module: str, name: str | None) -> bool:
    """Whether ``from module import name`` (``import module`` for name None) takes a private name."""
    taken = name if name is not None else module.rsplit(".", 1)[-1]
    private_path = module not in ALLOWED_MODULES and any(part.startswith("_") for part in module.split("."))
    return (taken.startswith("_") and taken not in ALLOWED_NAMES) or private_path


def private_attributes(tree: ast.Module, bound: dict[str, str]) -> list[tuple[int, str, str]]:
    """``module._name`` read through a name bound to a qkplast module: ``(line, _name, module)``; dunders such as
    ``__file__`` are public."""
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
            continue
        chain, value = [], node.value
        while isinstance(value, ast.Attribute):  # qkplast.capture_format._write: the module is qkplast.capture_format
            chain.insert(0, value.attr)
            value = value.value
        if isinstance(value, ast.Name) and value.id in bound and node.attr not in ALLOWED_NAMES:
            found.append((node.lineno, node.attr, ".".join([bound[value.id], *chain])))
    return found


def private_names(path: Path, root: Path = ROOT) -> list[str]:
    """``file:line: name from module`` for each private name ``path`` takes from a qkplast module: imported, or
    read as an attribute of an imported module."""
    tree, importer, is_package = parse(path)
    rows = imports(tree, importer, is_package)
    taken = [(line, name or module, module) for line, module, name, _ in rows if is_private(module, name)]
    bound = {local: module for _, _, _, (local, module) in rows if module}  # local names of modules
    taken += private_attributes(tree, bound)
    return [f"{path.relative_to(root)}:{line}: {name} from {module}" for line, name, module in sorted(taken)]


def test_private_name_finder_flags_what_it_should(tmp_path):
    (tmp_path / "probe.py").write_text(
        "from qkplast.capture.models import _sha256, load_model\n"
        "def f():\n    from qkplast.capture import _hidden\n"
        "from qkplast._version import __version__\nfrom qkplast import tensors\nfrom qkplast.tensors import matmul\n"
        "import qkplast._secret\nfrom os import _exit\n"
        "from qkplast.capture import models\nmodels._offline(), models.__file__, tensors.einsum\n"
        "import qkplast.capture_format\nqkplast.capture_format._write(1)\n")
    found = private_names(tmp_path / "probe.py", root=tmp_path)
    assert found == ["probe.py:1: _sha256 from qkplast.capture.models", "probe.py:3: _hidden from qkplast.capture",
                     "probe.py:7: qkplast._secret from qkplast._secret",
                     "probe.py:10: _offline from qkplast.capture.models", "probe.py:12: _write from qkplast.capture_format"], found


def offenders() -> list[str]:
    found = [line for path in SOURCES for line in private_names(path)]
    assert len(SOURCES) > len(MODULES), "the notebooks and benchmarks are read too"
    return found


def without_line(offender: str) -> str:
    file, _, rest = offender.split(":", 2)
    return f"{file}:{rest}"


def test_no_private_name_is_taken():
    found = offenders()
    assert not found, "private names taken from another qkplast module:\n" + "\n".join(found)
