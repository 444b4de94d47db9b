"""The repository's shape, read from every Python file with ``ast`` (nothing is imported):

* no file changes ``sys.path`` (a command runs as ``python -m PACKAGE.NAME`` from the root, a
  child process gets ``cwd`` or ``PYTHONPATH``), also in the child scripts that tests keep in
  strings;
* no experiment of ``benchmarks/`` imports another: an experiment imports the ``seq2seq``
  package and the shared modules (``SHARED``), and those import no experiment;
* no import cycle among the repository's modules (``seq2seq``, ``benchmarks``, ``tools``, the
  tests), counting every import that runs (inside functions too, not under ``TYPE_CHECKING``);
* outside the package, no train step assembled by hand (``train_context`` builds it).

A failure names the file and line of each offending statement.
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("seq2seq", "benchmarks", "tools")
# benchmarks/ modules that are shared by the experiments and never run on their own
SHARED = {"__init__", "harness", "peers", "presets", "quality_records"}
PATH_CHANGES = {"insert", "append", "extend", "remove", "clear", "pop"}


@dataclass(frozen=True)
class Import:
    target: str  # the repository module it loads
    path: Path
    line: int

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def python_files() -> list[Path]:
    files = [p for pkg in (*PACKAGES, "tests") for p in (ROOT / pkg).rglob("*.py")]
    return sorted(p for p in files if "__pycache__" not in p.parts)


def module_name(path: Path) -> str:
    """``seq2seq/data/pipeline.py`` → ``seq2seq.data.pipeline``; a test module by its bare
    name (pytest puts ``tests/`` on the path: ``from conftest import ...``)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] == "tests":
        parts = parts[1:]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _under_type_checking(tree: ast.AST) -> set[int]:
    """ids of the statements in ``if TYPE_CHECKING:`` blocks (they never run)."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skip


def imports(path: Path, modules: set[str]) -> list[Import]:
    """The repository modules ``path`` imports, each with its line (``from a import b`` is
    ``a.b`` where that is a module, else ``a``; a relative import is resolved first)."""
    tree, name = parse(path), module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    skip = _under_type_checking(tree)
    out = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names
            ]
        else:
            continue
        for target in targets:
            # ``import a.b.c`` of a module outside the repository is none of our business
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.append(Import(target, path, node.lineno))
    return out


def _path_changes(tree: ast.AST) -> Iterator[int]:
    """Lines that change ``sys.path``: a call of one of its list methods, an assignment to it
    or to a slice of it; the same inside string constants that parse as Python (the child
    scripts of tests)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in PATH_CHANGES and ast.unparse(node.func.value) == "sys.path":
                yield node.lineno
        elif isinstance(node, ast.Assign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if ast.unparse(t).startswith("sys.path"):
                    yield node.lineno
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if "sys.path" in node.value:
                try:
                    inner = ast.parse(textwrap.dedent(node.value))
                except SyntaxError:
                    continue
                for line in _path_changes(inner):
                    yield node.lineno + line - 1


def test_nothing_changes_sys_path():
    found = [
        f"{p.relative_to(ROOT)}:{line}"
        for p in python_files()
        for line in sorted(set(_path_changes(parse(p))))
    ]
    assert not found, (
        "sys.path is changed (run the command as python -m PACKAGE.NAME from the repository "
        "root, or give a child process cwd / PYTHONPATH): " + ", ".join(found)
    )


def test_no_experiment_imports_another():
    modules = {module_name(p) for p in python_files()}
    experiments = {
        f"benchmarks.{p.stem}" for p in (ROOT / "benchmarks").glob("*.py") if p.stem not in SHARED
    }
    assert "benchmarks.benchmark" in experiments and "benchmarks.harness" not in experiments
    found = []
    for path in python_files():
        name = module_name(path)
        if not name.startswith(("benchmarks", "tools")):
            continue  # the tests may run any experiment
        for imp in imports(path, modules):
            if imp.target in experiments:
                found.append(f"{imp.where()} ({name} imports {imp.target})")
    assert not found, (
        "an experiment (or a shared module or a tool) imports an experiment; move what they "
        f"share into a shared module of benchmarks/ ({', '.join(sorted(SHARED))}): "
        + "; ".join(found)
    )


def test_no_import_cycle():
    files = {module_name(p): p for p in python_files()}
    modules = set(files)
    graph: dict[str, list[Import]] = {m: imports(p, modules) for m, p in files.items()}
    # Depth-first search; a back edge closes a cycle, reported by the imports along it.
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[Import] = []
    cycles: list[list[Import]] = []

    def visit(module: str) -> None:
        state[module] = 1
        for imp in graph[module]:
            if state.get(imp.target) == 1:
                start = next((i + 1 for i, s in enumerate(stack) if s.target == imp.target), 0)
                cycles.append([*stack[start:], imp])
            elif imp.target not in state:
                stack.append(imp)
                visit(imp.target)
                stack.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    text = [" → ".join(f"{i.target} ({i.where()})" for i in c) for c in cycles]
    assert not cycles, "import cycles (each: the module imported, from file:line):\n" + "\n".join(
        text
    )


# the pieces of a train step that only seq2seq.training.context assembles into one
STEP_PARTS = {"create_train_state", "make_optimizer", "make_train_step", "sharded_train_step"}


def test_benchmarks_tools_and_examples_take_the_training_loops_step():
    """Outside the package, a train step comes from ``train_context`` (``harness.train_step``
    in the benchmarks): nothing assembles model, optimizer and step by hand, so what a
    benchmark times is what ``seq2seq-train`` runs."""
    files = [p for d in ("benchmarks", "tools", "examples") for p in (ROOT / d).rglob("*.py")]
    assert any(p.name == "presets.py" for p in files)
    found = []
    for path in files:
        for node in ast.walk(parse(path)):
            names = []
            if isinstance(node, ast.ImportFrom):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.Attribute):
                names = [node.attr]
            found += [
                f"{path.relative_to(ROOT)}:{node.lineno} ({n})" for n in names if n in STEP_PARTS
            ]
    assert not found, (
        "a train step assembled by hand (use seq2seq.training.context.train_context, or "
        "benchmarks.harness.train_step): " + ", ".join(found)
    )
