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
page-cache-shared token store), alone and summed with its tokenizing worker processes,
sampled every 0.2 s from ``/proc``. Linux only.

``--processes K`` runs K processes of one host (``jax.distributed`` on localhost, one CPU
device each, ``mesh.data=K``) and reports each process's peaks, their ``RssFile`` (the mapped
store and libraries: the same pages in every process) and the host's memory in use
(``MemTotal - MemAvailable``) above what it was before the start. Finally the loader alone:
target tokens/s of ``train_batch`` laid out from the resumed run's store on one thread.

Usage::

    python -m benchmarks.data_scale --pairs 1000000 --out /tmp/scale
    python -m benchmarks.data_scale --pairs 4500000 --out /tmp/scale --processes 4
    python -m benchmarks.data_scale --smoke --out /tmp/scale   # seconds: checks the script

Prints a JSON record and writes ``<out>/data_scale_<pairs>[_<K>p].json``. ``--smoke`` trains
the preset's recipe on a tiny model and vocabulary (``SMOKE``) without a step limit (the runs
end by the SIGTERM), on 400 single pairs unless ``--pairs``/``--join`` say otherwise, and
reads ``--loader-batches`` 20 batches: it checks that the script works, not the scale.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from benchmarks.harness import SHIPPED, TINY_SIZES, build_corpus

