"""The package's import graph has no cycles, and every module imports on its own.

The graph is read from the source (every `import`, at module level or inside a function,
since a deferred import that closes a cycle is still a cycle in the design), so a new
cycle fails here before it fails as an ImportError in whichever order a user imports.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"


def modules(src: Path = SRC) -> dict[str, Path]:
    """Dotted module name -> file, for every module under `src`."""
    found = {}
    for path in sorted(src.rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def import_graph(found: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the package modules it imports. A module's import of its own enclosing
    package is left out: Python always initialises the package first, which is how a
    package's __init__ shares names with its submodules."""
    graph: dict[str, set[str]] = {name: set() for name in found}
    for name, path in found.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
            for target in targets:
                if target in found and target != name and not name.startswith(target + "."):
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_package_has_no_import_cycles():
    found = cycles(import_graph(modules()))
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_a_cycle_is_found(tmp_path):
    """The check can fail: two modules that import each other, one of them lazily."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "cli.py").write_text("from pkg.sub import cli as sub\n")
    (package / "sub" / "cli.py").write_text("def f():\n    from ..cli import _duration\n")
    (package / "other.py").write_text("import pkg.cli\n")
    assert cycles(import_graph(modules(tmp_path))) == [["pkg.cli", "pkg.sub.cli"]]


# Imports the third-party libraries once, then each module named on the command line in a fork
# of that interpreter: the module is the first trainprof module the child imports, and the
# seconds torch and the frameworks take to import are paid once, not once per module.
FORKS = r"""
import importlib, os, sys, traceback
for library in sys.argv[1].split(","):
    importlib.import_module(library)
assert not [m for m in sys.modules if m.partition(".")[0] == "trainprof"], "trainprof imported"
for name in sys.argv[2:]:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            importlib.import_module(name)
            message = ""
        except BaseException as e:
            message = traceback.format_exception_only(e)[-1].strip()
        os.write(write, message.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as answer:
        message = answer.read().decode()
    os.waitpid(pid, 0)
    if message:
        print(f"{name}: {message}")
"""
# What trainprof's modules import from outside the standard library (pyproject's extras).
LIBRARIES = [
    "yaml", "numpy", "prometheus_client", "psutil", "pynvml", "grafanalib", "torch",
    "lightning", "transformers", "accelerate", "keras", "xgboost",
]  # fmt: skip


@pytest.mark.slow(reason="a fresh interpreter per module, every framework preloaded")
def test_every_module_imports_on_its_own():
    """Each module first, in a fresh interpreter: no module relies on another having been
    imported before it."""
    names = list(modules())  # trainprof.__main__ too: importing it must not run main()
    # Keras needs a backend; torch is the one installed beside it (as in test_integrations).
    env = {**os.environ, "KERAS_BACKEND": os.environ.get("KERAS_BACKEND", "torch")}
    result = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", FORKS, ",".join(LIBRARIES), *names],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert not result.stdout, result.stdout


def importers_of(package: str, found: dict[str, Path]) -> list[str]:
    """The modules that import `package` (or a module of it), at any level."""
    importers = []
    for name, path in found.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            if any(n == package or n.startswith(package + ".") for n in names):
                importers.append(name)
                break
    return importers


def test_grafanalib_stays_behind_the_house_style_module():
    """grafanalib is the dashboard generator, and `dashboards/panels.py` the one module that
    imports it (docs/dashboards.md): a dashboard module says what to show through it."""
    assert importers_of("grafanalib", modules()) == ["trainprof.dashboards.panels"]


def test_an_importer_is_found(tmp_path):
    """The check can fail: a second module importing grafanalib, lazily, is named."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "panels.py").write_text("from grafanalib import core\n")
    (package / "job.py").write_text("def f():\n    import grafanalib.core\n")
    assert importers_of("grafanalib", modules(tmp_path)) == ["pkg.job", "pkg.panels"]


def test_a_module_that_needs_another_imported_first_is_found(tmp_path):
    """The check can fail: a module that reads a sibling it never imported."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("X = 1\n")
    (package / "b.py").write_text("import pkg\nY = pkg.a.X\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-c", FORKS, "json", "pkg.a", "pkg.b"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("pkg.b: AttributeError"), result.stdout
