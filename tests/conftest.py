"""Shared fixtures: tiny models and batches built in code."""

import os

# The tests run tiny models, so XLA's compile time dominates them; its CPU backend compiles
# about twice as fast without LLVM's optimisation passes (the same XLA programs, less tuned
# machine code). Set before jax starts its backend; an explicit level in XLA_FLAGS wins.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0"
    ).strip()

import gzip  # noqa: E402  (after the XLA flag)
from pathlib import Path

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from seq2seq.config import ModelConfig
from seq2seq.data.batching import make_batch, pack
from seq2seq.model import build_model

BOS, EOS = 2, 3
DATA = Path(__file__).resolve().parents[1] / "data" / "tatoeba-en-es"


def write_split(directory: Path, name: str, start: int, count: int) -> str:
    """Write lines ``start .. start+count`` of the shipped train split as ``{name}.en/.es``;
    returns the path prefix (a ``text`` source's ``path``)."""
    for lang in ("en", "es"):
        with gzip.open(DATA / f"train.{lang}.gz", "rt", encoding="utf-8") as f:
            lines = f.read().split("\n")[start : start + count]
        (directory / f"{name}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(directory / name)


def tiny_config(**changes) -> ModelConfig:
    base = dict(
        vocab_size=40,
        d_model=32,
        num_heads=4,
        num_encoder_layers=2,
        num_decoder_layers=2,
        d_ff=64,
        dropout_rate=0.0,
    )
    base.update(changes)
    return ModelConfig(**base)


def random_pairs(n, rng, lo=2, hi=9, vocab=40):
    src = [
        np.append(rng.integers(4, vocab, rng.integers(lo, hi)), EOS).astype(np.int32)
        for _ in range(n)
    ]
    tgt = [
        np.append(rng.integers(4, vocab, rng.integers(lo, hi)), EOS).astype(np.int32)
        for _ in range(n)
    ]
    return src, tgt


def unpacked_batch(src, tgt, max_len):
    rows = [[i] for i in range(len(src))]
    return {k: jnp.asarray(v) for k, v in make_batch(rows, src, tgt, len(src), max_len).items()}


def packed_batch(src, tgt, max_len, num_rows):
    src_len = np.array([len(x) for x in src])
    tgt_len = np.array([len(x) for x in tgt])
    rows = pack(src_len, tgt_len, np.arange(len(src)), max_len)
    assert len(rows) <= num_rows
    return {
        k: jnp.asarray(v) for k, v in make_batch(rows, src, tgt, num_rows, max_len).items()
    }, rows


CACHE_SETTINGS = {
    "jax_persistent_cache_min_compile_time_secs": 0.0,
    "jax_persistent_cache_min_entry_size_bytes": 0,
}


@pytest.fixture(scope="session", autouse=True)
def compilation_cache(tmp_path_factory):
    """JAX's persistent compilation cache, shared by every test of the session (and its
    pytest-xdist workers and the commands the tests start, through the ``JAX_*`` variables):
    many tests compile the same tiny programs (a chain's rerun, translate and evaluate; the same
    model in several tests), and a cached executable is the same program. Restored after."""
    import jax

    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    settings = {"jax_compilation_cache_dir": str(root / "jax-cache"), **CACHE_SETTINGS}
    old = {k: getattr(jax.config, k) for k in settings}
    old_env = {k.upper(): os.environ.get(k.upper()) for k in settings}
    for k, v in settings.items():
        jax.config.update(k, v)
        os.environ[k.upper()] = str(v)
    yield
    for k, v in old.items():
        jax.config.update(k, v)
    for k, v in old_env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture
def model():
    return build_model(tiny_config(), seed=0)


def _matrix_ran() -> dict[str, set[str]]:
    import sys

    return getattr(sys.modules.get("test_matrix"), "RAN", None) or {}


def pytest_sessionfinish(session):
    """Under pytest-xdist, a worker hands the matrix's option values to the controller."""
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["matrix_ran"] = {k: sorted(v) for k, v in _matrix_ran().items()}


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    ran = getattr(node, "workeroutput", {}).get("matrix_ran", {})
    for key, values in ran.items():
        node.config._matrix_ran.setdefault(key, set()).update(values)


def pytest_configure(config):
    config._matrix_ran = {}


def pytest_terminal_summary(terminalreporter, config):
    """List the option values the end-to-end matrix ran (tests/test_matrix.py), gathered from
    this process or, under pytest-xdist, from its workers."""
    ran = {k: set(v) for k, v in _matrix_ran().items()}
    for key, values in config._matrix_ran.items():
        ran.setdefault(key, set()).update(values)
    if ran:
        terminalreporter.write_sep("-", "end-to-end matrix: option values run")
        for key in sorted(ran):
            terminalreporter.write_line(f"{key}: {', '.join(sorted(ran[key]))}")