ROOT = Path(__file__).resolve().parent.parent
PHASES = ("read_seconds", "tokenizer_seconds", "tokenize_seconds", "token_cache_seconds")
SMOKE = [
    *TINY_SIZES,
    "data.max_tokens=256",
    "train.steps=1000000",  # stopped by the SIGTERM after the first step, never by the count
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def _descendants(pid: int) -> list[int]:
    """The pids of ``pid``'s children, their children, ... (``/proc/*/task/*/children``)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = list(Path(f"/proc/{p}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                kids = [int(x) for x in (task / "children").read_text().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


def _host_used() -> int:
    """kB of the host's memory in use: ``MemTotal - MemAvailable`` of ``/proc/meminfo``."""
    info = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, _, value = line.partition(":")
        info[key] = int(value.split()[0])
    return info["MemTotal"] - info["MemAvailable"]


def run_to_first_step(
    command: list[str], workdir: Path, after_step: int, timeout: float, processes: int = 1
) -> dict:
    """Start ``command`` (``processes`` copies with ``distributed.process_id=i`` when more
    than one); when ``metrics.jsonl`` has a training record past ``after_step``, send SIGTERM
    to process 0 (the others stop after the same step) and wait. Returns the seconds to that
    record, the peak memory per process and of the host, and the log's start-up phases."""
    metrics = workdir / "metrics.jsonl"
    start, wall_start = time.perf_counter(), time.time()
    log_path = workdir.parent / f"{workdir.name}.{after_step}.log"
    host_before = _host_used()
    procs, logs = [], []
    for i in range(processes):
        logs.append(open(log_path.with_suffix(f".{i}.log") if i else log_path, "w"))
        extra = [f"distributed.process_id={i}"] if processes > 1 else []
        procs.append(subprocess.Popen(command + extra, stdout=logs[-1], stderr=subprocess.STDOUT))
    first_step = None
    peak_anon, hwm, peak_file = [0] * processes, [0] * processes, [0] * processes
    peak_tree = [0] * processes  # RssAnon of a process and its workers (tokenizing) together
    peak_host = 0
    try:
        while any(p.poll() is None for p in procs):
            for i, proc in enumerate(procs):
                mem = _memory(proc.pid)
                peak_anon[i] = max(peak_anon[i], mem.get("RssAnon", 0))
                hwm[i] = max(hwm[i], mem.get("VmHWM", 0))
                peak_file[i] = max(peak_file[i], mem.get("RssFile", 0))
                tree = mem.get("RssAnon", 0) + sum(
                    _memory(kid).get("RssAnon", 0) for kid in _descendants(proc.pid)
                )
                peak_tree[i] = max(peak_tree[i], tree)
            peak_host = max(peak_host, _host_used() - host_before)
            if first_step is None and metrics.is_file():
                records = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
                if any(
                    r.get("split") == "train" and r.get("step", 0) > after_step for r in records
                ):
                    first_step = time.perf_counter() - start
                    procs[0].send_signal(signal.SIGTERM)
            if time.perf_counter() - start > timeout:
                for proc in procs:
                    proc.kill()
                break
            time.sleep(0.2)
    finally:
        for proc in procs:
            proc.wait()
        for f in logs:
            f.close()
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
    record = {
        "seconds_to_first_step": first_step,
        "seconds_total": time.perf_counter() - start,
        "returncode": procs[0].returncode,
        "peak_rss_anon_mb": peak_anon[0] / 1024,
        "peak_rss_anon_with_workers_mb": peak_tree[0] / 1024,
        "peak_rss_mb": hwm[0] / 1024,
        "phases": phases,
        "log": str(log_path),
    }
    if processes > 1:
        record.update(
            returncodes=[p.returncode for p in procs],
            peak_rss_anon_mb_per_process=[x / 1024 for x in peak_anon],
            peak_rss_anon_with_workers_mb_per_process=[x / 1024 for x in peak_tree],
            peak_rss_file_mb_per_process=[x / 1024 for x in peak_file],
            peak_rss_mb_per_process=[x / 1024 for x in hwm],
            host_used_mb_above_start=peak_host / 1024,
        )
    return record


def loader_speed(workdir: Path, batches: int = 200) -> dict:
    """Target tokens/s of ``train_batch`` on one thread, from the run's token store (the
    resumed run's data, read as a resume reads it)."""
    from seq2seq.config import load_config
    from seq2seq.data.pipeline import prepare
    from seq2seq.training.batches import train_batch

    config = load_config(workdir / "config.yaml")
    data = prepare(config, workdir, need_test=False)
    train_batch(data.train, 0, 1)
    start, tokens = time.perf_counter(), 0
    for k in range(batches):
        tokens += train_batch(data.train, k, 1).target_tokens
    seconds = time.perf_counter() - start
    shape = (data.train.rows, data.train.max_len)
    return {
        "batches": batches,
        "batch_shape": list(shape),
        "ms_per_batch": 1000 * seconds / batches,
        "target_tokens_per_second": tokens / seconds,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=None, help="lines (default 100,000)")
    parser.add_argument("--join", type=int, default=None, help="shipped pairs per line (default 4)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--config", default=str(ROOT / "configs" / "tatoeba_en_es.yaml"))
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument(
        "--processes", type=int, default=1, help="local processes (jax.distributed), 1 CPU each"
    )
    parser.add_argument(
        "--loader-batches", type=int, default=None, help="batches the loader reads (200)"
    )
    parser.add_argument("--smoke", action="store_true", help="a tiny model and corpus (a check)")
    parser.add_argument("overrides", nargs="*", help="more seq2seq-train overrides")
    args = parser.parse_args(argv)
    defaults = dict(pairs=(400 if args.smoke else 100_000), join=(1 if args.smoke else 4))
    defaults["loader_batches"] = 20 if args.smoke else 200
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    prefix = build_corpus(args.pairs, args.join, args.out / "corpus")
    k = args.processes
    tag = f"{args.pairs}" + (f"_{k}p" if k > 1 else "")
    workdir = args.out / f"run{args.pairs}x{args.join}" if k == 1 else args.out / f"run{tag}"
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
        *(
            [
                f"distributed.coordinator_address=127.0.0.1:{_free_port()}",
                f"distributed.num_processes={k}",
                f"mesh.data={k}",
            ]
            if k > 1
            else []
        ),
        *(SMOKE if args.smoke else []),
        *args.overrides,
    ]
    record = {
        "smoke": args.smoke,
        "pairs": args.pairs,
        "processes": k,
        "join": args.join,
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    record["first_run"] = run_to_first_step(command, workdir, 0, args.timeout, k)
    steps = [json.loads(x)["step"] for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    record["resume"] = run_to_first_step(command, workdir, max(steps), args.timeout, k)
    record["loader"] = loader_speed(workdir, args.loader_batches)
    print(json.dumps(record, indent=1))
    (args.out / f"data_scale_{tag}.json").write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
