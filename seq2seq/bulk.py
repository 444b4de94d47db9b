"""Bulk translation of a large monolingual file: resumable chunks, decoded by every process.

The input's lines are cut into chunks of ``chunk_lines``: chunk k holds lines
``[k·chunk_lines, (k+1)·chunk_lines)``. Each chunk's translations go to
``OUTPUT_DIR/chunks/{k:06d}.json``, written to a temporary file and renamed over the final name
(``os.replace``, atomic on POSIX), so after Ctrl-C or kill -9 a chunk is complete or absent,
and a rerun of the same command skips the complete ones: nothing is lost or decoded twice.

Process p of P (``jax.distributed``, as in training) decodes the chunks k ≡ p (mod P) on its
own devices (data parallel over its local mesh; no collective while decoding, so processes do
not wait for each other), every line seeded by its line number in the file
(``Translator.translate(first_line=...)``), so a chunk's output does not depend on which process
decoded it. After a barrier, process 0 merges the chunks in order into one output file (one
line per input line, written atomically too) and ``OUTPUT_DIR/report.json``.

``OUTPUT_DIR/job.json`` records the input (path, line count, SHA-256 of its bytes), each
model's checkpoint (run, step and path, the default resolved before loading) and precision, the
decode settings and the chunk size; a rerun with anything else (e.g. after training moved the
run's default checkpoint) is refused instead of merging two models' or jobs' outputs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
from tqdm.auto import tqdm

from seq2seq.config import Config, MeshConfig
from seq2seq.sharding import MeshError, Partitioner, check_model, make_mesh
from seq2seq.trained import checkpoint_step
from seq2seq.translation import Translator
from seq2seq.workdir import checkpoint_dir

log = logging.getLogger(__name__)

JOB = "job.json"
REPORT = "report.json"
CHUNKS = "chunks"
MERGED = "translations.txt"
# counts summed over chunks: lines, empty lines (not decoded), lines over the source limit
# (truncated; with on_long="reject" the job stops at the chunk), decoded lines whose translation
# is empty, source tokens decoded (EOS included, after truncation), output pieces (EOS excluded),
# line breaks replaced by spaces in the translations (``translation.one_line``)
COUNTS = (
    "lines",
    "empty",
    "truncated",
    "empty_outputs",
    "source_tokens",
    "target_tokens",
    "line_breaks",
)


class BulkError(ValueError):
    """The output directory belongs to another job, or holds a damaged chunk."""


def chunk_bounds(num_lines: int, chunk_lines: int) -> list[tuple[int, int]]:
    """``[start, end)`` line ranges of the chunks (the last may be shorter; none if empty).

    Raises:
      ValueError: ``chunk_lines`` < 1.
    """
    if chunk_lines < 1:
        raise ValueError(f"chunk_lines must be ≥ 1, got {chunk_lines}")
    return [(a, min(a + chunk_lines, num_lines)) for a in range(0, num_lines, chunk_lines)]


def file_sha256(path: str | Path) -> str:
    """Hex SHA-256 of the file's bytes (as stored: a ``.gz`` file's compressed bytes)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def resolve_members(members: Sequence[tuple[str, int | None]]) -> list[tuple[str, int]]:
    """Each ``(workdir, step)`` as the absolute run path and the step it loads (a None step:
    the run's default checkpoint now, ``seq2seq.trained.checkpoint_step``). Load these, so
    that ``job.json`` names the checkpoint decoded even if training saves another meanwhile.

    Raises:
      FileNotFoundError, CheckpointError: a member is not a run or has no checkpoint.
    """
    return [(str(Path(w).resolve()), checkpoint_step(w, s)) for w, s in members]


