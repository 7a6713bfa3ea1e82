"""Engine kinds are named in one place: omni/engines/kinds.py.

The table there says, per kind, what the config check, default devices, the fork
server's preload, the session stages and the engine builder need. A kind named anywhere
else in omni/ is a second table that adding a kind would miss. Kind names are also
ordinary words ("policy", "echo"), so the scan (AST, over the source) looks only at the
positions where a string is used as an engine kind:

- compared with, or tested for membership in, something whose source says ``engine`` or
  ``kind`` (``spec.engine == "echo"``, ``stage.engine in ("ar", ...)``);
- a literal collection (tuple, list, set, dict keys) holding two or more kind names: a
  table of kinds;
- an upper-case constant whose name says ENGINE or KIND, given a kind name
  (``CPU_ENGINES = ("echo",)``).

So ``{"policy": "pi0"}`` (an adapter's info), ``open("policy", ...)`` (a session kind)
and an error text naming its own engine pass. The checker runs on a directory, so a
synthetic tree proves it can fail.
"""

from __future__ import annotations

import ast
from pathlib import Path

from omni.engines.kinds import ENGINE_KINDS, KINDS, STATEFUL_KINDS, default_device, preloads

REPO_ROOT = Path(__file__).resolve().parents[2]
REGISTRY = "omni/engines/kinds.py"


def _names_a_kind(node: ast.AST, kinds: frozenset[str]) -> bool:
    """A kind-name string, or a literal collection with one in it."""
    if isinstance(node, ast.Constant):
        return node.value in kinds
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_a_kind(e, kinds) for e in node.elts)
    return False


def _kind_strings(node: ast.AST | None, kinds: frozenset[str]) -> set[str]:
    elts = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", [])
    return {e.value for e in elts if isinstance(e, ast.Constant) and e.value in kinds}


def _about_kinds(node: ast.AST) -> bool:
    source = ast.unparse(node).lower()
    return "engine" in source or "kind" in source


def _violation(node: ast.AST, kinds: frozenset[str]) -> str | None:
    """Why this node names an engine kind, or None."""
    if isinstance(node, ast.Compare):
        operands = [node.left, *node.comparators]
        if any(_names_a_kind(o, kinds) for o in operands) \
                and any(_about_kinds(o) for o in operands if not _names_a_kind(o, kinds)):
            return f"compares with an engine kind: {ast.unparse(node)}"
    elif isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
        named = _kind_strings(node, kinds)
        if len(named) >= 2:
            return f"a table of engine kinds: {', '.join(sorted(named))}"
    elif isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        constants = [t.id for t in targets if isinstance(t, ast.Name) and t.id.isupper()
                     and ("ENGINE" in t.id or "KIND" in t.id)]
        if constants and node.value is not None and any(
                _names_a_kind(n, kinds) for n in ast.walk(node.value)):
            return f"a constant of engine kinds: {constants[0]}"
    return None


def kind_violations(root: Path, kinds: frozenset[str] = frozenset(KINDS),
                    registry: str = REGISTRY) -> list[str]:
    """'file:line: why' for every engine kind named outside the registry, under root/omni."""
    found = []
    for path in sorted((root / "omni").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel == registry or "__pycache__" in path.parts:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
        named = [(node.lineno, why) for node in ast.walk(tree)
                 if (why := _violation(node, kinds)) is not None]
        found += [f"{rel}:{line}: {why}" for line, why in sorted(named)]
    return found


def test_engine_kinds_are_named_only_in_the_registry():
    violations = kind_violations(REPO_ROOT)
    assert not violations, ("engine kinds are named in omni/engines/kinds.py only (read "
                            "KINDS there):\n  " + "\n  ".join(violations))


def test_the_scan_sees_the_package():
    # a scan that found no file would pass; the registry itself names every kind
    assert kind_violations(REPO_ROOT, registry="none") != []
    assert any(v.startswith(REGISTRY) for v in kind_violations(REPO_ROOT, registry="none"))


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_the_checker_catches_each_way_of_naming_a_kind(tmp_path):
    _write(tmp_path, "omni/engines/kinds.py", 'KINDS = {"ar": 1, "echo": 2}\n')
    _write(tmp_path, "omni/runtime/bad.py",
           'def f(spec, stage, kind):\n'
           '    if spec.engine == "echo":\n'                      # line 2
           '        return 1\n'
           '    if stage.engine not in ("ar", "policy"):\n'       # line 4: and a table
           '        return 2\n'
           '    return "vllm" != kind\n'                          # line 6
           'CPU_ENGINES = ("echo",)\n'                            # line 7
           'BUILDERS = {"diffusion": 1, "generation": 2}\n')      # line 8
    assert kind_violations(tmp_path) == [
        "omni/runtime/bad.py:2: compares with an engine kind: spec.engine == 'echo'",
        "omni/runtime/bad.py:4: a table of engine kinds: ar, policy",
        "omni/runtime/bad.py:4: compares with an engine kind: "
        "stage.engine not in ('ar', 'policy')",
        "omni/runtime/bad.py:6: compares with an engine kind: 'vllm' != kind",
        "omni/runtime/bad.py:7: a constant of engine kinds: CPU_ENGINES",
        "omni/runtime/bad.py:8: a table of engine kinds: diffusion, generation",
    ]


def test_the_checker_leaves_ordinary_words_alone(tmp_path):
    _write(tmp_path, "omni/models/fine.py",
           'VOICES = {"alloy", "echo", "fable"}\n'            # one kind name: a word
           'def info(self, sessions, params, mode):\n'
           '    sessions.open("policy", params)\n'             # a session kind
           '    if mode == "policy":\n'                         # not about engines
           '        return {"policy": "pi0"}\n'
           '    raise ValueError("engine \'vllm\' needs a model_dir")\n')
    assert kind_violations(tmp_path) == []


def test_the_table_answers_what_each_place_asks():
    assert ENGINE_KINDS == tuple(KINDS)
    assert STATEFUL_KINDS == {"ar", "policy", "diffusion"}
    assert default_device("echo") == "cpu" and default_device("ar") == "auto"
    assert default_device("unknown") == default_device(None) == "auto"
    assert not preloads(["echo", "echo"]) and preloads(["echo", "ar"])
    # every builder names a module:function under its own engine package
    for name, kind in KINDS.items():
        module, _, function = kind.builder.partition(":")
        assert function and module.startswith("omni.engines."), name
        source = (REPO_ROOT / (module.replace(".", "/") + ".py")).read_text()
        assert any(isinstance(node, ast.FunctionDef) and node.name == function
                   for node in ast.parse(source).body), kind.builder
