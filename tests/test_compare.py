"""scripts/compare.py on tiny shapes (``--smoke``): the peers build, convert and run beside ours,
and the JSON and the table have their layout. Speed is not asserted here (docs/benchmarks.md)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- compare.py table: begin -->", "<!-- compare.py table: end -->"
SYSTEMS = ("ours", "pytorch", "ct2_float32", "ct2_int8")
# Unoptimised XLA code compiles about twice as fast; a smoke run measures nothing.
FAST_XLA = {
    "XLA_FLAGS": "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
}


def test_without_the_extra_it_says_what_to_install(tmp_path):
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    proc = subprocess.run(
        [sys.executable, "scripts/compare.py", "--smoke"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "needs the optional extra 'compare' (torch" in proc.stderr
    assert "pip install -e '.[compare]'" in proc.stderr and "--index-url" in proc.stderr


def test_smoke_times_every_pair(tmp_path):
    for name in ("torch", "transformers", "ctranslate2"):
        pytest.importorskip(
            name,
            reason=f"{name} is not installed: it comes with the optional "
            "extra 'compare' (see .ci/run, which installs it)",
        )
    out, docs = tmp_path / "compare.json", tmp_path / "benchmarks.md"
    docs.write_text(f"before\n{BEGIN}\nold table\n{END}\nafter\n")
    proc = subprocess.run(
        [sys.executable, "scripts/compare.py", "--smoke", "--json", str(out), "--docs", str(docs)],
        cwd=ROOT,
        env={**os.environ, **FAST_XLA},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads(out.read_text())

    m = r["meta"]
    assert m["machine"]["cpu"] and m["threads"] >= 1 and m["date"]
    assert all(m["versions"][k] for k in ("jax", "flax", "torch", "transformers", "ctranslate2"))
    assert len(r["rounds"]) == m["rounds"] == 2
    s = r["summary"]["smoke"]
    assert set(s) == {"train", "beam4", "greedy"}
    assert set(s["train"]["figures"]) == {"ours", "pytorch"}
    for task in ("beam4", "greedy"):
        assert set(s[task]["figures"]) == set(SYSTEMS)
    for task, t in s.items():
        for system, f in t["figures"].items():
            assert f["n"] == 2 and 0 < f["min"] <= f["median"] <= f["max"], (task, system, f)
        assert set(t["ours_over"]) == set(t["figures"]) - {"ours"}
        assert t["goals"] == {}  # no goals on smoke shapes
    assert 0 < r["rounds"][0]["smoke"]["train"]["ours"]["mfu"] < 1

    text = docs.read_text()
    assert text.startswith(f"before\n{BEGIN}\nMeasured by `scripts/compare.py`")
    assert text.endswith(f"{END}\nafter\n") and "old table" not in text
    assert "| smoke | beam 4 | sentences/s |" in text and "| smoke | training |" in text
