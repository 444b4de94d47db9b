#!/usr/bin/env python3
"""Translation quality at the same training time (issues 21, 35 and 50): our config, pre-norm
and post-norm, against two same-size PyTorch peers of the same norm placement, each trained
with the plain recipe and at its best on dev, on held-out test sets, two seeds, paired tests.

Run as ``python -m benchmarks.compare_quality`` or ``python -m benchmarks.compare --quality``
(the same options; the same optional extra ``compare``).

Held-out test sets. No proxy is tested on the shipped dev or test split (the preset's settings
were chosen looking at them). Each proxy's test set is carved out of the shipped TRAIN split as
the shipped splits were made (``data/tatoeba-en-es/README.md``): pairs that share an English or
a Spanish sentence (lowercased, whitespace folded) form a group (union-find); groups of at most
8 pairs are eligible, ordered by sha256 of ``"quality-heldout:" + the group's smallest English
sentence``; whole groups go to ``full``'s test, then ``small``'s, then ``long``'s until each
holds at least ``--test-pairs`` (2,000) pairs (``carve_heldout``). Every pair of every held-out
group leaves the training data of every proxy, so no proxy trains on a test sentence of any
proxy, on either side. The shipped dev split is where choices are made. Proxies
(``--proxies``, default ``full,small``):

* ``full``: train = the shipped train minus the held-out groups; dev = the shipped dev;
  test = held-out set A;
* ``small``: train = the first 20,000 pairs of ``full``'s train; dev = the first 500 dev pairs;
  test = held-out set B;
* ``long``: ``full``'s train, the shipped dev and held-out set C, each with 2–4 consecutive
  pairs joined into one (``join_consecutive``, seeds 0, 1, 2: about 20–30 words per side).

Systems (``--systems``), per proxy and seed (``--seeds``, default 1,2):

1. ``ours-pre`` / ``ours-post``: ``python -m seq2seq train --config CONFIG`` with the data
   paths, ``model.matmul_dtype=float32`` (the peers compute in float32), the ``--set``
   overrides, ``model.norm=pre`` / ``post``, ``train.seed=S`` and (with ``--budget``)
   ``train.time_budget=B``; the test translations are its ``test.hyp``, the dev ones
   ``python -m seq2seq translate`` of the same (last) checkpoint. The record keeps the recipe
   at the run's real step count (``real_recipe``: ``test.json``'s steps, not ``config.yaml``'s
   provisional ``train.steps``): the warmup share and what the dropout rule gives there.
2. ``peer-post`` (MarianMT) beside ``ours-post`` and ``peer-pre``
   (``torch.nn.Transformer(norm_first=True)``) beside ``ours-pre``: our run's sizes, its
   SentencePiece pieces and decoding rules (``benchmarks/peers.py``), trained at least
   our run's seconds and ``--peer-seconds`` (default budget × 15/13: 900 s against 780), at
   the grid's points (``GridPoint``): at the first seed every peak rate × warmup × schedule
   of ``--peer-lrs`` (5e-4, 1e-3, 2e-3), ``--peer-warmups`` (400 steps, or ``ours``: our
   run's real warmup share of the peer's projected steps) and ``--peer-schedules`` (``rsqrt``,
   or ``linear`` decay to zero at the end the time fixes), at the first ``--peer-dropouts``
   (0.1), then the pick's point with each other dropout (``ours``: our run's resolved rate,
   when it differs). The grid must hold the plain recipe's point (1e-3, 400, rsqrt, 0.1).
   Each candidate decodes dev and test; the best dev BLEU is the peer's pick ("best"), and
   its first-seed run is that seed's result; the other seeds train the plain point and the
   pick. A peer trains only on a machine like its ours' (the record's ``machine``: the CPU's
   name, its AVX2 / AVX-512 / AMX units and the cores), since the same seconds buy another
   machine another number of steps; elsewhere it waits, as for a missing record of ours.

``--dev-check KEY=VALUE`` (repeatable) trains only ours (pre-norm) with those overrides for the
proxies and seeds given and records its dev scores (not its test scores): how a recipe constant
(e.g. ``model.dropout_rate``) is checked on dev against ours' record of the same seed.

Budget: ours trains for ``--budget`` seconds (default: the config's ``train.time_budget``,
780 s for the preset).

Records (``benchmarks/quality_records.py``): every finished training writes one JSON record under
``--records`` (``docs/data/quality/``) with its test translations and, for ours, its
SentencePiece model; a rerun under the same settings (``settings``: among them the sha256 of
the config, of the recipe's rules and of the peers' recipe) skips it, so the comparison
resumes across sessions and machines from the committed records (the run directories under
``--out`` are not needed again). A record is written whole or not at all; a run of ours killed
before its record starts again from nothing (a resumed run would not be a budgeted one); a
training that fails is named and skipped, the others go on, and the exit status is 1. The
plan (the trainings, how many are recorded, the hours left) is printed first. While a file
``PAUSE`` exists under ``--out``, the next training waits (heavy work can run between two
budgeted trainings); each record keeps the 1-minute load average at its training's start
and end.
``--from-records`` trains nothing.

Table: generated from the records alone (``quality_records.build`` / ``markdown``): per proxy
and seed, ours pre-norm, ours post-norm, each peer's plain point and dev pick with their
settings, steps, seconds, dev BLEU, test BLEU with its 95% CI, chrF, and the paired tests'
p-values (``seq2seq.evaluation.compare``: sacreBLEU's paired bootstrap resampling, 1,000
resamples, and approximate randomization, 10,000 trials, seed 12345) against ours of the same
norm placement (ours post-norm against ours pre-norm); then the grid's dev scores as an
appendix. It goes to stdout, ``--json`` and ``--docs`` (between the ``compare.py quality``
markers). The smoke test's ``--limit-lines N`` cuts every split (the test sets too) to N lines
after the carving and allows a single seed.

Run time: printed by the plan. With the defaults (2 proxies, 2 seeds, a grid of 12 points and
at most one more dropout) at most 2 × (4 runs of ours + 2 × (13 + 2) peer runs) = 68 trainings
of 13–15 minutes plus decoding: about 19.6 hours of a quiet 2-core machine, in as many
sessions as it takes. Not run in CI.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from benchmarks.harness import machine_info, read_lines, write_docs
from benchmarks.peers import (
    ARCHS,
    INSTALL,
    PLAIN,
    RECIPE,
    SCHEDULES,
    GridPoint,
    PeerSetup,
    grid_points,
    missing_peers,
    train_peer,
)
from benchmarks.quality_records import (
    PEER_OF,
    SYSTEMS,
    RecordError,
    build,
    dev_pick,
    lines_sha256,
    load_records,
    load_tokenizer,
    markdown,
    read_record,
    record_path,
    save_tokenizer,
    unit_name,
    write_record,
)

ROOT = Path(__file__).resolve().parents[1]
PROXIES = ("full", "small", "long")
SPLITS = ("train", "dev", "test")
LANGS = ("en", "es")
DOCS_BEGIN = "<!-- compare.py quality: begin -->"
DOCS_END = "<!-- compare.py quality: end -->"
FLOAT32 = ["model.matmul_dtype=float32"]  # ours computes as the peers do
SALT = "quality-heldout"
MAX_HELDOUT_GROUP = 8  # larger groups (very common short sentences) always stay in train
TEST_PAIRS = 2_000
SMALL_PAIRS, SMALL_DEV = 20_000, 500
# the plan's estimates beyond the training seconds: ours' start, compilation and two decodes;
# a peer's dev and test decodes (beam 4 without a cache)
OURS_OVERHEAD_SECONDS, PEER_OVERHEAD_SECONDS = 150, 150


class UsageError(Exception):
    """Bad options or input; the message names the option or file (exit status 2)."""


# -- the proxy corpora -----------------------------------------------------------------------------


def join_consecutive(
    src: list[str], tgt: list[str], seed: int, sizes: tuple[int, ...] = (2, 3, 4)
) -> tuple[list[str], list[str]]:
    """Join runs of consecutive pairs into one pair: run lengths drawn from ``sizes`` with
    ``seed``; each side joined with a space, so the two sides stay aligned.

    Raises:
      ValueError: the sides have different line counts.
    """
    if len(src) != len(tgt):
        raise ValueError(f"{len(src)} source lines but {len(tgt)} target lines")
    rng = random.Random(seed)
    out_src, out_tgt, i = [], [], 0
    while i < len(src):
        n = rng.choice(sizes)
        out_src.append(" ".join(src[i : i + n]))
        out_tgt.append(" ".join(tgt[i : i + n]))
        i += n
    return out_src, out_tgt


def sentence_key(text: str) -> str:
    """The key two sentences share when equal case-insensitively after whitespace folding."""
    return " ".join(text.split()).lower()


class Carved(NamedTuple):
    """The held-out test sets carved out of a training split (``carve_heldout``).

    Attributes:
      train: indices of the pairs left for training, in corpus order.
      heldout: proxy name → indices of its test pairs, in corpus order.
      groups: proxy name → the number of whole groups in its test set.
      eligible_groups: groups of at most ``max_group`` pairs (the candidates).
      salt, max_group: the carving's settings.
    """

    train: list[int]
    heldout: dict[str, list[int]]
    groups: dict[str, int]
    eligible_groups: int
    salt: str
    max_group: int


def carve_heldout(
    en: Sequence[str],
    es: Sequence[str],
    names: Sequence[str] = PROXIES,
    pairs: int = TEST_PAIRS,
    salt: str = SALT,
    max_group: int = MAX_HELDOUT_GROUP,
) -> Carved:
    """Held-out test sets of at least ``pairs`` pairs for each of ``names``, carved out of the
    training pairs (``en[i]``, ``es[i]``) as the shipped splits were made.

    Pairs sharing an English or a Spanish sentence (``sentence_key``) form a group
    (union-find). Groups of at most ``max_group`` pairs are ordered by
    sha256(``f"{salt}:{smallest English sentence}"``) and assigned whole, in that order, to
    ``names[0]`` until it holds ``pairs`` pairs, then to ``names[1]``, and so on. Every pair
    of a held-out group leaves ``train``, so no held-out sentence (either side) is in it.

    Raises:
      ValueError: the sides differ in length, or the eligible groups hold too few pairs.
    """
    if len(en) != len(es):
        raise ValueError(f"{len(en)} English lines but {len(es)} Spanish lines")
    parent = list(range(len(en)))

    def find(i: int) -> int:
        root = i
        while parent[root] != root:
            root = parent[root]
        while parent[i] != root:  # path compression
            parent[i], i = root, parent[i]
        return root

    first: dict[tuple[int, str], int] = {}  # (side, key) → the first pair holding it
    for i, pair in enumerate(zip(en, es)):
        for side, text in enumerate(pair):
            j = find(first.setdefault((side, sentence_key(text)), i))
            parent[find(i)] = j
    members: dict[int, list[int]] = {}
    for i in range(len(en)):
        members.setdefault(find(i), []).append(i)
    eligible = [g for g in members.values() if len(g) <= max_group]
    eligible.sort(
        key=lambda g: (
            hashlib.sha256(f"{salt}:{min(en[i] for i in g)}".encode()).hexdigest(),
            g[0],
        )
    )
    heldout: dict[str, list[int]] = {}
    groups: dict[str, int] = {}
    order = iter(eligible)
    for name in names:
        chosen: list[int] = []
        groups[name] = 0
        while len(chosen) < pairs:
            group = next(order, None)
            if group is None:
                raise ValueError(
                    f"the {len(eligible)} groups of at most {max_group} pairs hold too few "
                    f"pairs for {len(names)} held-out sets of {pairs}"
                )
            chosen += group
            groups[name] += 1
        heldout[name] = sorted(chosen)
    held = {i for idx in heldout.values() for i in idx}
    train = [i for i in range(len(en)) if i not in held]
    return Carved(train, heldout, groups, len(eligible), salt, max_group)


Split = tuple[list[str], list[str]]  # (English lines, Spanish lines), aligned


def proxy_splits(
    name: str,
    shipped: dict[str, Split],
    carved: Carved,
    small_pairs: int = SMALL_PAIRS,
    small_dev: int = SMALL_DEV,
) -> dict[str, Split]:
    """Proxy ``name``'s train, dev and test (see the module docstring) from the shipped
    ``train`` and ``dev`` splits and the carving of the shipped train split."""
    en, es = shipped["train"]

    def pick(indices: list[int]) -> Split:
        return [en[i] for i in indices], [es[i] for i in indices]

    train, dev, test = pick(carved.train), shipped["dev"], pick(carved.heldout[name])
    if name == "small":
        train = (train[0][:small_pairs], train[1][:small_pairs])
        dev = (dev[0][:small_dev], dev[1][:small_dev])
    splits = {"train": train, "dev": dev, "test": test}
    if name == "long":
        splits = {s: join_consecutive(*splits[s], seed=i) for i, s in enumerate(SPLITS)}
    return splits


def write_proxy(splits: dict[str, Split], out: Path, limit: int = 0) -> Path:
    """Write ``splits`` as ``out/{split}.{lang}`` text files (the first ``limit`` lines of
    each when ``limit``: the smoke test); returns ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    for split, sides in splits.items():
        for lang, lines in zip(LANGS, sides):
            lines = lines[:limit] if limit else lines
            (out / f"{split}.{lang}").write_text("".join(s + "\n" for s in lines), encoding="utf-8")
    return out


