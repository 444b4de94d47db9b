"""What the experiments share: the machine's description, peak RSS, the training loop's step
for a model and train config, a ``python -m seq2seq``
command run with a log, another experiment run as a command, a marked table written into a
docs page, figures made JSON-ready, the package versions, the lines of a (gzipped) corpus file
and a synthetic corpus of joined shipped pairs.

Light at import (the standard library only): ``jax`` and ``numpy`` are imported by the
functions that need them.
"""

from __future__ import annotations

import dataclasses
import gzip
import importlib
import math
import os
import platform
import resource
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "data" / "tatoeba-en-es"
# a ~20k-parameter model (with its 200-piece vocabulary): the sizes of every tiny run, the
# experiments' smoke modes and the tests' runs
TINY_SIZES = (
    "tokenizer.vocab_size=200",
    "model.d_model=16",
    "model.num_heads=2",
    "model.d_ff=32",
    "model.num_encoder_layers=1",
    "model.num_decoder_layers=1",
)


# -- the machine ----------------------------------------------------------------------------------


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else ``platform.processor()`` or
    ``platform.machine()``."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


SPEED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")  # what sets XLA:CPU's speed


def cpu_features() -> list[str]:
    """Which of ``SPEED_FLAGS`` the CPU has (``/proc/cpuinfo``'s flags; empty where there
    is none): two machines of one model name can differ in them, and with them in speed
    (the preset's bfloat16 products are emulated without AVX512-BF16 or AMX)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                have = set(line.split(":", 1)[1].split())
                return [f for f in SPEED_FLAGS if f in have]
    except OSError:
        pass
    return []


def cpus_line() -> str:
    """``PROCESSOR, N CPUs`` (``platform.processor()`` or ``platform.machine()``, and
    ``os.cpu_count()``): the one-line machine of the A/B and MBR pages."""
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs"


def machine_info(dtype: str) -> dict[str, Any]:
    """The machine, the versions of Python, JAX and Flax, the backend and its device, and
    ``dtype``: the ``machine`` of the benchmark's and the comparison's JSON."""
    import jax

    dev = jax.devices()[0]
    try:
        import flax

        flax_version = flax.__version__
    except Exception:  # noqa: BLE001
        flax_version = None
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return {
        "cpu": cpu_name(),
        "cpu_features": cpu_features(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": affinity,
        "memory_bytes": _total_memory(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": getattr(jax.lib, "__version__", None) or _jaxlib_version(),
        "flax": flax_version,
        "backend": jax.default_backend(),
        "device_kind": dev.device_kind,
        "device_count": jax.device_count(),
        "dtype": dtype,
        "load_average_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def _jaxlib_version() -> str | None:
    try:
        import jaxlib

        return jaxlib.__version__
    except Exception:  # noqa: BLE001
        return None


def _total_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def versions(*names: str) -> dict[str, str | None]:
    """``__version__`` of jax, jaxlib, flax, numpy and ``names`` (None where a module has none)."""
    out: dict[str, str | None] = {}
    for name in ("jax", "jaxlib", "flax", "numpy", *names):
        out[name] = getattr(importlib.import_module(name), "__version__", None)
    return out


# -- memory ---------------------------------------------------------------------------------------


def proc_status(field: str) -> int | None:
    """A ``kB`` field of ``/proc/self/status`` in bytes (Linux), else None."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def peak_rss() -> int:
    """Peak resident set size of this process in bytes.

    Linux: ``VmHWM``, the high-water mark of this program's own memory. ``ru_maxrss`` is not
    used there because it survives ``exec``: a child started by a large parent would report
    the parent's size. Elsewhere: ``ru_maxrss`` (KiB on Linux, bytes on macOS).
    """
    hwm = proc_status("VmHWM")
    if hwm is not None:
        return hwm
    scale = 1 if sys.platform == "darwin" else 1024
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale)


# -- the train step -------------------------------------------------------------------------------