def job_record(
    input_path: str | Path,
    num_lines: int,
    chunk_lines: int,
    members: Sequence[tuple[str, int]],
    configs: Sequence[Config],
    translator: Translator,
) -> dict[str, Any]:
    """What identifies a job (``job.json``): the input, the chunking, the models, the decode
    settings and the source limit.

    Args:
      members: ``resolve_members``: each model's run and checkpoint step.
      configs: each member's config as loaded (``--matmul-dtype`` applied): its ``model.dtype``,
        ``matmul_dtype`` and ``attention`` kernel are recorded beside the checkpoint's run,
        step and path.
    """
    models = [
        {
            "run": w,
            "step": s,
            "checkpoint": str((checkpoint_dir(w) / str(s)).resolve()),
            "dtype": c.model.dtype,
            "matmul_dtype": c.model.matmul_dtype,
            "attention": c.model.attention,
        }
        for (w, s), c in zip(members, configs, strict=True)
    ]
    return {
        "input": str(Path(input_path).resolve()),
        "sha256": file_sha256(input_path),
        "lines": num_lines,
        "chunk_lines": chunk_lines,
        "models": models,
        "decode": dataclasses.asdict(translator.config),
        "max_src_len": translator.max_src_len,
        "on_long": translator.on_long,
    }


def _write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same directory and
    ``os.replace``: readers (and a rerun after a kill) see the old state or the whole file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _difference(old: Any, new: Any, key: str) -> tuple[str, Any, Any] | None:
    """The first leaf where ``old`` and ``new`` (JSON values) differ, as ``(key, old, new)``
    with the key's path (``models[0].step``); None when equal."""
    if isinstance(old, dict) and isinstance(new, dict):
        for k in [*new, *(k for k in old if k not in new)]:
            found = _difference(old.get(k), new.get(k), f"{key}.{k}")
            if found:
                return found
        return None
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for i, (a, b) in enumerate(zip(old, new)):
            found = _difference(a, b, f"{key}[{i}]")
            if found:
                return found
        return None
    return None if old == new else (key, old, new)


# a model setting with a command-line option: a rerun with the recorded value finishes the job
_OPTIONS = {"step": "--step", "matmul_dtype": "--matmul-dtype"}


def check_job(output_dir: Path, job: dict[str, Any], *, write: bool) -> None:
    """Check that the job recorded in ``output_dir/job.json``, if any, is ``job``; then, when
    ``write`` (process 0), create ``output_dir/chunks`` and ``job.json`` if missing.

    Raises:
      BulkError: ``job.json`` records another job (the message names the first differing key,
        e.g. ``models[0].step``, both values, and how to go on).
    """
    path = output_dir / JOB
    if path.is_file():
        old = json.loads(path.read_text(encoding="utf-8"))
        for key in job:
            found = _difference(old.get(key), job[key], key)
            if found is None:
                continue
            where, was, now = found
            hint, field = "", where.rsplit(".", 1)[-1]
            one = where.startswith("models[0].") and len(old["models"]) == 1
            if one and field in _OPTIONS and was is not None:
                hint = f"rerun with {_OPTIONS[field]} {was} to finish this job, or "
            raise BulkError(
                f"{path}: this directory holds the chunks of another job: {where} was "
                f"{was!r}, now {now!r}; {hint}give another --output-dir for a new job (or "
                "remove this one to start again)"
            )
    if write:
        (output_dir / CHUNKS).mkdir(parents=True, exist_ok=True)
        if not path.is_file():
            _write_atomic(path, json.dumps(job, indent=1, ensure_ascii=False) + "\n")


def chunk_path(output_dir: Path, k: int) -> Path:
    return output_dir / CHUNKS / f"{k:06d}.json"


