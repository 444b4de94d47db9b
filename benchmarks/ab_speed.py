#!/usr/bin/env python3
"""Equal-work training speed of two checkouts of this repository, run alternately (issue 36:
"equal-work speed before/after in one run within noise").

Each round runs ``python -m benchmarks.benchmark --only train --preset tatoeba`` (in older
checkouts ``scripts/benchmark.py``) of checkout A, then of checkout B (each its own code, from
its own directory): the shipped preset's train step on the real corpus with packing,
``--steps`` timed steps after ``--warmup``, bfloat16 matmul operands as the preset trains. It
prints each run's median step time and, per checkout, the median over the rounds and their
ratio B / A, with the date and machine.

Usage::

    python -m benchmarks.ab_speed --a /path/to/old/checkout --b . --rounds 3 --steps 20
    python -m benchmarks.ab_speed --a . --b . --rounds 1 --steps 1 --smoke   # seconds

``--smoke`` passes the benchmark's ``--smoke`` (its preset shrunk to a tiny model on a corpus
subset): it checks that the script works, not the speed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from benchmarks.harness import cpus_line


def _medians(node) -> list[float]:
    """Every ``step_seconds.median`` in a benchmark report."""
    if isinstance(node, dict):
        found = [node["step_seconds"]["median"]] if "step_seconds" in node else []
        return found + [m for k, v in node.items() if k != "step_seconds" for m in _medians(v)]
    if isinstance(node, list):
        return [m for v in node for m in _medians(v)]
    return []


def step_time(checkout: Path, steps: int, warmup: int, cache: Path, smoke: bool = False) -> float:
    """Median seconds per train step of ``checkout``'s benchmark of the preset (of its tiny
    version with ``smoke``)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.json"
        moved = (checkout / "benchmarks" / "benchmark.py").exists()
        script = ["-m", "benchmarks.benchmark"] if moved else ["scripts/benchmark.py"]  # older
        cmd = [
            sys.executable,
            *script,
            "--only",
            "train",
            "--preset",
            "tatoeba",
            "--steps",
            str(steps),
            "--warmup",
            str(warmup),
            "--matmul-dtype",
            "bfloat16",
            "--cache-dir",
            str(cache),
            "--out",
            str(out),
            *(["--smoke"] if smoke else []),
        ]
        env = {**os.environ, "PYTHONPATH": str(checkout)}
        subprocess.run(cmd, cwd=checkout, env=env, check=True, capture_output=True)
        (median,) = _medians(json.loads(out.read_text()))
        return median


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--a", required=True, type=Path, help="checkout A (e.g. before a change)")
    p.add_argument("--b", required=True, type=Path, help="checkout B (e.g. after it)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--smoke", action="store_true", help="the benchmark's tiny preset (a check)")
    a = p.parse_args(argv)
    times: dict[str, list[float]] = {"A": [], "B": []}
    with tempfile.TemporaryDirectory() as caches:
        for r in range(a.rounds):
            for name, checkout in (("A", a.a), ("B", a.b)):
                cache = Path(caches) / name  # each checkout keeps its own token cache
                t = step_time(checkout.resolve(), a.steps, a.warmup, cache, a.smoke)
                times[name].append(t)
                print(f"round {r + 1} {name}: {t:.3f} s/step", file=sys.stderr, flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    machine = cpus_line()
    print(f"{when}, {machine}, load average at the end {os.getloadavg()[0]:.2f}")
    print(f"A = {a.a}: {', '.join(f'{t:.3f}' for t in times['A'])} s/step (median {med['A']:.3f})")
    print(f"B = {a.b}: {', '.join(f'{t:.3f}' for t in times['B'])} s/step (median {med['B']:.3f})")
    print(f"B / A = {med['B'] / med['A']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