def words_per_line(path: Path) -> float:
    lines = path.read_text(encoding="utf-8").splitlines()
    return sum(len(s.split()) for s in lines) / max(len(lines), 1)


def heldout_provenance(carved: Carved, asked: int, shipped_train: int) -> dict[str, Any]:
    """The carving as the JSON and the table's note give it."""
    removed = shipped_train - len(carved.train)
    return {
        "source": "the shipped train split (data/tatoeba-en-es/train.*)",
        "salt": carved.salt,
        "hash": f'sha256("{carved.salt}:" + smallest English sentence of the group)',
        "max_group_pairs": carved.max_group,
        "pairs_asked": asked,
        "eligible_groups": carved.eligible_groups,
        "sets": {
            n: {"pairs": len(idx), "groups": carved.groups[n]} for n, idx in carved.heldout.items()
        },
        "shipped_train_pairs": shipped_train,
        "removed_from_every_proxys_train": removed,
        "note": "the shipped dev and test splits are no proxy's test; choices are made on dev",
    }


# -- ours ------------------------------------------------------------------------------------------


def train_ours(config: str, data: Path, workdir: Path, overrides: list[str]) -> dict[str, Any]:
    """``python -m seq2seq train`` on ``data``; returns its ``test.json``.

    Raises:
      RuntimeError: the run failed (its last output lines quoted).
    """
    args = [
        sys.executable,
        "-m",
        "seq2seq",
        "train",
        "--config",
        config,
        f"workdir={workdir}",
        *[f"data.{s}.format=text" for s in SPLITS],
        *[f"data.{s}.path={data / s}" for s in SPLITS],
        *overrides,
    ]
    run_command(args, "seq2seq-train")
    return json.loads((workdir / "test.json").read_text(encoding="utf-8"))


