"""No import cycles among omni modules, checked statically over the source (AST).

The graph has one node per module (a package is its ``__init__.py``) and one edge per
import that test_import_boundaries.collect_imports finds: module level, inside
functions, under ``if TYPE_CHECKING:``, relative ones, and ``importlib.import_module`` /
``__import__`` calls with a literal name. A lazy or annotation-only import is still a
dependency: hiding one in a function does not make a layer lower. Any strongly connected
component of more than one module, or a module that imports itself, fails the test, and
the failure names every module of each cycle and the import lines inside it.

What an edge points at:

- ``import a.b.c`` where ``a.b.c`` is a module: an edge to ``a.b.c``;
- ``from a.b import c`` where ``a.b.c`` is a module: edges to ``a.b.c`` and to ``a.b``
  (the statement names the package; a submodule of ``a.b`` that does this while
  ``a.b``'s __init__ imports that submodule is a cycle: write ``import a.b.c as c``);
- ``from pkg import name`` where ``name`` is not a submodule (a class, a function, a
  re-export): an edge to ``pkg``, the package's ``__init__.py``, since that is the code
  that must run to hand ``name`` over. So a package whose ``__init__`` re-exports a
  submodule's names, while that submodule imports the package, is a cycle;
- the parent packages that Python also initialises on the way to ``a.b.c`` (``a``,
  ``a.b``) are not edges: the importing module names ``a.b.c`` as what it needs, not
  ``a.b``'s ``__init__``. Counting them would make every model adapter (which imports
  omni.engines.base) depend on the engine-kind registry in omni/engines/__init__.py;
- names outside omni (the standard library, third-party packages) are not nodes.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest
from test_import_boundaries import (
    PACKAGE,
    REPO_ROOT,
    _module_name,
    _source_files,
    _write,
    collect_imports,
)

Graph = dict[str, dict[str, list[str]]]  # module -> imported module -> ["file:line", ...]


def import_graph(root: Path, package: str = PACKAGE) -> Graph:
    """Every omni module under root/package and the omni modules it imports."""
    known = {_module_name(root, path)[0] for path in _source_files(root, package)}
    graph: Graph = {module: defaultdict(list) for module in known}
    for imp in collect_imports(root, package):
        target = _nearest_module(imp.module, known)
        if target is not None:
            source = _module_name(root, root / imp.file)[0]
            graph[source][target].append(f"{imp.file}:{imp.line}")
    for source, target, where in _from_package_imports(root, package, known):
        graph[source][target].append(where)
    return graph


def _from_package_imports(root: Path, package: str, known: set[str]):
    """``from pkg import sub``: the statement names ``pkg`` as what it imports from, so
    it is an edge to ``pkg``'s __init__ as well as to ``pkg.sub`` (write ``import
    pkg.sub as sub`` to depend on the submodule alone)."""
    for path in _source_files(root, package):
        source, is_package = _module_name(root, path)
        here = source if is_package else source.rpartition(".")[0]
        rel = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = node.module or ""
            if node.level:
                parts = here.split(".")
                base = ".".join([*parts[:len(parts) - node.level + 1], *filter(None, [base])])
            if base in known and base != source and any(
                    f"{base}.{alias.name}" in known for alias in node.names):
                yield source, base, f"{rel}:{node.lineno}"


def _nearest_module(name: str, known: set[str]) -> str | None:
    """``name`` itself when it is a module here, else its closest enclosing one (an
    importlib literal can name an attribute path); None outside the package."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def strongly_connected(graph: Graph) -> list[list[str]]:
    """Tarjan's algorithm; each component's modules sorted, components in found order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(graph[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while not component or component[-1] != module:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def cycles(graph: Graph) -> list[list[str]]:
    """The components that are cycles: more than one module, or one importing itself."""
    return sorted(c for c in strongly_connected(graph)
                  if len(c) > 1 or c[0] in graph[c[0]])


def describe(graph: Graph, cycle: list[str]) -> str:
    """The cycle's modules, then each import that keeps it closed."""
    members = set(cycle)
    lines = [f"cycle of {len(cycle)}: {', '.join(cycle)}"]
    for source in cycle:
        for target in sorted(members.intersection(graph[source])):
            where = dict.fromkeys(graph[source][target])  # one line may name several
            lines.append(f"    {source} -> {target}  ({', '.join(where)})")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- the real tree

@pytest.fixture(scope="module")
def real_graph() -> Graph:
    assert (REPO_ROOT / PACKAGE / "__init__.py").is_file()
    return import_graph(REPO_ROOT)


