"""Shared fixtures: tiny models and batches built in code."""

import gzip
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

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
            lines = f.read().split("\n")[start:start + count]
        (directory / f"{name}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(directory / name)


def tiny_config(**changes) -> ModelConfig:
    base = dict(vocab_size=40, d_model=32, num_heads=4, num_encoder_layers=2, num_decoder_layers=2,
                d_ff=64, dropout_rate=0.0)
    base.update(changes)
    return ModelConfig(**base)


def random_pairs(n, rng, lo=2, hi=9, vocab=40):
    src = [np.append(rng.integers(4, vocab, rng.integers(lo, hi)), EOS).astype(np.int32) for _ in range(n)]
    tgt = [np.append(rng.integers(4, vocab, rng.integers(lo, hi)), EOS).astype(np.int32) for _ in range(n)]
    return src, tgt


def unpacked_batch(src, tgt, max_len):
    rows = [[i] for i in range(len(src))]
    return {k: jnp.asarray(v) for k, v in make_batch(rows, src, tgt, len(src), max_len).items()}


def packed_batch(src, tgt, max_len, num_rows):
    src_len = np.array([len(x) for x in src])
    tgt_len = np.array([len(x) for x in tgt])
    rows = pack(src_len, tgt_len, np.arange(len(src)), max_len)
    assert len(rows) <= num_rows
    return {k: jnp.asarray(v) for k, v in make_batch(rows, src, tgt, num_rows, max_len).items()}, rows


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture
def model():
    return build_model(tiny_config(), seed=0)