def run_command(args: list[str], name: str) -> None:
    """Run ``args`` (``python -m seq2seq ...``) from the repository root, echoing it.

    Raises:
      RuntimeError: it failed (``name``, the exit status and its last output lines quoted).
    """
    print("  " + " ".join(args[2:]), flush=True)
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-20:])
        raise RuntimeError(f"{name} failed (exit {proc.returncode}):\n{tail}")


def ours_hypotheses(workdir: Path, test_source: Path, test_step: int) -> list[str]:
    """Our run's test translations, one per line of ``test_source``: the run's own
    ``test.hyp`` when it has one line per source line, else ``python -m seq2seq translate``
    of the checkpoint the test score used (into ``workdir/test.translated.hyp``).

    Raises:
      RuntimeError: the translation failed.
    """
    sources = len(read_lines(test_source))
    written = workdir / "test.hyp"
    if written.exists() and len(read_lines(written)) == sources:
        return read_lines(written)
    return ours_translate(workdir, test_step, test_source, workdir / "test.translated.hyp")


def ours_translate(workdir: Path, step: int, source: Path, output: Path) -> list[str]:
    """``python -m seq2seq translate`` of our run's checkpoint ``step`` on ``source`` (the
    run's decoding settings) into ``output``; returns its lines.

    Raises:
      RuntimeError: the translation failed.
    """
    args = [sys.executable, "-m", "seq2seq", "translate", "--workdir", str(workdir)]
    args += ["--step", str(step), "--input", str(source), "--output", str(output)]
    run_command(args, "seq2seq-translate")
    return read_lines(output)


def target_words(path: Path) -> int:
    """Whitespace-split words of ``path``: what the recipe's dropout rule counts."""
    return sum(len(s.split()) for s in read_lines(path))


def real_recipe(workdir: Path, words: int) -> dict[str, Any]:
    """Our finished run's recipe at its real step count: ``steps`` (``test.json``'s, the count
    ``train.time_budget`` chose; never ``config.yaml``'s provisional ``train.steps``),
    ``provisional_steps``, ``warmup_steps``, ``warmup_share`` (of the real steps),
    ``learning_rate``, ``dropout`` (resolved) and ``dropout_at_real_steps`` (what
    ``seq2seq.data.recipe.dropout_rate`` gives for the real steps' tokens over ``words``
    target-side training words).

    Raises:
      RuntimeError: the run has no ``test.json`` (it did not finish).
    """
    from seq2seq.config import load_config
    from seq2seq.data.recipe import dropout_rate
    from seq2seq.workdir import config_path

    summary_path = workdir / "test.json"
    if not summary_path.exists():
        raise RuntimeError(f"{summary_path}: missing; the run did not finish")
    cfg = load_config(config_path(workdir))
    t = cfg.train
    steps = int(json.loads(summary_path.read_text(encoding="utf-8"))["steps"])
    tokens = steps * cfg.data.max_tokens * max(t.grad_accum_steps, 1)
    return {
        "steps": steps,
        "provisional_steps": t.steps,
        "warmup_steps": t.warmup_steps,
        "warmup_share": t.warmup_steps / max(steps, 1),
        "learning_rate": t.learning_rate,
        "dropout": cfg.model.residual_dropout,
        "dropout_at_real_steps": dropout_rate(tokens, words),
    }


