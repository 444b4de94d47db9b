"""Every shipped config in ``configs/`` loads, and trains on multi-device meshes.

The fast test checks the batch arithmetic: the rows of a batch (``data.max_tokens //
data.max_len``) are split over ``mesh.data × mesh.fsdp``, so they must divide by the device
counts a config is meant for. The slow test runs the real ``seq2seq-train`` command of every
config on 8 fake CPU devices, on the mesh (2,2,2) (the shipped preset also on (8,1,1) and
(2,4,1)), reading a small local dataset in the format the config names; only depth, width and
vocabulary are shrunk, never ``data.max_len`` / ``data.max_tokens``.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_run import ROOT, cli_env, shipped_pairs, write_hub_dataset, xla_flags

from benchmarks.harness import TINY_SIZES
from seq2seq.config import load_config
from seq2seq.data import recipe

CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
WMT_PRESETS = ("transformer_base.yaml", "transformer_big.yaml")
# (2, 2, 2) splits over all three axes at once: every config trains on it; the shipped preset
# also on the pure data and the data × fsdp meshes (the meshes themselves are tested against one
# device in tests/test_sharding_multidevice.py; here each config's own settings meet a mesh)
MESHES = [(8, 1, 1), (2, 4, 1), (2, 2, 2)]
EVERY_CONFIG_MESH = (2, 2, 2)


def meshes(path: Path) -> list[tuple[int, int, int]]:
    """The meshes config ``path`` trains on in the slow test."""
    return MESHES if path.name == "tatoeba_en_es.yaml" else [EVERY_CONFIG_MESH]


def test_the_presets_exist():
    names = {p.name for p in CONFIGS}
    assert set(WMT_PRESETS) <= names and "tatoeba_en_es.yaml" in names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_loads_and_its_batch_rows_divide_over_the_devices(path):
    config = load_config(str(path), [])
    rows = config.data.max_tokens // config.data.max_len
    devices = (8, 16, 64, 256) if path.name in WMT_PRESETS else (8,)
    for n in devices:
        assert rows % n == 0, (
            f"{path.name}: {rows} rows per batch (max_tokens "
            f"{config.data.max_tokens} // max_len {config.data.max_len}) "
            f"cannot be split over {n} devices (data × fsdp)"
        )


# --- the real training command on 8 fake CPU devices ---------------------------------------

# Runs seq2seq-train once per override list (argv[1], JSON) in one process, so that jax is
# imported and the devices are set up once per config; writes each return code (or the
# exception that escaped) and wall time to argv[2].
_WORKER = """
import json, sys, time, traceback
from seq2seq.cli import train_main
results = []
for overrides in json.loads(sys.argv[1]):
    t0 = time.perf_counter()
    try:
        rc, error = train_main(overrides), None
    except BaseException:
        rc, error = None, traceback.format_exc()
    results.append({"rc": rc, "error": error, "seconds": time.perf_counter() - t0})
    mesh = " ".join(o for o in overrides if o.startswith("mesh."))
    print(f"[test_configs] {mesh}: rc={rc} in {results[-1]['seconds']:.1f} s",
          file=sys.stderr, flush=True)
with open(sys.argv[2], "w") as f:
    json.dump(results, f)
"""

TRAIN_PAIRS = 300
# Dev and test sources of at most 14 ASCII characters are at most 16 tokens with any
# tokenizer (a piece per character at worst, one for the leading "▁", EOS): every sentence
# decoded (dev BLEU, test) falls in the translator's smallest length bucket, so each search
# compiles once.
SHORT_CHARS, DEV_PAIRS, TEST_PAIRS = 14, 8, 8
SMALL = TINY_SIZES  # the data sizes stay the config's own
SHORT = [
    "train.steps=1",
    "train.eval_every=1",
    "train.checkpoint_every=1",
    "train.log_every=1",
    "train.warmup_steps=1",
    "train.bleu_subset=4",
    "decode.test_limit=4",
]
# Compile time dominates these runs: XLA's CPU backend compiles about twice as fast without
# LLVM's optimization passes (the same programs, only less optimized machine code).
XLA_FLAGS = xla_flags(8)


def _fixture_pairs() -> dict[str, list[tuple[str, str]]]:
    """Lines of the shipped Tatoeba training split: the first ``TRAIN_PAIRS`` for training,
    short ones after them for dev and test."""
    short = [
        p for p in shipped_pairs(TRAIN_PAIRS, 2000) if len(p[0]) <= SHORT_CHARS and p[0].isascii()
    ]
    assert len(short) >= DEV_PAIRS + TEST_PAIRS
    return {
        "train": shipped_pairs(0, TRAIN_PAIRS),
        "dev": short[:DEV_PAIRS],
        "test": short[DEV_PAIRS : DEV_PAIRS + TEST_PAIRS],
    }


def _data_overrides(path: Path, directory: Path) -> list[str]:
    """``data.{train,dev,test}.path`` of a small local dataset in the format ``path`` names."""
    config = load_config(str(path), [])
    d = config.data
    # a split may be a list of corpora (each its own direction of the same files): the first
    # entry stands for the split, and every entry is pointed at the fixture
    entries = {split: d.corpora(split) for split in ("train", "dev", "test")}
    sources = {split: e[0] for split, e in entries.items()}
    formats = {s.format for e in entries.values() for s in e}
    assert len(formats) == 1, f"{path.name}: splits in several formats {formats}"
    fmt, pairs = formats.pop(), _fixture_pairs()
    if fmt == "text":  # the layout of tests/tiny_run.py: write_corpus ({prefix}.{lang})
        (directory / "text").mkdir(parents=True)
        paths = {}
        for split, split_pairs in pairs.items():
            prefix = directory / "text" / split
            for lang, side in ((d.src_lang, 0), (d.tgt_lang, 1)):
                Path(f"{prefix}.{lang}").write_text(
                    "".join(p[side] + "\n" for p in split_pairs), encoding="utf-8"
                )
            paths[split] = str(prefix)
    elif fmt == "hub":
        names = {s.name for s in sources.values()}
        assert len(names) == 1, f"{path.name}: splits of several hub configs {names}"
        local = write_hub_dataset(
            directory / "hub",
            names.pop(),
            {sources[split].split: pairs[split] for split in pairs},
            d.src_lang,
            d.tgt_lang,
        )  # the config's own split names
        paths = {split: local for split in sources}
    else:
        pytest.fail(f"{path.name}: no local fixture for data format {fmt!r}; add one here")
    return [
        f"data.{split}.{i}.path={p}" if len(entries[split]) > 1 else f"data.{split}.path={p}"
        for split, p in paths.items()
        for i in range(len(entries[split]))
    ]


@pytest.mark.slow
@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_trains_on_multidevice_meshes(path, tmp_path):
    config = load_config(str(path), [])
    # the batch the recipe picks for the fixture's pairs (every train entry points at them)
    pairs = TRAIN_PAIRS * len(config.data.corpora("train"))
    own = recipe.resolve(config, recipe.CorpusSize(pairs, words=0))[0].data  # words: dropout only
    batch = f"of {own.max_tokens // own.max_len} rows x {own.max_len} tokens per step"
    data = _data_overrides(path, tmp_path / "data")
    runs = []
    for mesh in meshes(path):
        workdir = tmp_path / "run_{}x{}x{}".format(*mesh)
        runs.append(
            (
                mesh,
                workdir,
                [
                    "--config",
                    str(path),
                    f"workdir={workdir}",
                    *data,
                    *SMALL,
                    *SHORT,
                    f"mesh.data={mesh[0]}",
                    f"mesh.fsdp={mesh[1]}",
                    f"mesh.tensor={mesh[2]}",
                ],
            )
        )
    results_file = tmp_path / "results.json"
    env = cli_env(
        XLA_FLAGS=XLA_FLAGS,
        HF_DATASETS_OFFLINE="1",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_CACHE=str(tmp_path / "hf_cache"),
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _WORKER,
            json.dumps([argv for _, _, argv in runs]),
            str(results_file),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    assert proc.returncode == 0 and results_file.exists(), (
        f"{path.name}: worker failed (rc {proc.returncode}):\n{proc.stderr[-6000:]}"
    )
    results = json.loads(results_file.read_text())
    assert len(results) == len(runs)
    errors = "\n".join(line for line in proc.stderr.splitlines() if line.startswith("error: "))
    for (mesh, workdir, _), result in zip(runs, results):
        name = f"{path.name} on mesh {mesh}"
        assert result["rc"] == 0, (
            f"{name}: exit code {result['rc']}\n{result['error'] or ''}"
            f"{errors}\n--- stderr (end) ---\n{proc.stderr[-3000:]}"
        )
        summary = json.loads((workdir / "test.json").read_text())
        assert summary["step"] == 1, name
        assert summary["test_sentences"] == 4, name
        assert math.isfinite(summary["test_bleu"]), name
        log = (workdir / "train.log").read_text(encoding="utf-8")
        assert "Partitioner(data={}, fsdp={}, tensor={}; ".format(*mesh) in log, name
        assert batch in log, f"{name}: not the config's own batch ({batch})"