def translate_chunk(
    translator: Translator,
    lines: Sequence[str],
    first_line: int,
    source: str | None,
    bar: Any = False,
) -> dict[str, Any]:
    """Translate one chunk (lines ``first_line ...`` of ``source``) and count what it held.

    Returns:
      ``{"first_line", "translations": [str, one per line], "seconds", *COUNTS}``.
    """
    start = time.perf_counter()
    results = translator.translate(lines, progress=bar, source=source, first_line=first_line)
    seconds = time.perf_counter() - start
    hyps = [r[0] for r in results]
    # counted apart from the search (one more SentencePiece pass, cheap next to decoding)
    lengths = [len(x) for x, h in zip(translator.tokenizer.encode(list(lines)), hyps) if h.decoded]
    return {
        "first_line": first_line,
        "lines": len(lines),
        "empty": sum(not h.decoded for h in hyps),
        "truncated": sum(n > translator.max_src_len for n in lengths),
        "empty_outputs": sum(h.decoded and not h.text for h in hyps),
        "source_tokens": sum(min(n, translator.max_src_len) for n in lengths),
        "target_tokens": sum(len(h.tokens) for h in hyps),
        "line_breaks": sum(h.line_breaks for h in hyps),
        "seconds": seconds,
        "translations": [h.text for h in hyps],
    }


def merge(output_dir: Path, bounds: Sequence[tuple[int, int]], output: Path) -> dict[str, int]:
    """Concatenate the chunks in order into ``output`` (atomically) and sum their counts.

    Raises:
      BulkError: a chunk is missing or does not hold one translation per line of its range.
    """
    totals = dict.fromkeys(COUNTS, 0)
    tmp = output.with_name(f".{output.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for k, (a, b) in enumerate(bounds):
            path = chunk_path(output_dir, k)
            if not path.is_file():
                raise BulkError(f"{path}: missing; rerun the command to decode it")
            chunk = json.loads(path.read_text(encoding="utf-8"))
            if chunk["first_line"] != a or len(chunk["translations"]) != b - a:
                raise BulkError(
                    f"{path}: holds {len(chunk['translations'])} translations from line "
                    f"{chunk['first_line'] + 1}, expected {b - a} from line {a + 1}; remove it "
                    "and rerun"
                )
            f.writelines(t + "\n" for t in chunk["translations"])
            for key in COUNTS:
                totals[key] += chunk[key]
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, output)
    for stale in (output_dir / CHUNKS).glob(".*.tmp"):  # left by a killed run; no writer now
        stale.unlink(missing_ok=True)
    return totals


def local_partitioner(config) -> Partitioner:
    """The run's mesh on this process's devices, or data parallel over them when it does not
    fit: each process of a bulk job decodes its own chunks alone."""
    devices = jax.local_devices()
    try:
        mesh = make_mesh(config.mesh, devices)
        check_model(config.model, mesh)
    except MeshError as e:
        log.info("%s; decoding data parallel over this process's devices", e)
        mesh = make_mesh(MeshConfig(), devices)
    return Partitioner(mesh)


class _ChunkBoundaryInterrupt:
    """SIGINT as a request honoured after the chunk being decoded is written (a second SIGINT
    interrupts at once), so that Ctrl-C never lands inside a decode call; the previous handler
    is restored on exit. Outside the main thread (no signal handlers there) it does nothing."""

    def __init__(self) -> None:
        self.requested = False
        self._old: Any = None

    def __enter__(self) -> _ChunkBoundaryInterrupt:
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        log.warning("interrupt: finishing the chunk being decoded, then stopping")

    def __exit__(self, *exc) -> None:
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)


