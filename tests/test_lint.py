"""The code is formatted and lint-clean (ruff) and type-checks (mypy), with the settings in
pyproject.toml. Both tools come with the ``test`` extra."""

import importlib.util
import subprocess
import sys
import tomllib

import pytest
from tiny_run import ROOT

PATHS = ["seq2seq", "benchmarks", "tools", "examples", "tests"]


def _run(*args: str) -> subprocess.CompletedProcess:
    module = args[0]
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed: pip install -e '.[test]'")
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


def test_ruff_format():
    proc = _run("ruff", "format", "--check", *PATHS)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_lint():
    proc = _run("ruff", "check", *PATHS)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy():
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    files = settings["tool"]["mypy"]["files"]
    assert set(files) >= set(PATHS) - {"tests"}, files  # the package, the experiments, the tools
    proc = _run("mypy")  # files and options: [tool.mypy] in pyproject.toml
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr
