"""Layers point one way: cli → run → training / evaluation / translation → model / decoding /
data / sharding → config. The check reads every module's own imports (``ast``, including
imports inside functions), so a lower layer importing a higher one fails here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "seq2seq"

# Modules (and packages, by prefix) by layer, lowest first. A module missing here fails
# ``test_every_module_has_a_layer``: a new module has to say where it sits.
LAYERS: dict[str, int] = {
    "seq2seq": 0,
    "seq2seq.config": 0,
    "seq2seq.workdir": 0,
    "seq2seq.kernels": 0,
    "seq2seq.reference": 0,
    "seq2seq.model": 1,
    "seq2seq.decoding": 1,
    "seq2seq.data": 1,
    "seq2seq.sharding": 1,
    "seq2seq.training": 2,
    "seq2seq.evaluation": 2,
    "seq2seq.translation": 2,
    "seq2seq.search": 2,
    "seq2seq.trained": 2,
    "seq2seq.alignment": 2,
    "seq2seq.ct2_converter": 2,
    "seq2seq.run": 3,
    "seq2seq.inference": 3,
    "seq2seq.resolve": 3,
    "seq2seq.summary": 3,
    "seq2seq.plots": 3,
    "seq2seq.serve": 3,
    "seq2seq.export": 3,
    "seq2seq.marian": 3,
    "seq2seq.bulk": 3,
    "seq2seq.plan": 3,
    "seq2seq.cli": 4,
    "seq2seq.__main__": 4,
}
NAMES = [
    "config",
    "model / decoding / data / sharding",
    "training / evaluation / translation",
    "run (the application)",
    "cli",
]


def layer(module: str) -> int | None:
    """The layer of ``module``: its own entry or its nearest package's."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        name = ".".join(parts[:n])
        if name in LAYERS and (n > 1 or module == "seq2seq"):
            return LAYERS[name]
    return None


def module_name(path: Path, root: Path = PACKAGE) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(source: str, module: str, is_package: bool = False) -> set[str]:
    """The ``seq2seq`` modules a module's source imports (``from seq2seq import x`` counts as
    ``seq2seq.x``; relative imports are resolved against ``module``)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)  # submodules, if they are
    return {m for m in found if m == "seq2seq" or m.startswith("seq2seq.")}


def violations(sources: dict[str, tuple[str, bool]]) -> list[str]:
    """``importer (layer) imports imported (layer)`` for every upward import among
    ``sources`` (module → (source, is_package)). Names that are attributes, not modules
    (``from seq2seq.config import Config``), are resolved to their module."""
    known = set(sources)
    out = []
    for module, (source, is_package) in sorted(sources.items()):
        own = layer(module)
        targets = set()
        for target in imports(source, module, is_package):
            while target not in known and "." in target:  # an attribute: its module
                target = target.rsplit(".", 1)[0]
            targets.add(target)
        for target in sorted(targets):
            other = layer(target)
            if own is not None and other is not None and other > own:
                out.append(f"{module} ({NAMES[own]}) imports {target} ({NAMES[other]})")
    return out


def _package_sources() -> dict[str, tuple[str, bool]]:
    return {
        module_name(p): (p.read_text(encoding="utf-8"), p.name == "__init__.py")
        for p in sorted(PACKAGE.rglob("*.py"))
    }


def test_every_module_has_a_layer():
    assert [m for m in _package_sources() if layer(m) is None] == []


def test_no_module_imports_from_a_layer_above_it():
    assert violations(_package_sources()) == []


@pytest.mark.parametrize(
    "module, source, bad",
    [
        ("seq2seq.training.loop", "from seq2seq.translation import Translator", False),
        ("seq2seq.training.loop", "from seq2seq import run", True),
        (
            "seq2seq.model.layers",
            "def f():\n    from seq2seq.training.step import train_step",
            True,
        ),
        ("seq2seq.config", "import seq2seq.sharding", True),
        ("seq2seq.training.loop", "from ..cli import train_main", True),
        ("seq2seq.cli", "from seq2seq.run import train", False),
    ],
)
def test_the_check_fails_on_an_upward_import(module, source, bad):
    sources = {**_package_sources(), module: (source, False)}
    found = [v for v in violations(sources) if v.startswith(module + " ")]
    assert bool(found) == bad, found


def test_training_knows_only_steps():
    """Dev BLEU reaches the loop as a callable: training never decodes or scores."""
    sources = _package_sources()
    for module, (source, is_package) in sources.items():
        if module.startswith("seq2seq.training"):
            found = imports(source, module, is_package)
            assert not {
                m for m in found if m.startswith(("seq2seq.translation", "seq2seq.evaluation"))
            }, module


def test_the_layering_before_the_run_layer_fails():
    """The tree before this change: workdir.py (paths) imported training, and training
    imported translation; both are reported."""
    old_workdir = (
        "from seq2seq.training.checkpoints import Checkpointer\n"
        "from seq2seq.training.step import TrainState\n"
    )
    found = violations({**_package_sources(), "seq2seq.workdir": (old_workdir, False)})
    assert found == [
        "seq2seq.workdir (config) imports seq2seq.training.checkpoints "
        "(training / evaluation / translation)",
        "seq2seq.workdir (config) imports seq2seq.training.step "
        "(training / evaluation / translation)",
    ]