def test_the_graph_sees_the_package(real_graph):
    # a scan that silently found nothing would have no cycles
    assert len(real_graph) > 100
    assert "omni.engines.base" in real_graph["omni.models.hf_causal"]
    assert "omni.api.routes" in real_graph["omni.api.app"]


def test_omni_has_no_import_cycles(real_graph):
    found = cycles(real_graph)
    assert not found, (
        "import cycles among omni modules (move what both sides need into a lower module; "
        "a package __init__ that re-exports must not be imported by its own submodules):\n"
        + "\n".join(describe(real_graph, c) for c in found))


# ---------------------------------------------------------- the checker on a synthetic tree

def _clean_tree(root: Path) -> None:
    for pkg in ("omni", "omni/low", "omni/high", "omni/reexp"):
        _write(root, f"{pkg}/__init__.py")
    _write(root, "omni/low/base.py", "import os\nclass Base: ...\n")
    _write(root, "omni/low/util.py", "from omni.low.base import Base\n")
    _write(root, "omni/high/app.py",
           "from omni.low import base, util\n"
           "from ..low.util import Base\n"
           "def f():\n"
           "    import importlib\n"
           "    return importlib.import_module('omni.low.base')\n")
    # a registry __init__ that lazily imports submodules which import a sibling: the
    # parent package is not an edge, so this is no cycle
    _write(root, "omni/reexp/__init__.py",
           "from omni.reexp.one import One\n"
           "def load():\n"
           "    from omni.reexp import two\n")
    _write(root, "omni/reexp/one.py", "from omni.reexp.two import Two\nclass One: ...\n")
    _write(root, "omni/reexp/two.py", "class Two: ...\n")


def _cyclic_tree(root: Path) -> None:
    _clean_tree(root)
    # three modules in a ring, closed by a function-local, a TYPE_CHECKING, a relative and
    # an importlib import
    _write(root, "omni/high/a.py", "def f():\n    from omni.high import b\n")
    _write(root, "omni/high/b.py",
           "from typing import TYPE_CHECKING\n"
           "if TYPE_CHECKING:\n"
           "    from .c import C\n")
    _write(root, "omni/high/c.py",
           "import importlib\n"
           "class C: ...\n"
           "A = importlib.import_module('omni.high.a')\n")
    # a package whose __init__ imports a submodule that takes a sibling `from` the package
    _write(root, "omni/side/__init__.py", "from omni.side.conn import Conn\n")
    _write(root, "omni/side/helper.py", "")
    _write(root, "omni/side/conn.py", "from omni.side import helper\nclass Conn: ...\n")
    # a package re-exporting a submodule that imports a name from the package
    _write(root, "omni/pkg/__init__.py", "from omni.pkg.sub import Sub\nNAME = 1\n")
    _write(root, "omni/pkg/sub.py", "from omni.pkg import NAME\nclass Sub: ...\n")
    # a module importing itself
    _write(root, "omni/low/selfish.py", "import omni.low.selfish\n")


def test_checker_accepts_a_clean_synthetic_tree(tmp_path):
    _clean_tree(tmp_path)
    graph = import_graph(tmp_path)
    assert cycles(graph) == []
    # `from omni.low import base, util` names omni.low too (its __init__ runs)
    assert set(graph["omni.high.app"]) == {"omni.low", "omni.low.base", "omni.low.util"}
    assert set(graph["omni.reexp"]) == {"omni.reexp.one", "omni.reexp.two"}


def test_checker_finds_each_kind_of_cycle(tmp_path):
    _cyclic_tree(tmp_path)
    graph = import_graph(tmp_path)
    assert cycles(graph) == [["omni.high.a", "omni.high.b", "omni.high.c"],
                             ["omni.low.selfish"],
                             ["omni.pkg", "omni.pkg.sub"],
                             ["omni.side", "omni.side.conn"]]
    message = describe(graph, ["omni.pkg", "omni.pkg.sub"])
    assert message.splitlines() == [
        "cycle of 2: omni.pkg, omni.pkg.sub",
        "    omni.pkg -> omni.pkg.sub  (omni/pkg/__init__.py:1)",
        "    omni.pkg.sub -> omni.pkg  (omni/pkg/sub.py:1)",
    ]
    assert "omni.high.c -> omni.high.a  (omni/high/c.py:3)" in describe(
        graph, ["omni.high.a", "omni.high.b", "omni.high.c"])


def test_the_real_test_fails_on_a_cycle(tmp_path):
    _cyclic_tree(tmp_path)
    with pytest.raises(AssertionError, match=r"cycle of 2: omni.pkg, omni.pkg.sub"):
        test_omni_has_no_import_cycles(import_graph(tmp_path))
