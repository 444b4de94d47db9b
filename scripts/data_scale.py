"""Data-scale benchmark: the real ``seq2seq-train`` on a synthetic corpus of N pairs, to the
first step (a first run, then a resume after a preemption).

The corpus joins ``--join`` shipped Tatoeba pairs per line (drawn with a fixed seed; 4 pairs
make ~25 words per side, as WMT14 en–de), so its size and sentence lengths are those of a
WMT-size corpus while the dev and test splits stay the shipped ones. Each run is the shipped
preset with only the data paths, ``data.max_len=128`` and ``train.time_budget=0``; it is
stopped with SIGTERM (as a preemption would: the loop saves a checkpoint) once the first
step's metrics are written. The resume is the same command again.

Reported per run: seconds to the first step's metrics (wall, from the command's start; it
includes the step's compilation), seconds until the data is ready (the ``data:`` log line) and
from the config's log line to it (``prepare_seconds``), the start-up phases of that line
(``read_seconds``, ``tokenizer_seconds``, ``tokenize_seconds``, ``token_cache_seconds``), and
the process's peak memory: ``VmHWM``
(resident, mapped files included) and the peak of ``RssAnon`` (its own memory, without the
page-cache-shared token store), sampled every 0.2 s from ``/proc``. Linux only.

Usage::

    python scripts/data_scale.py --pairs 1000000 --out /tmp/scale
    python scripts/data_scale.py --pairs 2000 --out /tmp/scale --steps-overrides ...  # tiny

Prints a JSON record per run and writes ``<out>/data_scale_<pairs>.json``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "data" / "tatoeba-en-es"
PHASES = ("read_seconds", "tokenizer_seconds", "tokenize_seconds", "token_cache_seconds")


def build_corpus(pairs: int, join: int, directory: Path, seed: int = 0) -> Path:
    """``{directory}/train{pairs}.{en,es}``: ``pairs`` lines, each ``join`` shipped training
    pairs joined by a space (indices from ``default_rng(seed)``); kept if already complete."""
    prefix = directory / f"train{pairs}x{join}"
    done = prefix.with_suffix(".done")
    if done.is_file():
        return prefix
    directory.mkdir(parents=True, exist_ok=True)
    sides = {
        lang: gzip.decompress((SHIPPED / f"train.{lang}.gz").read_bytes()).decode().splitlines()
        for lang in ("en", "es")
    }
    n = len(sides["en"])
    rng = np.random.default_rng(seed)
    files = {lang: open(f"{prefix}.{lang}", "w", encoding="utf-8") for lang in sides}
    try:
        for first in range(0, pairs, 100_000):
            rows = rng.integers(0, n, size=(min(100_000, pairs - first), join))
            for lang, lines in sides.items():
                files[lang].write(
                    "".join(" ".join(lines[i] for i in row) + "\n" for row in rows.tolist())
                )
    finally:
        for f in files.values():
            f.close()
    done.write_text(str(pairs))
    return prefix


def _memory(pid: int) -> dict[str, int]:
    """kB values of ``/proc/<pid>/status`` (VmHWM, VmRSS, RssAnon, RssFile)."""
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0])
    except OSError:
        pass
    return out


def run_to_first_step(command: list[str], workdir: Path, after_step: int, timeout: float) -> dict:
    """Start ``command``; when ``metrics.jsonl`` has a training record past ``after_step``,
    send SIGTERM and wait. Returns the seconds to that record, the peak memory and the log's
    start-up phases."""
    metrics = workdir / "metrics.jsonl"
    start, wall_start = time.perf_counter(), time.time()
    log_path = workdir.parent / f"{workdir.name}.{after_step}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        first_step = None
        peak_anon = hwm = 0
        while proc.poll() is None:
            mem = _memory(proc.pid)
            peak_anon = max(peak_anon, mem.get("RssAnon", 0))
            hwm = max(hwm, mem.get("VmHWM", 0))
            if first_step is None and metrics.is_file():
                records = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
                if any(
                    r.get("split") == "train" and r.get("step", 0) > after_step for r in records
                ):
                    first_step = time.perf_counter() - start
                    proc.send_signal(signal.SIGTERM)
            if time.perf_counter() - start > timeout:
                proc.kill()
                break
            time.sleep(0.2)
        proc.wait()
    text = log_path.read_text()
    phases: dict[str, float] = {}
    data = re.search(r"^(\S+ \S+) INFO seq2seq.data.pipeline: data: (.*)", text, re.M)
    config = re.search(r"^(\S+ \S+) INFO seq2seq.cli: config:", text, re.M)
    if data:
        for item in data.group(2).split(", "):
            key, _, value = item.partition("=")
            if key in PHASES:
                phases[key] = float(value)
        done = datetime.strptime(data.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        phases["seconds_to_data_ready"] = done - wall_start  # imports, config, prepare
        if config:
            began = datetime.strptime(config.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            phases["prepare_seconds"] = done - began  # from the config's log line
    return {
        "seconds_to_first_step": first_step,
        "seconds_total": time.perf_counter() - start,
        "returncode": proc.returncode,
        "peak_rss_anon_mb": peak_anon / 1024,
        "peak_rss_mb": hwm / 1024,
        "phases": phases,
        "log": str(log_path),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=100_000)
    parser.add_argument("--join", type=int, default=4, help="shipped pairs per line")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--config", default=str(ROOT / "configs" / "tatoeba_en_es.yaml"))
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("overrides", nargs="*", help="more seq2seq-train overrides")
    args = parser.parse_args(argv)
    prefix = build_corpus(args.pairs, args.join, args.out / "corpus")
    workdir = args.out / f"run{args.pairs}x{args.join}"
    command = [
        sys.executable,
        "-m",
        "seq2seq",
        "train",
        "--config",
        args.config,
        f"workdir={workdir}",
        f"data.train.path={prefix}",
        f"data.dev.path={SHIPPED / 'dev'}",
        f"data.test.path={SHIPPED / 'test'}",
        "data.max_len=128",
        "train.time_budget=0",
        "train.log_every=1",
        "train.eval_every=100000",
        "train.checkpoint_every=100000",
        *args.overrides,
    ]
    record = {
        "pairs": args.pairs,
        "join": args.join,
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    record["first_run"] = run_to_first_step(command, workdir, 0, args.timeout)
    steps = [json.loads(x)["step"] for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    record["resume"] = run_to_first_step(command, workdir, max(steps), args.timeout)
    print(json.dumps(record, indent=1))
    (args.out / f"data_scale_{args.pairs}.json").write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
