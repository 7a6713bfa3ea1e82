"""docs/architecture.md's request walk matches the code: every file its hop table names
exists and defines the function named beside it (``name`` at module level, or
``Class.method``), and every ``omni/...`` path the page mentions exists. A rename that
forgets the map fails here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DOC = REPO_ROOT / "docs" / "architecture.md"
WALK = "## One request, end to end"
# | 7 | `omni/runtime/orchestrator.py` | `Orchestrator.submit` | what happens |
HOP = re.compile(r"^\|\s*\d+\s*\|\s*`([^`]+)`\s*\|\s*`([^`]+)`\s*\|", re.M)
PATH = re.compile(r"`(omni/[\w/.]+)`")


def hops(text: str) -> list[tuple[str, str]]:
    """(file, function) of each row of the walk's table."""
    section = text.split(WALK, 1)[1].split("\n## ", 1)[0]
    return HOP.findall(section)


def defined_names(path: Path) -> set[str]:
    """Module-level functions and classes, and ``Class.method`` for their methods."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            names.update(f"{node.name}.{item.name}" for item in node.body
                         if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)))
    return names


def problems(text: str, root: Path) -> list[str]:
    found = []
    for file, function in hops(text):
        path = root / file
        if not path.is_file():
            found.append(f"{file}: no such file")
        elif function not in defined_names(path):
            found.append(f"{file}: defines no {function}")
    for mentioned in sorted(set(PATH.findall(text))):
        if not (root / mentioned.rstrip("/")).exists():
            found.append(f"{mentioned}: no such path")
    return found


def test_the_walk_names_what_exists():
    text = DOC.read_text(encoding="utf-8")
    assert len(hops(text)) >= 25  # the table was found and read
    assert problems(text, REPO_ROOT) == []


def test_the_check_fails_on_a_renamed_function_or_a_moved_file(tmp_path):
    (tmp_path / "omni").mkdir()
    (tmp_path / "omni" / "a.py").write_text(
        "def serve():\n    pass\n\n\nclass Loop:\n    def step(self):\n        pass\n")
    good = (f"{WALK}\n\n| # | file | function | what |\n|---|---|---|---|\n"
            "| 1 | `omni/a.py` | `serve` | x |\n| 2 | `omni/a.py` | `Loop.step` | y |\n")
    assert problems(good, tmp_path) == []
    bad = good.replace("`Loop.step`", "`Loop.run`").replace("`serve`", "`start`") + \
        "\nsee `omni/b.py`\n"
    assert problems(bad, tmp_path) == ["omni/a.py: defines no start",
                                       "omni/a.py: defines no Loop.run",
                                       "omni/b.py: no such path"]