def train_step(model: Any, train: Any, bos_id: int | None = None) -> tuple[Any, Any]:
    """``(context, state)``: the train step ``seq2seq-train`` compiles for a run of ``model``
    and ``train`` (``seq2seq.config.ModelConfig``, ``TrainConfig``) on this process's first
    device (``seq2seq.training.context.train_context``: the same jit, donation and schedule),
    and a fresh ``TrainState`` from ``train.seed``. ``bos_id``: the target tokenizer's (default
    ``seq2seq.data.tokenizer.BOS_ID``). Call ``context.step(state, batch)`` with
    int32 ``[1, rows, length]`` arrays (one micro-batch; ``micro_batch``)."""
    from seq2seq.config import Config
    from seq2seq.data.tokenizer import BOS_ID
    from seq2seq.sharding import Partitioner
    from seq2seq.training.context import train_context

    # the schedule's horizon fixed at train.steps (with train.time_budget the loop passes it
    # to the step at run time; the figures here do not depend on it)
    config = Config(model=model, train=dataclasses.replace(train, time_budget=0))
    bos = BOS_ID if bos_id is None else bos_id
    context = train_context(config, Partitioner.single_device(), bos_id=bos)
    return context, context.fresh_state()


def micro_batch(batch: dict[str, Any]) -> dict[str, Any]:
    """``[rows, length]`` arrays as the step's one micro-batch ``[1, rows, length]`` (jax
    arrays)."""
    import jax.numpy as jnp

    return {k: jnp.asarray(v)[None] for k, v in batch.items()}


# -- commands and pages ---------------------------------------------------------------------------


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment with the repository root first on ``PYTHONPATH``, so that a
    child (``python -m benchmarks.NAME`` or ``-m seq2seq``) imports this checkout from any
    working directory; ``extra`` variables added."""
    path = str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    return dict(os.environ, PYTHONPATH=path, **extra)


def run_command(command: list[str], log: Path) -> tuple[str, float]:
    """Run ``python -m seq2seq COMMAND`` to completion; (its standard output, peak RSS in MiB
    of that process, from ``wait4``). Raises SystemExit with the log's tail on failure."""
    full = [sys.executable, "-m", "seq2seq", *command]
    print("$", shlex.join(full), flush=True)
    with open(log, "w", encoding="utf-8") as err:
        proc = subprocess.Popen(
            full, stdout=subprocess.PIPE, stderr=err, text=True, env=child_env()
        )
        out = proc.stdout.read() if proc.stdout else ""
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        tail = log.read_text(encoding="utf-8")[-3000:]
        raise SystemExit(f"{shlex.join(full)} failed ({proc.returncode}):\n{tail}")
    return out, usage.ru_maxrss / 1024.0  # kilobytes on Linux


def run_experiment(name: str, argv: list[str]) -> int:
    """Run ``python -m benchmarks.NAME ARGV`` in a child process, its output passing through
    (an experiment that offers another's command line hands it over without importing it);
    its exit status."""
    return subprocess.call([sys.executable, "-m", f"benchmarks.{name}", *argv], env=child_env())


def write_docs(path: Path, table: str, begin: str, end: str) -> None:
    """Replace the text between the ``begin`` and ``end`` lines of ``path``."""
    text = path.read_text(encoding="utf-8")
    if begin not in text or end not in text:
        raise SystemExit(f"{path}: no {begin} ... {end} block to replace")
    head, rest = text.split(begin, 1)
    path.write_text(f"{head}{begin}\n{table}\n{end}{rest.split(end, 1)[1]}", encoding="utf-8")


def read_lines(path: Path) -> list[str]:
    """Lines of ``path`` or ``path.gz`` (the shipped corpus is gzipped)."""
    if not path.exists() and path.with_name(path.name + ".gz").exists():
        path = path.with_name(path.name + ".gz")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        text = f.read()
    if not text:
        return []
    return text[:-1].split("\n") if text.endswith("\n") else text.split("\n")


def jsonable(x: Any) -> Any:
    """``x`` with numpy scalars as Python numbers, tuples as lists, keys as strings and
    non-finite floats as None (``json.dumps`` writes the result as strict JSON)."""
    import numpy as np

    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def build_corpus(pairs: int, join: int, directory: Path, seed: int = 0) -> Path:
    """``{directory}/train{pairs}.{en,es}``: ``pairs`` lines, each ``join`` shipped training
    pairs joined by a space (indices from ``default_rng(seed)``); kept if already complete."""
    import numpy as np

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