# -- the runs, each recorded once ----------------------------------------------------------------


def scores(hyps: list[str], refs: list[str]) -> dict[str, float]:
    """sacreBLEU BLEU and chrF of ``hyps`` (``seq2seq.evaluation.score``) and the line count."""
    from seq2seq.evaluation import score

    s = score(hyps, refs)
    return {"bleu": s.bleu, "chrf": s.chrf, "lines": len(refs)}


def commit() -> str:
    """The repository's HEAD commit ("unknown" outside a git checkout)."""
    proc = subprocess.run(
        ["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True
    )
    return proc.stdout.strip() if proc.returncode == 0 else "unknown"


def record_head(args: argparse.Namespace, proxy: str, unit: str, system: str, seed: int):
    """The fields every record starts with."""
    return {
        "proxy": proxy,
        "unit": unit,
        "system": system,
        "seed": seed,
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "machine": args.machine,
        "commit": commit(),
        "settings": args.settings,
    }


PAUSE = "PAUSE"  # a file of this name under --out holds the next training back
PAUSE_POLL_SECONDS = 30


def wait_while_paused(args: argparse.Namespace, unit: str) -> None:
    """Wait while ``--out``/PAUSE exists, before ``unit``'s training starts: heavy work (a
    test suite) can run between two budgeted trainings instead of slowing one down. Create
    the file, wait for the running training's record, work, then remove it."""
    pause = args.out_dir / PAUSE
    if pause.exists():
        print(f"  {unit}: paused while {pause} exists", flush=True)
        while pause.exists():
            time.sleep(PAUSE_POLL_SECONDS)
        print(f"  {unit}: resumed", flush=True)


def load_average() -> float | None:
    """The 1-minute load average (None where the platform has none): the records keep it at
    a training's start and end, so a disturbed run can be told from a quiet one."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def ours_overrides(
    args: argparse.Namespace, system: str, seed: int, dev_check: Sequence[str] = ()
) -> list[str]:
    """Our run's overrides: float32 (as the peers), ``--set``, a dev check's, the norm
    placement of ``system``, the seed and ``--budget``."""
    norm = "post" if system == "ours-post" else "pre"
    return [
        *FLOAT32,
        *args.set,
        *dev_check,
        f"model.norm={norm}",
        f"train.seed={seed}",
        *args.budget_override,
    ]


def run_ours(
    args: argparse.Namespace,
    proxy: str,
    data: Path,
    system: str,
    seed: int,
    dev_check: Sequence[str] = (),
) -> dict[str, Any]:
    """Our run of ``system`` (``ours-pre`` / ``ours-post``) and ``seed`` on the proxy's corpus
    ``data``, or its record. A dev check (``dev_check``: extra overrides) records dev scores
    only."""
    from seq2seq.config import load_config, to_dict
    from seq2seq.workdir import config_path, tokenizer_path

    unit = unit_name(system, seed, dev_check=dev_check)
    done = read_record(record_path(args.records_dir, proxy, unit), args.settings)
    if done is not None:
        print(f"  skip {unit}: recorded", flush=True)
        return done
    wait_while_paused(args, unit)
    workdir = args.out_dir / proxy / unit
    if workdir.exists():  # killed before its record: a resumed run would not be a 780 s run
        print(f"  {unit}: removing the unfinished run {workdir}", flush=True)
        shutil.rmtree(workdir)
    load = {"at_start": load_average()}
    summary = train_ours(args.config, data, workdir, ours_overrides(args, system, seed, dev_check))
    load["at_end"] = load_average()
    src, tgt = LANGS
    dev_hyps = ours_translate(
        workdir, summary["test_step"], data / f"dev.{src}", workdir / "dev.translated.hyp"
    )
    refs = read_lines(data / f"test.{tgt}")
    record = {
        **record_head(args, proxy, unit, system, seed),
        "point": None,
        "dev_check": list(dev_check),
        **real_recipe(workdir, target_words(data / f"train.{tgt}")),
        "step": summary["step"],
        "train_seconds": summary["train_seconds"],
        "load_average": load,
        "parameters": summary["trainable_parameters"],
        "dev": scores(dev_hyps, read_lines(data / f"dev.{tgt}")),
        "tokenizer": save_tokenizer(args.records_dir, proxy, tokenizer_path(workdir)),
        "config": to_dict(load_config(config_path(workdir))),
    }
    hyps = None
    if not dev_check:
        hyps = ours_hypotheses(workdir, data / f"test.{src}", summary["test_step"])
        record["test"] = scores(hyps, refs)
        record["references_sha256"] = lines_sha256(refs)
    print(
        f"  {unit}: {record['train_seconds']:.0f} s, {record['steps']} steps, dev BLEU "
        f"{record['dev']['bleu']:.2f}",
        flush=True,
    )
    return write_record(args.records_dir, proxy, unit, record, hyps)


def peer_setup(args: argparse.Namespace, proxy: str, ours: dict[str, Any]) -> PeerSetup:
    """What a peer takes from our record ``ours`` (its config, SentencePiece model and real
    warmup share), unpacked under ``--out``."""
    import yaml

    from seq2seq.config import load_config

    where = args.out_dir / proxy / "from-records"
    where.mkdir(parents=True, exist_ok=True)
    config = where / f"{ours['unit']}.yaml"
    config.write_text(yaml.safe_dump(ours["config"], sort_keys=False), encoding="utf-8")
    tokenizer = load_tokenizer(args.records_dir, ours["tokenizer"], where)
    return PeerSetup(load_config(config), tokenizer, ours["warmup_share"])


def run_peer(
    args: argparse.Namespace,
    proxy: str,
    data: Path,
    system: str,
    seed: int,
    point: GridPoint,
    order: int,
) -> dict[str, Any] | None:
    """Peer ``system`` (``peer-post`` / ``peer-pre``) at ``point`` and ``seed``, trained at
    least as long as ours of its norm placement and seed (and ``--peer-seconds``), or its
    record; None while that record of ours is missing. ``order``: the point's place in the
    grid (the appendix's order)."""
    unit = unit_name(system, seed, point)
    done = read_record(record_path(args.records_dir, proxy, unit), args.settings)
    if done is not None:
        print(f"  skip {unit}: recorded", flush=True)
        return done
    ours_unit = unit_name(PEER_OF[system], seed)
    ours = read_record(record_path(args.records_dir, proxy, ours_unit), args.settings)
    if ours is None:
        print(f"  {unit}: waits for the record of {ours_unit}", flush=True)
        return None
    if ours["machine"] != args.machine:  # its seconds would buy another number of steps
        print(
            f"  {unit}: waits for a machine like {ours_unit}'s ({ours['machine']}; this one: "
            f"{args.machine})",
            flush=True,
        )
        return None
    wait_while_paused(args, unit)
    seconds = max(ours["train_seconds"], args.peer_seconds_at_least)
    threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    arch = system.removeprefix("peer-")
    setup = peer_setup(args, proxy, ours)
    src, tgt = LANGS
    train = (read_lines(data / f"train.{src}"), read_lines(data / f"train.{tgt}"))
    sources = {split: read_lines(data / f"{split}.{src}") for split in ("dev", "test")}
    load = {"at_start": load_average()}
    r = train_peer(arch, setup, train, sources, seconds, threads or 1, seed, point)
    load["at_end"] = load_average()
    refs = read_lines(data / f"test.{tgt}")
    hyps, dev_hyps = r["hyps"]["test"], r.pop("hyps")["dev"]
    record = {
        **record_head(args, proxy, unit, system, seed),
        "point": point.to_json(),
        "order": order,
        "ours": ours_unit,
        "seconds_asked": seconds,
        "load_average": load,
        "architecture": ARCHS[arch],
        **r,
        "dev": scores(dev_hyps, read_lines(data / f"dev.{tgt}")),
        "test": scores(hyps, refs),
        "references_sha256": lines_sha256(refs),
    }
    print(
        f"  {unit}: {r['train_seconds']:.0f} s, {r['steps']} steps, dev BLEU "
        f"{record['dev']['bleu']:.2f}; {r['parameters']:,} trainable parameters, "
        f"{ours_unit} {ours['parameters']:,}",
        flush=True,
    )
    return write_record(args.records_dir, proxy, unit, record, hyps)


def peer_grid(args: argparse.Namespace) -> list[GridPoint]:
    """The grid's first stage: every rate, warmup and schedule at the first dropout."""
    return grid_points(args.lr_list, args.warmup_list, args.schedule_list, args.dropout_list[0])


def second_stage(
    args: argparse.Namespace, best: dict[str, Any], ours_dropout: float
) -> list[GridPoint]:
    """The grid's second stage: the first stage's dev pick ``best`` with each other dropout of
    ``--peer-dropouts`` (``ours``: ``ours_dropout``) that differs from its own."""
    p = best["point"]
    point = GridPoint(p["learning_rate"], p["warmup"], p["schedule"], p["dropout"])
    out: list[tuple[float, GridPoint]] = []
    for d in args.dropout_list[1:]:
        rate = ours_dropout if d == "ours" else float(d)
        if rate != best["dropout"] and all(rate != x for x, _ in out):
            out.append((rate, point._replace(dropout=d)))
    return [q for _, q in out]


def attempt(args: argparse.Namespace, unit: Callable[..., Any], *a: Any) -> Any:
    """``unit(args, *a)`` (one training and its record); a training that fails is reported,
    kept in ``args.failed`` and skipped (None), so that one diverging run does not stop the
    others."""
    try:
        return unit(args, *a)
    except RuntimeError as e:
        what = f"{a[0]} {a[2]} seed {a[3]}"  # proxy, system, seed
        print(f"  FAILED {what}: {e}", flush=True)
        args.failed.append(f"{what}: {str(e).splitlines()[0]}")
        return None


def run_proxy(args: argparse.Namespace, proxy: str, data: Path) -> None:
    """Every training of ``proxy`` that has no record yet, in order: ours (both norm
    placements, every seed), each peer's grid at the first seed (then the second stage's
    dropouts at the first stage's pick), then each peer's plain point and dev pick at the
    other seeds. With ``--dev-check``, only those runs of ours. A failed training is skipped
    (``attempt``); what needs its record waits for a later run."""
    seeds = args.seed_list
    if args.dev_check:
        for seed in seeds:
            attempt(args, run_ours, proxy, data, "ours-pre", seed, args.dev_check)
        return
    for seed in seeds:
        for system in ("ours-pre", "ours-post"):
            if system in args.system_list:
                attempt(args, run_ours, proxy, data, system, seed)
    for system in ("peer-post", "peer-pre"):
        if system not in args.system_list:
            continue
        grid = peer_grid(args)
        first = [
            attempt(args, run_peer, proxy, data, system, seeds[0], p, i) for i, p in enumerate(grid)
        ]
        if any(r is None for r in first):
            continue
        ours = read_record(
            record_path(args.records_dir, proxy, unit_name(PEER_OF[system], seeds[0])),
            args.settings,
        )
        assert ours is not None  # the first stage ran
        stage = second_stage(args, dev_pick(first), ours["dropout"])  # type: ignore[arg-type]
        second = [
            attempt(args, run_peer, proxy, data, system, seeds[0], p, len(grid) + i)
            for i, p in enumerate(stage)
        ]
        best = dev_pick([r for r in first + second if r is not None])
        assert best is not None
        picked = GridPoint(**best["point"])
        print(f"  {system}: dev pick {picked.name} (dev BLEU {best['dev']['bleu']:.2f})")
        for seed in seeds[1:]:
            attempt(args, run_peer, proxy, data, system, seed, PLAIN, -1)
            if picked != PLAIN:
                attempt(args, run_peer, proxy, data, system, seed, picked, -1)


def planned(args: argparse.Namespace, proxy: str) -> list[tuple[str, float]]:
    """(unit, estimated seconds) of every training ``run_proxy`` will make on ``proxy``,
    recorded or not; where the dev pick is not known yet, one run per peer and seed (an upper
    bound: none if the pick is the plain point) and every second-stage dropout."""
    ours_s = args.budget_seconds + OURS_OVERHEAD_SECONDS
    peer_s = max(args.budget_seconds, args.peer_seconds_at_least) + PEER_OVERHEAD_SECONDS
    seeds = args.seed_list
    if args.dev_check:
        return [(unit_name("ours-pre", s, dev_check=args.dev_check), ours_s) for s in seeds]
    units = [
        (unit_name(system, seed), ours_s)
        for seed in seeds
        for system in ("ours-pre", "ours-post")
        if system in args.system_list
    ]
    found = load_records(args.records_dir, proxy, args.settings)
    for system in ("peer-post", "peer-pre"):
        if system not in args.system_list:
            continue
        grid = peer_grid(args)
        units += [(unit_name(system, seeds[0], p), peer_s) for p in grid]
        first = [found.get(unit_name(system, seeds[0], p)) for p in grid]
        ours = found.get(unit_name(PEER_OF[system], seeds[0]))
        if not all(first) or ours is None:  # the pick is not known yet
            units += [
                (f"{system}-seed{seeds[0]}-dropout-{d}", peer_s) for d in args.dropout_list[1:]
            ]
            units += [
                (f"{system}-seed{s}-{k}", peer_s) for s in seeds[1:] for k in ("plain", "pick")
            ]
            continue
        stage = second_stage(args, dev_pick(first), ours["dropout"])  # type: ignore[arg-type]
        units += [(unit_name(system, seeds[0], p), peer_s) for p in stage]
        second = [found.get(unit_name(system, seeds[0], p)) for p in stage]
        best = dev_pick([r for r in first + second if r is not None])
        assert best is not None
        picks = {PLAIN, GridPoint(**best["point"])}
        units += [(unit_name(system, s, p), peer_s) for s in seeds[1:] for p in picks]
    return units


def print_plan(args: argparse.Namespace) -> tuple[int, int]:
    """Print the planned trainings per proxy, how many are recorded and the hours left;
    returns (planned, recorded)."""
    total = recorded = 0
    left = 0.0
    for proxy in args.proxy_list:
        found = load_records(args.records_dir, proxy, args.settings)
        units = planned(args, proxy)
        done = [u for u, _ in units if u in found]
        todo = sum(s for u, s in units if u not in found)
        total, recorded, left = total + len(units), recorded + len(done), left + todo
        print(
            f"plan {proxy}: {len(units)} trainings, {len(done)} recorded, about "
            f"{todo / 3600:.1f} h left",
            flush=True,
        )
    print(
        f"plan: {total} trainings, {recorded} recorded, about {left / 3600:.1f} h left "
        f"(ours {args.budget_seconds:g} s + {OURS_OVERHEAD_SECONDS} s each, peers "
        f"{max(args.budget_seconds, args.peer_seconds_at_least):.0f} s + "
        f"{PEER_OVERHEAD_SECONDS} s)",
        flush=True,
    )
    return total, recorded


# -- the command line ------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(p)
    p.add_argument("--json", help="write the table's figures as JSON to this file")
    p.add_argument(
        "--docs",
        help="replace the table between the compare.py quality markers in this Markdown file "
        "(docs/benchmarks.md)",
    )
    return p.parse_args(argv)


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("--quality")
    g.add_argument(
        "--proxies", default="full,small", help="comma-separated: full, small, long (full,small)"
    )
    g.add_argument("--config", default="configs/tatoeba_en_es.yaml", help="our config file")
    g.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an override of our config (repeatable; the peers follow the run's model sizes)",
    )
    g.add_argument(
        "--corpus",
        default=str(ROOT / "data" / "tatoeba-en-es"),
        help="the shipped corpus: {train,dev}.{en,es}[.gz]",
    )
    g.add_argument("--seeds", default="1,2", help="comma-separated, at least two (default 1,2)")
    g.add_argument(
        "--systems",
        default=",".join(SYSTEMS),
        help=f"comma-separated, of {', '.join(SYSTEMS)} (all); a peer needs ours' record of "
        "its norm placement",
    )
    g.add_argument(
        "--peer-lrs", default="5e-4,1e-3,2e-3", help="the peers' grid: peak learning rates"
    )
    g.add_argument(
        "--peer-warmups",
        default="400,ours",
        help="the peers' grid: warmup steps, or 'ours' (our run's real warmup share of the "
        "peer's projected steps)",
    )
    g.add_argument(
        "--peer-schedules", default="rsqrt,linear", help="the peers' grid: rsqrt, linear"
    )
    g.add_argument(
        "--peer-dropouts",
        default="0.1,ours",
        help="the grid's dropout (the first), then those tried at its dev pick ('ours': our "
        "run's resolved rate)",
    )
    g.add_argument(
        "--dev-check",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="train only ours (pre-norm) with this extra override (repeatable) and record "
        "its dev scores, e.g. model.dropout_rate=0.15",
    )
    g.add_argument(
        "--budget",
        type=float,
        default=None,
        help="our training seconds (default: the config's train.time_budget)",
    )
    g.add_argument(
        "--peer-seconds",
        type=float,
        default=None,
        help="the peers train for our training seconds but at least this long "
        "(default: the budget × 15/13)",
    )
    g.add_argument(
        "--test-pairs", type=int, default=TEST_PAIRS, help="pairs per held-out test set (2000)"
    )
    g.add_argument("--out", default="runs/quality", help="corpora and run directories go here")
    g.add_argument(
        "--records",
        default="docs/data/quality",
        help="one JSON record per finished training (committed; a rerun skips them)",
    )
    g.add_argument(
        "--from-records",
        action="store_true",
        help="train nothing: build the table from the records (with --docs / --json)",
    )
    g.add_argument("--limit-lines", type=int, default=0, help=argparse.SUPPRESS)


def numbers(option: str, text: str, kind: type, smallest: int) -> list[Any]:
    """The comma-separated values of ``option`` as ``kind``: distinct, at least ``smallest``.

    Raises:
      UsageError: a value does not parse, repeats, or there are too few.
    """
    try:
        values = [kind(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise UsageError(f"{option} {text}: not a comma-separated list of numbers") from None
    if len(set(values)) != len(values):
        raise UsageError(f"{option} {text}: a value is repeated")
    if len(values) < smallest:
        raise UsageError(f"{option} {text}: needs at least {smallest} values")
    return values


def words(option: str, text: str, allowed: Callable[[str], bool], what: str) -> list[str]:
    """The comma-separated values of ``option``, each ``allowed``, distinct, at least one.

    Raises:
      UsageError: a value is not allowed (``what`` says what is), repeats, or none is given.
    """
    values = [s.strip() for s in text.split(",") if s.strip()]
    for s in values:
        if not allowed(s):
            raise UsageError(f"{option} {text}: {s!r} is not {what}")
    if not values or len(set(values)) != len(values):
        raise UsageError(f"{option} {text}: give distinct values")
    return values


def _dropout_value(s: str) -> bool:
    if s == "ours":
        return True
    try:
        return 0 <= float(s) < 1
    except ValueError:
        return False


def check(args: argparse.Namespace) -> None:
    """Validate the options and derive ``proxy_list``, ``seed_list``, ``system_list``,
    ``lr_list``, ``warmup_list``, ``schedule_list``, ``dropout_list``, ``budget_seconds``,
    ``budget_override`` (ours' ``train.time_budget``, if ``--budget``),
    ``peer_seconds_at_least``, ``records_dir``, ``out_dir`` and ``settings``.

    Raises:
      UsageError: the message names the option or file.
    """
    from seq2seq.config import ConfigError, load_config

    args.proxy_list = [s for s in args.proxies.split(",") if s]
    for s in args.proxy_list:
        if s not in PROXIES:
            raise UsageError(f"--proxies: unknown proxy {s!r}; choose from {', '.join(PROXIES)}")
    one_seed = args.limit_lines or args.dev_check or args.from_records
    args.seed_list = numbers("--seeds", args.seeds, int, 1 if one_seed else 2)
    args.system_list = words("--systems", args.systems, SYSTEMS.__contains__, "a system")
    args.lr_list = numbers("--peer-lrs", args.peer_lrs, float, 1)
    if any(lr <= 0 for lr in args.lr_list):
        raise UsageError(f"--peer-lrs {args.peer_lrs}: learning rates must be > 0")
    args.warmup_list = words(
        "--peer-warmups",
        args.peer_warmups,
        lambda s: s == "ours" or (s.isdigit() and int(s) > 0),
        "a step count > 0 or 'ours'",
    )
    args.schedule_list = words(
        "--peer-schedules", args.peer_schedules, SCHEDULES.__contains__, "rsqrt or linear"
    )
    args.dropout_list = words(
        "--peer-dropouts", args.peer_dropouts, _dropout_value, "a rate in [0, 1) or 'ours'"
    )
    if PLAIN not in peer_grid(args):
        raise UsageError(
            f"--peer-lrs/--peer-warmups/--peer-schedules/--peer-dropouts: the grid must hold "
            f"the plain recipe's point (learning rate {PLAIN.learning_rate:g}, warmup "
            f"{PLAIN.warmup}, {PLAIN.schedule}, the first dropout {PLAIN.dropout})"
        )
    if args.test_pairs < 1:
        raise UsageError(f"--test-pairs {args.test_pairs}: must be >= 1")
    if args.budget is not None and args.budget < 0:
        raise UsageError(f"--budget {args.budget:g}: must be >= 0")
    for kv in args.dev_check:
        if "=" not in kv:
            raise UsageError(f"--dev-check {kv}: not KEY=VALUE")
    corpus = Path(args.corpus)
    for split in ("train", "dev"):
        for lang in LANGS:
            path = corpus / f"{split}.{lang}"
            if not path.exists() and not path.with_name(path.name + ".gz").exists():
                raise UsageError(f"--corpus {corpus}: {path.name}[.gz] is missing")
    try:
        cfg = load_config(ROOT / args.config, [*args.set, *args.dev_check])
    except ConfigError as e:
        raise UsageError(f"--config {args.config} / --set / --dev-check: {e}") from None
    args.budget_override = [] if args.budget is None else [f"train.time_budget={args.budget:g}"]
    args.budget_seconds = cfg.train.time_budget if args.budget is None else args.budget
    args.peer_seconds_at_least = (
        args.budget_seconds * 15 / 13 if args.peer_seconds is None else args.peer_seconds
    )
    args.records_dir = Path(args.records).resolve()
    args.out_dir = Path(args.out).resolve()
    args.settings = settings(args)


def recipe_sha256(config: str) -> str:
    """sha256 of what sets the runs' recipe beyond the options: the config file's bytes, the
    rules that fill its recipe keys (``seq2seq/data/recipe.py``: the dropout rule, the batch)
    and the peers' ``RECIPE``. A change to any of them makes a new set of records, never a
    mix of old and new runs."""
    h = hashlib.sha256()
    for path in (Path(config), ROOT / "seq2seq" / "data" / "recipe.py"):
        h.update((ROOT / path).read_bytes())
    h.update(json.dumps(RECIPE, sort_keys=True).encode())
    return h.hexdigest()


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """What a record depends on (a rerun must match to reuse it): the corpus (relative to
    the repository when inside it), the config and ours' overrides, what sets the recipe
    (``recipe_sha256``), the budgets, the carving."""
    corpus = Path(args.corpus).resolve()
    return {
        "corpus": str(corpus.relative_to(ROOT)) if corpus.is_relative_to(ROOT) else str(corpus),
        "config": args.config,
        "recipe_sha256": recipe_sha256(args.config),
        "overrides": [*FLOAT32, *args.set, *args.budget_override],
        "budget_seconds": args.budget_seconds,
        "peer_seconds_at_least": args.peer_seconds_at_least,
        "test_pairs": args.test_pairs,
        "limit_lines": args.limit_lines,
        "salt": SALT,
    }


def heldout_text(h: dict[str, Any]) -> str:
    """The carving as the table's note says it."""
    sets = ", ".join(
        f"{n} {s['pairs']:,} pairs ({s['groups']:,} groups"
        + (f", joined into {s['joined_lines']:,} lines" if "joined_lines" in s else "")
        + ")"
        for n, s in h["sets"].items()
    )
    return (
        f"whole groups of ≤ {h['max_group_pairs']} pairs sharing a sentence, carved out of the "
        f"shipped train split in the order of sha256 with salt `{h['salt']}`: {sets}; their "
        f"{h['removed_from_every_proxys_train']:,} pairs are in no proxy's training data; the "
        "shipped dev and test splits are no proxy's test; choices were made on the shipped dev "
        "split only (small: its first 500 lines)."
    )


def runs_text(found: dict[str, dict[str, Any]]) -> str:
    """Dates, machines and commits of the records."""
    records = [r for units in found.values() for r in units.values()]
    if not records:
        return "none recorded yet."
    dates = sorted(r["date"] for r in records)
    machines = sorted({r["machine"] for r in records})
    commits = sorted({r["commit"] for r in records})
    overrides = " ".join(records[0]["settings"]["overrides"])
    return (
        f"{dates[0]} to {dates[-1]}; {'; '.join(machines)}; commits {', '.join(commits)}; "
        f"config `{records[0]['settings']['config']}`, overrides `{overrides} "
        "model.norm=pre|post train.seed=SEED`."
    )


def run(args: argparse.Namespace, machine: str) -> int:
    """The comparison (or with ``--from-records`` its table alone), its table written between
    ``DOCS_BEGIN`` and ``DOCS_END`` of ``--docs``. Returns the exit status: 2 for bad options,
    input or records (the message on stderr), 1 when a training failed (each named)."""
    try:
        check(args)
        args.machine = machine
        mine = {**args.settings, "records": str(args.records_dir)}
        saved = args.out_dir / "settings.json"
        if saved.exists() and json.loads(saved.read_text(encoding="utf-8")) != mine:
            raise UsageError(
                f"--out {args.out} holds runs with other settings ({saved}); "
                "give another --out or remove it"
            )
    except UsageError as e:
        print(f"compare.py --quality: {e}", file=sys.stderr)
        return 2
    corpus = Path(args.corpus)
    shipped = {
        s: (read_lines(corpus / f"{s}.en"), read_lines(corpus / f"{s}.es")) for s in SPLITS[:2]
    }
    try:
        carved = carve_heldout(*shipped["train"], pairs=args.test_pairs)
    except ValueError as e:
        print(f"compare.py --quality: --test-pairs {args.test_pairs}: {e}", file=sys.stderr)
        return 2
    provenance = heldout_provenance(carved, args.test_pairs, len(shipped["train"][0]))
    references, datas = {}, {}
    for name in args.proxy_list:
        splits = proxy_splits(name, shipped, carved)
        tests = splits["test"][1]
        references[name] = tests[: args.limit_lines] if args.limit_lines else tests
        if name == "long":
            provenance["sets"]["long"]["joined_lines"] = len(splits["test"][0])
        if not args.from_records:
            datas[name] = write_proxy(splits, args.out_dir / name / "data", args.limit_lines)
    try:
        total, recorded = print_plan(args)
        if not args.from_records:
            args.out_dir.mkdir(parents=True, exist_ok=True)
            saved.write_text(json.dumps(mine, indent=1), encoding="utf-8")
            args.failed = []
            for name in args.proxy_list:
                print(f"proxy {name}", flush=True)
                run_proxy(args, name, datas[name])
            total, recorded = print_plan(args)
        found = {p: load_records(args.records_dir, p, args.settings) for p in args.proxy_list}
        table = build(
            found,
            args.seed_list,
            PLAIN.name,
            len(peer_grid(args)),
            references,
            args.records_dir,
        )
    except RecordError as e:
        print(f"compare.py --quality: {e}", file=sys.stderr)
        return 2
    records_text = (
        str(args.records_dir.relative_to(ROOT))
        if args.records_dir.is_relative_to(ROOT)
        else str(args.records_dir)
    )
    meta = {
        "budget_text": f"train.time_budget {args.budget_seconds:g} s"
        if args.budget_seconds
        else "the config's steps (no time budget)",
        "peer_seconds_at_least": args.peer_seconds_at_least,
        "records": records_text,
        "recorded": recorded,
        "planned": total,
        "seeds": args.seed_list,
        "peers": f"{ARCHS['post']} and {ARCHS['pre']}, both of ours' sizes on its "
        "SentencePiece pieces (benchmarks/peers.py); plain = learning rate 1e-3 after 400 "
        "warmup steps, inverse square root, dropout 0.1; best = the grid's dev pick (grid: "
        f"learning rates {', '.join(f'{x:g}' for x in args.lr_list)} × warmups "
        f"{', '.join(args.warmup_list)} × schedules {', '.join(args.schedule_list)} at dropout "
        f"{args.dropout_list[0]}, then dropouts {', '.join(args.dropout_list[1:]) or 'none'} at "
        "its pick); decoded as ours: beam 4, ours' length penalty form and α, PAD, BOS and the "
        "unknown piece banned, ours' length limit.",
        "heldout_text": heldout_text(provenance),
        "runs_text": runs_text(found),
    }
    text = markdown(table, meta)
    print("\n" + text)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        blob = {"meta": {**meta, "heldout": provenance, "settings": args.settings}, **table}
        Path(args.json).write_text(json.dumps(blob, indent=1, ensure_ascii=False) + "\n")
        print(f"\nwrote {args.json}")
    if args.docs:
        write_docs(Path(args.docs), text, DOCS_BEGIN, DOCS_END)
        print(f"updated the quality table in {args.docs}")
    for failure in getattr(args, "failed", []):
        print(f"compare.py --quality: failed, not recorded: {failure}", file=sys.stderr)
    return 1 if getattr(args, "failed", []) else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    missing = missing_peers()
    if missing:
        print(
            f"benchmarks/compare_quality.py needs the optional extra 'compare' "
            f"({', '.join(missing)} not installed). Install it with:\n{INSTALL}",
            file=sys.stderr,
        )
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local; never ask the hub
    info = machine_info("float32")
    features = ", ".join(info["cpu_features"]) or "no AVX2"
    return run(args, f"{info['cpu']} ({features}), {info['cpus_usable']} cores")


if __name__ == "__main__":
    sys.exit(main())
