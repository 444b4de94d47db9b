"""``python -m benchmarks.benchmark --long`` (benchmarks/long_inputs.py) runs and reports what
its docs say: memory_analysis of dense and chunked per length, the notes' n² × 2-byte figures,
the curve."""

import json
import subprocess
import sys

import pytest
from tiny_run import ROOT


@pytest.mark.slow  # a subprocess compiling 4 programs (~20 s)
def test_long_benchmark_runs_and_reports_the_growth(tmp_path):
    out, png = tmp_path / "long.json", tmp_path / "curve.png"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.benchmark",
            "--long",
            "--lengths",
            "1024,2048",
            "--kinds",
            "layer",
            "--q-block",
            "64",
            "--kv-block",
            "64",
            "--no-run",
            "--png",
            str(png),
            "--out",
            str(out),
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())["sweep"]["layer"]
    temp = {(r["attention"], r["n"]): r["temp_bytes"] for r in rows}
    assert set(temp) == {(a, n) for a in ("dense", "chunked") for n in (1024, 2048)}
    assert temp["dense", 2048] / temp["dense", 1024] > 3.5  # n²: 4×
    assert temp["chunked", 2048] / temp["chunked", 1024] < 2.2  # n: 2×
    assert all(r["note"] == "not run (--no-run)" for r in rows)
    assert "| 1,024 | 2.0 MiB |" in proc.stdout  # the notes' figure: 1024² × 2 bytes
    assert png.stat().st_size > 10_000
