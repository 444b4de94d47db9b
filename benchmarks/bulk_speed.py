#!/usr/bin/env python3
"""Sentences/s of bulk translation (``seq2seq-translate --output-dir``) against plain
``seq2seq-translate`` on the same file and run (issue 38).

Both commands run end to end as subprocesses (model load, tokenization, compilation, decoding,
writing), alternating ``--repeats`` times, each bulk run into a fresh output directory. The
first round fills a persistent XLA compilation cache (``JAX_COMPILATION_CACHE_DIR`` in a
temporary directory, shared by both commands), so later rounds time the work without the
compilations that dominate a short job on a CPU. It checks that both outputs are equal line
for line and prints a Markdown table: wall seconds, sentences/s (lines / wall) and, for bulk,
its report's decoding rate (after the model is loaded).

Usage::

    python -m benchmarks.bulk_speed --workdir RUN --input FILE --lines 5000 --chunk-lines 1000

Times on a shared machine are distorted by the other processes; alternating the commands
spreads that over both.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRANSLATE = (
    "import sys; from seq2seq.cli import translate_main; sys.exit(translate_main(sys.argv[1:]))"
)


def _run(args: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", TRANSLATE, *args], env=env, cwd=ROOT, capture_output=True, text=True
    )
    seconds = time.perf_counter() - start
    if proc.returncode:
        sys.exit(f"seq2seq-translate {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", required=True, help="a trained run")
    parser.add_argument("--step", type=int, help="its checkpoint (default: translate's)")
    parser.add_argument("--input", required=True, help="text file, one sentence per line")
    parser.add_argument("--lines", type=int, default=5000, help="its first N lines")
    parser.add_argument(
        "--chunk-lines", type=int, nargs="+", default=[1000], help="one bulk run per value"
    )
    parser.add_argument("--repeats", type=int, default=2, help="rounds of both commands")
    parser.add_argument("--json", help="write the measurements here")
    parser.add_argument(
        "--xla-cache",
        help="persistent compilation cache (default: a new one; reuse one to start warm)",
    )
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="bulk_speed_"))
    src = tmp / "input.txt"
    with open(args.input, encoding="utf-8") as f:
        src.write_text("".join(line for _, line in zip(range(args.lines), f)), encoding="utf-8")
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        JAX_COMPILATION_CACHE_DIR=args.xla_cache or str(tmp / "xla_cache"),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
    )
    model = ["--workdir", args.workdir] + (["--step", str(args.step)] if args.step else [])
    rows: list[dict] = []
    for r in range(args.repeats):
        plain_out = tmp / f"plain_{r}.txt"
        seconds = _run([*model, "--input", str(src), "--output", str(plain_out)], env)
        rows.append({"round": r, "command": "seq2seq-translate", "seconds": seconds})
        for chunk in args.chunk_lines:
            out_dir = tmp / f"bulk_{r}_{chunk}"
            bulk = ["--output-dir", str(out_dir), "--chunk-lines", str(chunk)]
            seconds = _run([*model, "--input", str(src), *bulk], env)
            report = json.loads((out_dir / "report.json").read_text(encoding="utf-8"))
            merged = (out_dir / "translations.txt").read_text(encoding="utf-8")
            rows.append(
                {
                    "round": r,
                    "command": f"--output-dir, {report['chunks']} chunk(s) of {chunk}",
                    "seconds": seconds,
                    "decode_sentences_per_s": report["run"]["sentences_per_s"],
                    "decode_tokens_per_s": report["run"]["tokens_per_s"],
                    "same_output": merged == plain_out.read_text(encoding="utf-8"),
                }
            )
        print(json.dumps(rows[-1 - len(args.chunk_lines) :]), file=sys.stderr, flush=True)
    n = args.lines
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    print(
        f"{n} lines of {args.input}, {args.workdir}; {stamp}; {platform.node()}, "
        f"{os.cpu_count()} CPU cores; the XLA cache is warm from round "
        f"{0 if args.xla_cache else 1} on\n"
    )
    print("| round | command | wall s | sentences/s | decoding: sentences/s | tokens/s | same |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        dec = row.get("decode_sentences_per_s")
        rates = "| | |" if dec is None else f"| {dec:.1f} | {row['decode_tokens_per_s']:.0f} |"
        print(
            f"| {row['round']} | {row['command']} | {row['seconds']:.1f} | "
            f"{n / row['seconds']:.1f} {rates} {row.get('same_output', '')} |"
        )
    warm = [r for r in rows if r["round"] > 0 or args.xla_cache] or rows
    for command in dict.fromkeys(r["command"] for r in rows):
        median = statistics.median(r["seconds"] for r in warm if r["command"] == command)
        print(f"median of the warm rounds, {command}: {n / median:.1f} sentences/s")
    if args.json:
        Path(args.json).write_text(json.dumps({"stamp": stamp, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