def translate_file(
    translator: Translator,
    lines: Sequence[str],
    job: dict[str, Any],
    output_dir: str | Path,
    output: str | Path | None = None,
    *,
    source: str | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Translate ``lines`` chunk by chunk into ``output_dir``, skipping finished chunks; this
    process decodes its share; process 0 then merges every chunk into ``output``.

    Args:
      translator: the model(s) and search, on this process's devices (``local_partitioner``).
      lines: every line of the input (each process reads the whole file).
      job: ``job_record`` of the input and settings (``job["chunk_lines"]`` cuts the chunks).
      output_dir: the job's directory (chunks, ``job.json``, ``report.json``).
      output: the merged file (default ``OUTPUT_DIR/translations.txt``).
      source: the input's name in messages (``file:line``).
      progress: a progress bar of this process's lines (stderr).

    Returns:
      ``report.json``'s content on process 0 (``totals`` over the whole file and ``run``:
      what this invocation decoded, its seconds, sentences/s and tokens/s); on another process
      its own ``run`` only.

    Raises:
      BulkError: ``output_dir`` holds another job, or a damaged chunk.
      ValueError: as ``Translator.translate`` (e.g. ``on_long="reject"`` and a long line).
    """
    output_dir = Path(output_dir)
    output = Path(output) if output else output_dir / MERGED
    process, processes = jax.process_index(), jax.process_count()
    if translator.on_long == "reject":  # the input is refused before any decoding, as translate
        translator.source_ids(lines, source)  # does (ValueError naming the long lines)
    check_job(output_dir, job, write=process == 0)
    bounds = chunk_bounds(len(lines), job["chunk_lines"])
    existed = {k for k in range(len(bounds)) if chunk_path(output_dir, k).is_file()}
    if processes > 1:
        _barrier("seq2seq-bulk-job")  # job.json and chunks/ exist; no chunk is written before
        check_job(output_dir, job, write=False)  # the one process 0 wrote: the same settings
    mine = [k for k in range(len(bounds)) if k % processes == process]
    todo = [k for k in mine if not chunk_path(output_dir, k).is_file()]
    done_lines = sum(bounds[k][1] - bounds[k][0] for k in mine if k not in todo)
    log.info(
        "process %d of %d: %d of its %d chunks to decode (%d done), %d lines per chunk",
        process,
        processes,
        len(todo),
        len(mine),
        len(mine) - len(todo),
        job["chunk_lines"],
    )
    desc = "translate" if processes == 1 else f"translate [process {process}]"
    bar = tqdm(
        total=sum(b - a for a, b in (bounds[k] for k in mine)),
        initial=done_lines,
        desc=desc,
        unit="sent",
        disable=not progress,
    )
    start = time.perf_counter()
    own = dict.fromkeys(COUNTS, 0)
    with _ChunkBoundaryInterrupt() as interrupt:
        for k in todo:
            a, b = bounds[k]
            chunk = translate_chunk(translator, lines[a:b], a, source, bar)
            bar.update(chunk["empty"])  # translate's bar counts decoded lines
            _write_atomic(chunk_path(output_dir, k), json.dumps(chunk, ensure_ascii=False))
            for key in COUNTS:
                own[key] += chunk[key]
            if interrupt.requested:  # Ctrl-C during this chunk: it is written, stop here
                raise KeyboardInterrupt
    bar.close()
    own_seconds = time.perf_counter() - start
    if processes > 1:
        _barrier("seq2seq-bulk-merge")  # every chunk written
    seconds = time.perf_counter() - start
    mine_run = _rates({**own, "chunks": len(todo), "seconds": own_seconds})
    if process != 0:
        return {"run": mine_run}
    totals = merge(output_dir, bounds, output)
    new = [k for k in range(len(bounds)) if k not in existed]
    run = dict.fromkeys(COUNTS, 0)
    for k in new:  # decoded by this invocation, on every process
        chunk = json.loads(chunk_path(output_dir, k).read_text(encoding="utf-8"))
        for key in COUNTS:
            run[key] += chunk[key]
    report = {
        "output": str(output),
        "chunks": len(bounds),
        "totals": totals,
        "run": _rates({**run, "chunks": len(new), "skipped": len(existed), "seconds": seconds}),
        "processes": processes,
        "devices": jax.device_count(),
    }
    _write_atomic(output_dir / REPORT, json.dumps(report, indent=1) + "\n")
    return report


def _rates(counts: dict[str, Any]) -> dict[str, Any]:
    """``counts`` with ``sentences_per_s`` (lines, empty ones included) and ``tokens_per_s``
    (output pieces) over ``counts["seconds"]`` of wall time."""
    seconds = max(counts["seconds"], 1e-9)
    return {
        **counts,
        "sentences_per_s": counts["lines"] / seconds,
        "tokens_per_s": counts["target_tokens"] / seconds,
    }


def _barrier(name: str) -> None:
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices(name)
