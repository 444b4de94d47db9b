"""Helpers for tests that run the real training loop on a tiny corpus and a tiny model."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np

from benchmarks.harness import TINY_SIZES
from seq2seq.config import Config, load_config

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data" / "tatoeba-en-es"


def write_corpus(directory: Path, train: int = 400, dev: int = 16, test: int = 6) -> dict[str, str]:
    """Slices of the shipped Tatoeba training split as text files; returns path prefixes."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = {}
    for lang in ("en", "es"):
        with gzip.open(DATA / f"train.{lang}.gz", "rt", encoding="utf-8") as f:
            lines[lang] = f.read().split("\n")[: train + dev + test]
    out = {}
    for name, start, count in (
        ("train", 0, train),
        ("dev", train, dev),
        ("test", train + dev, test),
    ):
        for lang in ("en", "es"):
            (directory / f"{name}.{lang}").write_text(
                "\n".join(lines[lang][start : start + count]) + "\n", encoding="utf-8"
            )
        out[name] = str(directory / name)
    return out


# a ~20k-parameter model (benchmarks.harness.TINY_SIZES) and its batches: the sizes every
# tiny run shares
TINY_MODEL = ("data.max_len=32", "data.max_tokens=256", *TINY_SIZES)


def tiny_overrides(corpus: dict[str, str], workdir: Path, *extra: str) -> list[str]:
    """Overrides for a ~20k-parameter model on ``corpus`` (later ``extra`` keys win)."""
    return [
        f"workdir={workdir}",
        f"data.train.path={corpus['train']}",
        f"data.dev.path={corpus['dev']}",
        f"data.test.path={corpus['test']}",
        *TINY_MODEL,
        "model.dropout_rate=0.1",
        "train.warmup_steps=4",
        "train.log_every=2",
        "train.eval_every=1000",
        "train.checkpoint_every=1000",
        "train.dev_bleu=false",
        "train.best_metric=loss",
        "decode.beam_size=1",
        "decode.max_len_a=1.0",
        "decode.max_len_b=4",
        *extra,
    ]


def tiny_config(corpus: dict[str, str], workdir: Path, *extra: str) -> Config:
    """``tiny_overrides`` as a Config."""
    return load_config(None, tiny_overrides(corpus, workdir, *extra))


def assert_trees_equal(a, b) -> None:
    """Bitwise equality of two pytrees of arrays (same structure)."""
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert jax.tree.structure(a) == jax.tree.structure(b)
    assert len(la) > 0
    for x, y in zip(la, lb):
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(x, y)


# What tests/conftest.py sets for the test process: compile without LLVM's optimisation passes.
FAST_COMPILE = "--xla_backend_optimization_level=0"


def xla_flags(devices: int | None = None) -> str:
    """``XLA_FLAGS`` for a test subprocess: ``devices`` fake CPU devices (None: one)."""
    count = f"--xla_force_host_platform_device_count={devices} " if devices else ""
    return count + FAST_COMPILE


def cli_env(**extra: str) -> dict[str, str]:
    """Environment for ``seq2seq-*`` subprocesses: CPU, this checkout importable, compiled
    like the test process (``extra`` may set ``XLA_FLAGS``, e.g. ``xla_flags(8)``)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT), XLA_FLAGS=xla_flags())
    env.update(extra)
    return env


def train_command(overrides: list[str]) -> list[str]:
    """``seq2seq-train`` as a subprocess command line, through this interpreter."""
    return [
        sys.executable,
        "-c",
        "import sys; from seq2seq.cli import train_main; sys.exit(train_main(sys.argv[1:]))",
        *overrides,
    ]


def run(cmd: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``cmd`` to completion, capturing text output."""
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def write_hub_dataset(
    directory: Path,
    config_name: str,
    splits: dict[str, list[tuple[str, str]]],
    src_lang: str,
    tgt_lang: str,
) -> str:
    """A local dataset with the layout of a Hugging Face hub translation dataset (e.g. ``wmt14``):
    a README whose YAML header declares the config ``config_name`` and its splits, and one JSON
    Lines file per split with rows ``{"translation": {src_lang: ..., tgt_lang: ...}}``.

    ``datasets.load_dataset(directory, config_name, split=...)`` reads it offline exactly as a
    ``hub`` source reads the real dataset; returns ``directory`` (a ``hub`` source's ``path``).
    """
    import json

    directory.mkdir(parents=True, exist_ok=True)
    (directory / config_name).mkdir(exist_ok=True)
    header = ["---", "configs:", f"- config_name: {config_name}", "  data_files:"]
    for split, pairs in splits.items():
        header += [f"  - split: {split}", f"    path: {config_name}/{split}.jsonl"]
        with open(directory / config_name / f"{split}.jsonl", "w", encoding="utf-8") as f:
            for src, tgt in pairs:
                f.write(
                    json.dumps({"translation": {src_lang: src, tgt_lang: tgt}}, ensure_ascii=False)
                    + "\n"
                )
    (directory / "README.md").write_text("\n".join(header + ["---", ""]), encoding="utf-8")
    return str(directory)


def shipped_pairs(start: int, count: int) -> list[tuple[str, str]]:
    """Lines ``start .. start+count`` of the shipped training split as (en, es) pairs."""
    sides = []
    for lang in ("en", "es"):
        with gzip.open(DATA / f"train.{lang}.gz", "rt", encoding="utf-8") as f:
            sides.append(f.read().split("\n")[start : start + count])
    return list(zip(*sides))


def random_run(workdir: Path, *decode: str, **model: int) -> Path:
    """A run directory without training: a SentencePiece model (200 pieces) of the shipped
    text, and one checkpoint (step 1) of a randomly initialised tiny model (``model`` keys
    override its sizes; ``decode`` are ``decode.*`` overrides). Loads like a trained run."""
    from seq2seq.config import save_config
    from seq2seq.data.tokenizer import train_or_load
    from seq2seq.workdir import config_path

    texts = []
    for lang in ("en", "es"):
        with gzip.open(DATA / f"train.{lang}.gz", "rt", encoding="utf-8") as f:
            texts += f.read().split("\n")[:400]
    workdir.mkdir(parents=True, exist_ok=True)
    tokenizer = load_config(None, ["tokenizer.vocab_size=200"]).tokenizer
    vocab = train_or_load(texts, tokenizer, workdir).vocab_size
    sizes = dict(d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1, num_decoder_layers=1)
    sizes.update(model)
    config = load_config(
        None,
        [
            f"workdir={workdir}",
            "tokenizer.vocab_size=200",
            f"model.vocab_size={vocab}",
            "model.dropout_rate=0.0",
            *(f"model.{k}={v}" for k, v in sizes.items()),
            *decode,
        ],
    )
    save_config(config, config_path(workdir))
    random_checkpoint(workdir, 1)
    return workdir


def random_checkpoint(workdir: Path, step: int, seed: int = 0) -> None:
    """Save a randomly initialised model (``seed``) of the run in ``workdir`` (its
    ``config.yaml``) as the checkpoint of ``step``: the newest, so the run's default."""
    from seq2seq.model import build_model
    from seq2seq.training.checkpoints import Checkpointer
    from seq2seq.training.step import create_train_state, make_optimizer
    from seq2seq.workdir import checkpoint_dir, config_path

    config = load_config(config_path(workdir))
    model = build_model(config.model, seed)
    _, state = create_train_state(model, make_optimizer(config.train), seed)
    ck = Checkpointer(checkpoint_dir(workdir), keep=None, async_save=False)
    try:
        ck.save(step, state.replace(step=jax.numpy.asarray(step, jax.numpy.int32)), {"step": step})
    finally:
        ck.close()
