"""Import boundaries between the omni packages, checked statically over the source (AST).

- omni/models/ (model adapters) may use omni.engines.base, the engines' contract, and no
  other omni.engines module;
- omni/engines/ never imports the orchestrator or the HTTP side (omni.runtime, omni.api,
  omni.server, omni.session);
- omni/runtime/ never imports the HTTP side (omni.api, omni.server);
- omni/engines/ holds base.py, kinds.py, proc.py, __init__.py and engine packages,
  nothing else at its top level, and no file under omni/ is named ar_* (the pre-rearrangement layout).

Every import counts: module level, inside functions, under ``if TYPE_CHECKING:``, relative
ones (resolved), and ``importlib.import_module("...")`` / ``__import__("...")`` calls with
a literal name. The checker runs on a directory, so a synthetic tree proves it can fail.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "omni"

# directories that hold no source of their own (stale bytecode of moved modules lives here)
_SKIP_DIRS = {"__pycache__"}

# rule -> (files whose module name starts with this, forbidden prefixes, allowed modules)
IMPORT_RULES = {
    "models-use-only-the-engine-contract": ("omni.models", ("omni.engines",),
                                            ("omni.engines.base",)),
    "engines-stay-below-runtime-and-api": ("omni.engines", ("omni.runtime", "omni.api",
                                                            "omni.server", "omni.session"),
                                           ()),
    "runtime-stays-below-api": ("omni.runtime", ("omni.api", "omni.server"), ()),
}
LAYOUT_RULE = "engines-layout"
RULES = (*IMPORT_RULES, LAYOUT_RULE)

# kinds.py: the table of engine kinds, read by the orchestrator and the config checks, so
# it must not sit inside an engine package (importing it would import that engine)
ENGINES_TOP_LEVEL_FILES = {"__init__.py", "base.py", "kinds.py", "proc.py"}


@dataclass(frozen=True)
class Import:
    file: str      # relative to the scanned root, e.g. omni/models/piper.py
    line: int
    module: str    # absolute dotted name, e.g. omni.engines.base

    def __str__(self) -> str:
        return f"{self.file}:{self.line} -> {self.module}"


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _source_files(root: Path, package: str) -> list[Path]:
    files = []
    for path in sorted((root / package).rglob("*.py")):
        if not _SKIP_DIRS.intersection(path.relative_to(root).parts):
            files.append(path)
    return files


def _module_name(root: Path, path: Path) -> tuple[str, bool]:
    """(dotted module name, whether the file is a package's __init__)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    if is_package:
        parts = parts[:-1]
    return ".".join(parts), is_package


def _literal_import_call(node: ast.Call) -> str | None:
    """The name in importlib.import_module("x") / import_module("x") / __import__("x")."""
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name not in ("import_module", "__import__") or not node.args:
        return None
    first = node.args[0]
    if isinstance(first, ast.Constant) and isinstance(first.value, str):
        return first.value
    return None


def collect_imports(root: Path, package: str = PACKAGE) -> list[Import]:
    """Every import of every .py file under root/package, as absolute module names."""
    files = _source_files(root, package)
    known = {_module_name(root, f)[0] for f in files}
    found: list[Import] = []
    for path in files:
        rel = path.relative_to(root).as_posix()
        module, is_package = _module_name(root, path)
        here = module if is_package else module.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
        for node in ast.walk(tree):  # walks function bodies and TYPE_CHECKING blocks too
            if isinstance(node, ast.Import):
                found.extend(Import(rel, node.lineno, alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts, up = here.split("."), node.level - 1
                    if up >= len(parts):
                        raise AssertionError(f"{rel}:{node.lineno}: relative import beyond "
                                             "the top-level package")
                    base = ".".join([*parts[:len(parts) - up], *filter(None, [node.module])])
                else:
                    base = node.module or ""
                for alias in node.names:
                    # `from pkg import sub` imports the module pkg.sub when it is one
                    sub = f"{base}.{alias.name}"
                    found.append(Import(rel, node.lineno, sub if sub in known else base))
            elif isinstance(node, ast.Call):
                name = _literal_import_call(node)
                if name is not None:
                    found.append(Import(rel, node.lineno, name))
    return found


def layout_violations(root: Path, package: str = PACKAGE) -> list[str]:
    """Files that break the engines layout, or carry the old ar_* names."""
    bad = []
    engines = root / package / "engines"
    if engines.is_dir():
        for entry in sorted(engines.iterdir()):
            rel = entry.relative_to(root).as_posix()
            if entry.name in _SKIP_DIRS or entry.name.startswith("."):
                continue
            if entry.is_file() and entry.suffix == ".py" \
                    and entry.name not in ENGINES_TOP_LEVEL_FILES:
                bad.append(f"{rel}: a module at the top of {package}/engines/ (only "
                           f"{', '.join(sorted(ENGINES_TOP_LEVEL_FILES))} and engine "
                           "packages belong there)")
            elif entry.is_dir() and not (entry / "__init__.py").is_file() \
                    and any(p for p in entry.rglob("*.py")
                            if not _SKIP_DIRS.intersection(p.parts)):
                bad.append(f"{rel}/: a directory of modules without __init__.py (not a "
                           "package)")
    for entry in sorted((root / package).rglob("ar_*")):
        if not _SKIP_DIRS.intersection(entry.relative_to(root).parts):
            bad.append(f"{entry.relative_to(root).as_posix()}: named ar_* (AR engine code "
                       f"lives in {package}/engines/ar/)")
    return bad


def check_tree(root: Path, package: str = PACKAGE) -> dict[str, list[str]]:
    """rule -> its violations (file:line -> module, or a layout message); empty: clean."""
    imports = collect_imports(root, package)
    report: dict[str, list[str]] = {}
    for rule, (owner, forbidden, allowed) in IMPORT_RULES.items():
        owner_dir = owner.replace(".", "/") + "/"
        report[rule] = [
            str(imp) for imp in imports
            if (imp.file.startswith(owner_dir) or imp.file == owner_dir[:-1] + ".py")
            and any(_under(imp.module, prefix) for prefix in forbidden)
            and not any(_under(imp.module, ok) for ok in allowed)
        ]
    report[LAYOUT_RULE] = layout_violations(root, package)
    return report


_EXPLAIN = {
    "models-use-only-the-engine-contract":
        "omni/models/ may import omni.engines.base (the contract) and no other omni.engines "
        "module; move what it needs into omni/engines/base.py or into omni/models/",
    "engines-stay-below-runtime-and-api":
        "omni/engines/ runs inside engine processes and must not import omni.runtime, "
        "omni.api, omni.server or omni.session",
    "runtime-stays-below-api":
        "omni/runtime/ must not import omni.api or omni.server (the HTTP front end sits on "
        "top of it)",
    LAYOUT_RULE:
        "omni/engines/ holds base.py, kinds.py, proc.py, __init__.py and one package per "
        "engine kind (or shared by kinds, as proc/ and quantization/); "
        "no file under omni/ is named ar_*",
}


def _failure(rule: str, violations: list[str]) -> str:
    return f"{rule}: {_EXPLAIN[rule]}\n  " + "\n  ".join(violations)


# ---------------------------------------------------------------------------- the real tree

@pytest.fixture(scope="module")
def real_report() -> dict[str, list[str]]:
    assert (REPO_ROOT / PACKAGE / "__init__.py").is_file()
    return check_tree(REPO_ROOT)


def test_the_scan_sees_the_package(real_report):
    imports = collect_imports(REPO_ROOT)
    files = {imp.file for imp in imports}
    # a scan that silently found nothing would pass every rule
    assert any(f.startswith("omni/models/") for f in files)
    assert any(f.startswith("omni/engines/") for f in files)
    assert any(f.startswith("omni/runtime/") for f in files)
    assert any(imp.module == "omni.engines.base" and imp.file.startswith("omni/models/")
               for imp in imports)


@pytest.mark.parametrize("rule", RULES)
def test_omni_respects(rule, real_report):
    assert not real_report[rule], _failure(rule, real_report[rule])


# ---------------------------------------------------------- the checker on a synthetic tree

def _write(root: Path, rel: str, text: str = "") -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _synthetic_tree(root: Path, *, clean: bool) -> None:
    for pkg in ("omni", "omni/engines", "omni/engines/ar", "omni/engines/proc",
                "omni/models", "omni/runtime", "omni/api", "omni/config"):
        _write(root, f"{pkg}/__init__.py")
    _write(root, "omni/engines/base.py", "class Engine: ...\n")
    _write(root, "omni/engines/ar/engine.py", "from omni.engines.base import Engine\n")
    # allowed: the contract, absolute and relative; models importing models; config
    _write(root, "omni/models/good.py",
           "from omni.engines.base import Engine\n"
           "from ..engines import base\n"
           "from . import other\n"
           "import omni.config\n")
    _write(root, "omni/models/other.py", "import omni.engines.base as b\n")
    _write(root, "omni/runtime/pool.py", "from omni.engines.proc import x\n")
    _write(root, "omni/api/app.py", "from omni.runtime import pool\n")
    if clean:
        return
    _write(root, "omni/models/bad.py",
           "from typing import TYPE_CHECKING\n"
           "\n"
           "if TYPE_CHECKING:\n"
           "    from omni.engines.ar.engine import AREngine\n"       # line 4
           "\n"
           "def f():\n"
           "    from ..engines import ar\n"                          # line 7
           "    from omni.engines import Engine\n"                   # line 8: the registry
           "    import importlib\n"
           "    return importlib.import_module('omni.engines.proc')\n")  # line 10
    _write(root, "omni/engines/ar/bad.py",
           "import os\n"
           "from ...runtime.pool import x\n"                         # line 2
           "def g():\n"
           "    import omni.api.app\n")                              # line 4
    _write(root, "omni/engines/proc/main.py", "from omni.session import s\n")
    _write(root, "omni/runtime/bad.py",
           "from omni import server\n"                               # line 1: omni/server.py
           "from omni.api.app import make\n")                        # line 2
    _write(root, "omni/server.py", "")
    _write(root, "omni/engines/channel.py", "")                      # not allowed at top
    _write(root, "omni/engines/loose/thing.py", "")                  # a non-package dir
    _write(root, "omni/engines/ar_engine.py", "")
    _write(root, "omni/runtime/ar_sampling.py", "")
    # stale bytecode is not source: ignored
    _write(root, "omni/engines/__pycache__/ar_engine.cpython-311.pyc", "")
    _write(root, "omni/engines/old/__pycache__/x.cpython-311.pyc", "")


def test_checker_accepts_a_clean_synthetic_tree(tmp_path):
    _synthetic_tree(tmp_path, clean=True)
    assert check_tree(tmp_path) == {rule: [] for rule in RULES}


def test_checker_catches_each_kind_of_violation(tmp_path):
    _synthetic_tree(tmp_path, clean=False)
    report = check_tree(tmp_path)
    assert sorted(report["models-use-only-the-engine-contract"]) == sorted([
        "omni/models/bad.py:4 -> omni.engines.ar.engine",
        "omni/models/bad.py:7 -> omni.engines.ar",
        "omni/models/bad.py:8 -> omni.engines",
        "omni/models/bad.py:10 -> omni.engines.proc",
    ])
    assert sorted(report["engines-stay-below-runtime-and-api"]) == sorted([
        "omni/engines/ar/bad.py:2 -> omni.runtime.pool",
        "omni/engines/ar/bad.py:4 -> omni.api.app",
        "omni/engines/proc/main.py:1 -> omni.session",
    ])
    assert sorted(report["runtime-stays-below-api"]) == sorted([
        "omni/runtime/bad.py:1 -> omni.server",
        "omni/runtime/bad.py:2 -> omni.api.app",
    ])
    layout = report[LAYOUT_RULE]
    # ar_engine.py breaks both layout rules: a top-level engines module, and an ar_* name
    assert sorted(v.split(": ")[0] for v in layout) == [
        "omni/engines/ar_engine.py", "omni/engines/ar_engine.py", "omni/engines/channel.py",
        "omni/engines/loose/", "omni/runtime/ar_sampling.py"], "\n".join(layout)
    assert not any("__pycache__" in v or "omni/engines/old" in v for v in layout)
    # and the failure message names the rule, the reason and every offender
    message = _failure("runtime-stays-below-api", report["runtime-stays-below-api"])
    assert message.startswith("runtime-stays-below-api: omni/runtime/ must not import")
    assert "omni/runtime/bad.py:2 -> omni.api.app" in message
