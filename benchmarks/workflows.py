"""Back-translation and sequence-level distillation on the shipped corpus, designed so that the
result can be read as evidence about the technique (issue 49): stage by stage, each stage a
public command (``python -m seq2seq train | translate | evaluate``) in its own process, timed,
resumable.

The design, for both recipes (``configs/back_translation.yaml`` holds the shared settings):

* one model size for the baseline, the reverse model, the forward models and the students
  (d_model 128, 3+3 layers; the distillation's teacher has the preset's width, d_model 256),
  chosen so that both recipes fit a 180-minute session on a 2-core CPU: before training
  anything the script times ``--probe-steps`` steps of each size and prints its plan with the
  estimated total;
* one tokenizer: the baseline's SentencePiece model (the tag ``<BT>`` one of its
  user-defined symbols) is every other run's ``tokenizer.model_file``;
* every model but the forward ones trained to its dev plateau: dev BLEU every
  ``train.eval_every`` steps, stopped after ``train.patience`` evaluations without a better
  one (at most ``train.steps``), the best checkpoint tested; the learning rate falls as the
  inverse square root of the step (Vaswani et al. 2017, eq. 3), the same at a given step in
  every run, whatever its length;
* equal real-data exposure: a forward model trains without early stopping for
  ``forward_steps(S, r)`` steps, S the baseline's steps and r the synthetic:real batch ratio
  (``data.train`` weights 1 and r): at least ``S · (1 + r)``, rounded up to where
  ``MixedBatches`` has given each corpus its share to within one batch, so it makes at least
  S updates on real pairs; the script checks it from the run's corpus shares.

``back-translation`` (Sennrich et al. 2016; tagged, Caswell et al. 2019):

1. the data: the first ``--pairs`` (20,000) pairs of the shipped training split; the Spanish
   side of the next ``--mono-lines`` (40,000) lines as monolingual text (their English side,
   ``mono_withheld.en``, is read only to score the synthetic sources); the shipped test split;
2. the step-time probes of both sizes, then the plan;
3. the baseline en→es (it trains the tokenizer) and the reverse model es→en;
4. the reverse model translates the monolingual text once per ``--methods`` entry (``METHODS``:
   beam search, sampling among the 10 most probable tokens as in Edunov et al. 2018, ...);
   each result is scored against the withheld English, with its copy rate and length ratio;
5. one forward model per method, on the real pairs plus that method's tagged synthetic pairs;
6. the baseline and the forward models scored on the test split in one paired test
   (``seq2seq-evaluate --hyp ... --hyp ...``: paired bootstrap and approximate randomization);
7. the control for the forward models' total updates: the baseline continued from its last
   checkpoint on the real pairs to their steps, without early stopping, and a second paired
   test against it.

``distillation`` (Kim & Rush 2016, sequence-level), after ``back-translation``:

1. the teacher (the preset's width) on the same real pairs;
2. the teacher translates the pairs' sources with its beam search (scored against the
   original targets);
3. the student (the back-translation baseline's size) on the teacher's targets; the student on
   the original targets is back-translation's continued baseline (step 7; the baseline where
   that stage did not run), not trained again. The teacher and the distilled student train
   its steps, without early stopping, the best checkpoint tested, as it did;
4. the three scored on the test split, with their decoding speed (``--compare``).

Resumable: after each stage the record (``docs/data/<recipe>.json``; ``<out>/<recipe>.json``
with ``--out`` or ``--smoke``) holds its command, time, peak memory and what it measured; a
rerun skips every stage whose record and outputs exist, an interrupted training resumes from
its last checkpoint and a bulk translation from its last chunk (a resumed stage's time counts
its last process only). The page (``docs/<recipe>.md``) and its dev-curve plot are generated
from the record alone.

Usage::

    python -m benchmarks.workflows back-translation         # then:
    python -m benchmarks.workflows distillation
    python -m benchmarks.workflows back-translation --plan  # the probes and the plan only
    python -m benchmarks.workflows back-translation --smoke # tiny models and data (minutes)
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import hashlib
import json
import math
import os
import re
import shlex
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from benchmarks.harness import cpu_name, run_command

ROOT = Path(__file__).resolve().parents[1]

SHIPPED = ROOT / "data" / "tatoeba-en-es"
CONFIG = ROOT / "configs" / "back_translation.yaml"
SETTINGS = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
SESSION_MINUTES = 180
# the distillation's teacher: the preset's width (configs/tatoeba_en_es.yaml), about 3.5x the
# students' parameters at the same depth
TEACHER = ["model.d_model=256", "model.d_ff=1024"]
# --smoke: tiny models, a few steps, a few hundred lines (checks the plumbing, not quality)
SMOKE = [
    "tokenizer.vocab_size=300",
    "model.d_model=32",
    "model.num_heads=2",
    "model.d_ff=64",
    "model.num_encoder_layers=1",
    "model.num_decoder_layers=1",
    "data.max_tokens=1024",
    "train.warmup_steps=2",
    "train.eval_every=4",
    "train.checkpoint_every=4",
    "train.log_every=2",
    "train.patience=1",
    "decode.beam_size=2",
]
SMOKE_TEACHER = ["model.d_model=48", "model.d_ff=96"]
# a model of a few steps writes nothing but spaces with beam search (then no training pair is
# left), so the smoke run samples its synthetic sources and the teacher's targets
SMOKE_METHODS = "topk10,sampling"
SMOKE_TEACHER_SEARCH = ["--search", "sampling", "--seed", "1"]
# seconds planned for a seq2seq-evaluate of hypothesis files (sacreBLEU's paired tests)
EVALUATE_SECONDS = 60.0


@dataclass(frozen=True)
class Method:
    """A way of producing the synthetic sources: its label and ``seq2seq-translate`` options."""

    label: str
    options: tuple[str, ...]


METHODS = {
    "beam": Method("beam search", ("--search", "beam")),
    "topk10": Method(
        "sampling, top-k 10", ("--search", "sampling", "--top-k", "10", "--seed", "1")
    ),
    "epsilon": Method(
        "epsilon sampling, ε 0.02", ("--search", "sampling", "--epsilon", "0.02", "--seed", "1")
    ),
    "sampling": Method("unrestricted sampling", ("--search", "sampling", "--seed", "1")),
}


def _lines(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return f.read().splitlines()


def _write(path: Path, lines: list[str]) -> None:
    """Write ``lines``, leaving a file with the same text untouched: a rerun must not change
    the files under a resumed run (its token store and tokenizer record fingerprint them)."""
    text = "".join(line + "\n" for line in lines)
    if path.is_file() and path.read_text(encoding="utf-8") == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _copy(src: Path, dst: Path) -> None:
    """``src`` to ``dst`` unless ``dst`` already holds the same bytes (see ``_write``)."""
    if not dst.is_file() or dst.read_bytes() != src.read_bytes():
        shutil.copyfile(src, dst)


def _rel(path: Path) -> str:
    """``path`` relative to the checkout when inside it (the commands read as a user types them)."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def _path(text: str) -> Path:
    """A path of the record (``_rel``'s form) as a path here."""
    return Path(text) if Path(text).is_absolute() else ROOT / text


def write_data(
    data: Path, pairs: int, mono_lines: int, test_lines: int | None, dev_lines: int | None
) -> None:
    """``data/``: ``small.{en,es}`` (the first ``pairs`` training pairs), ``mono.es`` (the
    Spanish side of the next ``mono_lines``), ``mono_withheld.en`` (their English side, read
    only to score the synthetic sources), ``dev.{en,es}`` and ``test.{en,es}`` (the shipped
    dev and test splits, or their first ``dev_lines`` / ``test_lines``), as plain text.

    Raises:
      SystemExit: the shipped training split has fewer than ``pairs + mono_lines`` pairs.
    """
    en, es = _lines(SHIPPED / "train.en.gz"), _lines(SHIPPED / "train.es.gz")
    if pairs + mono_lines > len(en):
        raise SystemExit(
            f"--pairs {pairs} + --mono-lines {mono_lines}: the shipped training split has "
            f"{len(en)} pairs"
        )
    _write(data / "small.en", en[:pairs])
    _write(data / "small.es", es[:pairs])
    _write(data / "mono.es", es[pairs : pairs + mono_lines])
    _write(data / "mono_withheld.en", en[pairs : pairs + mono_lines])
    for lang in ("en", "es"):
        _write(data / f"dev.{lang}", _lines(SHIPPED / f"dev.{lang}.gz")[:dev_lines])
        _write(data / f"test.{lang}", _lines(SHIPPED / f"test.{lang}.gz")[:test_lines])


def spm_sha256(workdir: Path) -> str:
    """SHA-256 of the SentencePiece model a run reads: its ``tokenizer.model_file`` (relative
    to the checkout), else the one it trained (``spm.model``)."""
    config = yaml.safe_load((workdir / "config.yaml").read_text(encoding="utf-8"))
    given = config["tokenizer"].get("model_file")
    path = _path(given) if given else workdir / "spm.model"
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_info(workdir: Path) -> dict[str, Any]:
    """What a finished training run measured, from its ``test.json`` and ``metrics.jsonl``:
    status (``early_stopping``: at its dev plateau), steps, the best dev BLEU and its step, the
    test scores, the updates on real pairs (the first corpus's observed share of the batches ×
    steps) and the synthetic share, the tokenizer's hash, and the dev curve (BLEU and loss by
    step)."""
    from seq2seq.plots import curves
    from seq2seq.training.metrics import read_metrics

    summary = json.loads((workdir / "test.json").read_text(encoding="utf-8"))
    dev = curves(read_metrics(workdir))
    shares = [share for share, _ in summary.get("corpus_shares", {}).values()]
    real = shares[0] if shares else 1.0
    return {
        "workdir": _rel(workdir),
        "status": summary["status"],
        "steps": summary["step"],
        "best_step": summary["best"]["step"],
        "best_dev_bleu": summary["best"]["value"],
        "test_step": summary["test_step"],
        "test_bleu": summary["test_bleu"],
        "test_chrf": summary["test_chrf"],
        "parameters": summary["parameters"],
        "real_updates": round(real * summary["step"]),
        "synthetic_share": 1.0 - real,
        "spm_sha256": spm_sha256(workdir),
        "dev_bleu": [list(p) for p in zip(*dev.get(("dev", "bleu"), ([], [])))],
        "dev_loss": [list(p) for p in zip(*dev.get(("dev", "loss"), ([], [])))],
    }


def synthetic_measures(synthetic: list[str], original: list[str]) -> dict[str, float]:
    """How generated sentences relate to the sentences they were translated from: the share of
    lines copied unchanged (``copy_rate``, stripped text equal), of empty lines, and the length
    ratio (whitespace words of all generated lines over those of the originals)."""
    n = max(len(original), 1)
    words = max(sum(len(s.split()) for s in original), 1)
    return {
        "lines": len(synthetic),
        "copy_rate": sum(s.strip() == o.strip() for s, o in zip(synthetic, original)) / n,
        "empty_rate": sum(not s.strip() for s in synthetic) / n,
        "length_ratio": sum(len(s.split()) for s in synthetic) / words,
    }


class Record:
    """The JSON record of one recipe: its conditions, the probes and the plan, every finished
    stage (command, wall seconds, peak RSS, the plan's estimate) and what the runs measured.
    Saved after each stage (a temporary file, then ``os.replace``), so that an interrupted run
    continues where it stopped.

    Raises:
      SystemExit: the file holds a run under other conditions (each differing key named with
        its old and new value).
    """

    def __init__(self, path: Path, head: dict[str, Any]):
        self.path = path
        if path.is_file():
            self.data = json.loads(path.read_text(encoding="utf-8"))
            old, new = self.data.get("conditions", {}), head["conditions"]
            changed = [k for k in sorted({*old, *new}) if old.get(k) != new.get(k)]
            if changed:
                diff = "; ".join(f"{k}: {old.get(k)!r} → {new.get(k)!r}" for k in changed)
                raise SystemExit(
                    f"{path} holds a run under other conditions ({diff}): give another --out "
                    "(or --record), or delete the file to start over"
                )
        else:
            self.data = {**head, "stages": {}, "runs": {}}

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, ensure_ascii=False) + "\n", "utf-8")
        os.replace(tmp, self.path)

    def run(
        self,
        key: str,
        command: list[str],
        log: Path,
        *,
        outputs: list[Path],
        estimate: float,
        keep_output: bool = False,
    ) -> dict[str, Any]:
        """Run ``python -m seq2seq COMMAND`` (``lora_adapt.run_command``: SystemExit with the
        log's tail on failure) unless the record has stage ``key`` and its ``outputs`` exist;
        returns the stage's record (its stdout as ``output`` with ``keep_output``)."""
        name, stage = stage_name(key), self.data["stages"].get(key)
        if stage and all(p.exists() for p in outputs):
            print(f"[{name}] done, kept ({stage['seconds'] / 60:.1f} min)", flush=True)
            return stage
        print(f"[{name}]" + (f" planned {estimate / 60:.1f} min" if estimate else ""), flush=True)
        log.parent.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        out, peak = run_command(command, log)
        stage = {
            "name": name,
            "command": command,
            "seconds": time.perf_counter() - start,
            "peak_rss_mib": peak,
            "estimate_s": estimate,
        }
        if keep_output:
            stage["output"] = out
        self.data["stages"][key] = stage
        self.save()
        print(f"[{name}] {stage['seconds'] / 60:.1f} min, peak RSS {peak:.0f} MiB", flush=True)
        return stage

    def train(self, key: str, workdir: Path, command: list[str], estimate: float) -> dict:
        """A training stage (done when ``workdir/test.json`` exists); its ``run_info`` is kept
        as ``runs[key]`` and returned."""
        log = workdir.parent / f"{key}.log"
        self.run(key, command, log, outputs=[workdir / "test.json"], estimate=estimate)
        self.data["runs"][key] = run_info(workdir)
        self.save()
        return self.data["runs"][key]

    def evaluate(self, key: str, command: list[str], report: Path, estimate: float) -> dict:
        """A ``seq2seq-evaluate`` stage writing ``--json REPORT``; returns the report."""
        command = [*command, "--json", _rel(report)]
        log = report.with_suffix(".log")
        self.run(key, command, log, outputs=[report], estimate=estimate, keep_output=True)
        return json.loads(report.read_text(encoding="utf-8"))


@dataclass
class Sizes:
    """The experiment's settings that differ between a real run and ``--smoke``."""

    student: list[str]  # overrides of configs/back_translation.yaml for the student size
    teacher: list[str]
    cap: int  # train.steps of the early-stopped runs
    eval_every: int
    probe_steps: int
    probe_lines: int
    teacher_search: list[str]  # seq2seq-translate options of the distillation's teacher


def _setting(overrides: list[str], key: str, default: Any) -> str:
    """The last ``key=value`` of ``overrides``, else ``default``."""
    values = [o.split("=", 1)[1] for o in overrides if o.startswith(f"{key}=")]
    return values[-1] if values else str(default)


def _train(workdir: Path, data: Path, extra: list[str]) -> list[str]:
    """``train`` with configs/back_translation.yaml in ``workdir``, its dev and test splits
    those of ``data/``."""
    return [
        "train",
        "--config",
        _rel(CONFIG),
        f"workdir={_rel(workdir)}",
        f"data.dev.path={_rel(data / 'dev')}",
        f"data.test.path={_rel(data / 'test')}",
        *extra,
    ]


def _real_pairs(data: Path) -> str:
    """The override that trains on the real pairs alone (a one-entry ``data.train`` list)."""
    return f"data.train=[{{path: {json.dumps(_rel(data / 'small'))}}}]"


def probe(record: Record, key: str, size: list[str], data: Path, out: Path, s: Sizes) -> dict:
    """Time a model size: ``s.probe_steps`` training steps on the real pairs with two dev
    evaluations, then the probe model translating 3 chunks of ``s.probe_lines`` source lines
    with its beam search (``--output-dir``: each chunk's seconds are recorded). Returns
    ``step_s`` (seconds per step, from the train records, evaluations and compilation left
    out), ``eval_s`` (the second, compiled, dev evaluation), ``overhead_s`` (the rest of the
    training command: start-up, tokenizer, compilation, test decoding), ``line_s`` (decoding
    seconds per line, the fastest chunk after the first: an untrained model decodes to the
    length limit, so an upper bound) and ``decode_overhead_s`` (the rest of the translate
    command)."""
    from seq2seq.training.metrics import read_metrics

    workdir, n = out / key, s.probe_steps
    log_every, eval_every = max(n // 8, 1), max(n // 2, 1)
    stage = record.run(
        key,
        _train(
            workdir,
            data,
            [
                _real_pairs(data),
                *size,
                f"train.steps={n}",
                f"train.eval_every={eval_every}",
                f"train.checkpoint_every={n}",
                f"train.log_every={log_every}",
                "train.patience=0",
                "decode.test_limit=10",
            ],
        ),
        out / f"{key}.log",
        outputs=[workdir / "test.json"],
        estimate=0.0,
    )
    records = read_metrics(workdir)
    train = {r["step"]: r["time"] for r in records if r["split"] == "train"}
    dev = {r["step"]: r["time"] for r in records if r["split"] == "dev"}
    # windows without an evaluation: (first record, first evaluation], (the record after it, n]
    windows = [(log_every, eval_every), (eval_every + log_every, n)]
    step_s = sum(train[b] - train[a] for a, b in windows) / sum(b - a for a, b in windows)
    eval_s = dev[n] - train[n]
    lines = _lines(data / "small.en")[: 3 * s.probe_lines]
    _write(out / f"{key}_decode" / "input.en", lines)
    decode = record.run(
        f"{key}_decode",
        [
            "translate",
            "--workdir",
            _rel(workdir),
            "--input",
            _rel(out / f"{key}_decode" / "input.en"),
            "--output-dir",
            _rel(out / f"{key}_decode"),
            "--chunk-lines",
            str(s.probe_lines),
        ],
        out / f"{key}_decode.log",
        outputs=[out / f"{key}_decode" / "translations.txt"],
        estimate=0.0,
    )
    chunks = sorted((out / f"{key}_decode" / "chunks").glob("*.json"))[1:]
    per_line = [json.loads(c.read_text(encoding="utf-8")) for c in chunks]
    line_s = min(c["seconds"] / max(len(c["translations"]), 1) for c in per_line)
    timing = {
        "step_s": step_s,
        "eval_s": eval_s,
        "overhead_s": max(stage["seconds"] - n * step_s - 2 * eval_s, 0.0),
        "line_s": line_s,
        "decode_overhead_s": max(decode["seconds"] - len(lines) * line_s, 0.0),
    }
    record.data.setdefault("probes", {})[key] = timing
    record.save()
    return timing


def forward_steps(baseline: int, ratio: float) -> int:
    """Steps of a forward model that make at least ``baseline`` updates on the real pairs at
    a synthetic:real batch ratio ``ratio`` (weights 1 and ``ratio``).

    ``MixedBatches`` shuffles each block of ``MIX_BLOCK`` batches, so within a block the real
    count may fall short of its share; at a block's end it is the largest-deficit count,
    within one of ``T / (1 + ratio)``. Hence the first multiple of ``MIX_BLOCK`` with
    ``T / (1 + ratio) >= baseline + 1`` (``ceil(S · (1 + r))`` alone fell short for about one
    baseline length in five).
    """
    from seq2seq.data.batching import MIX_BLOCK

    return math.ceil((baseline + 1) * (1 + ratio) / MIX_BLOCK) * MIX_BLOCK


def train_seconds(p: dict, steps: int, eval_every: int, test_lines: int) -> float:
    """Planned seconds of a training run of ``steps`` from its size's probe ``p``."""
    return (
        p["overhead_s"]
        + steps * p["step_s"]
        + steps // eval_every * p["eval_s"]
        + (test_lines * p["line_s"])
    )


def decode_seconds(p: dict, lines: int) -> float:
    """Planned seconds of decoding ``lines`` lines with a model of probe ``p``'s size."""
    return p["decode_overhead_s"] + lines * p["line_s"]


STAGES = {
    "probe_student": "probe: training the student size",
    "probe_student_decode": "probe: decoding with the student size",
    "probe_teacher": "probe: training the teacher size",
    "probe_teacher_decode": "probe: decoding with the teacher size",
    "baseline": "baseline (en→es)",
    "reverse": "reverse model (es→en)",
    "synthetic": "score the synthetic sources against the withheld English",
    "test": "test: paired comparison",
    "baseline_long": "baseline continued to the forward models' steps (en→es)",
    "test_long": "test: paired comparison against the continued baseline",
    "teacher": "teacher (the preset's width)",
    "distill": "teacher translates the training sources",
    "distilled": "score the teacher's targets against the original ones",
    "student_distilled": "student on the teacher's targets",
}


def stage_name(key: str) -> str:
    """What the plan, the log and the page call stage ``key``."""
    method = key.partition("_")[2]
    if key.startswith("translate_"):
        return f"back-translate ({METHODS[method].label})"
    if key.startswith("forward_"):
        return f"forward model ({METHODS[method].label})"
    return STAGES[key]


@dataclass
class Planned:
    """One stage of the plan: its steps (None: no training) and seconds, expected and at most
    (the early-stopped runs at their cap); ``done``: measured, not planned."""

    key: str
    steps: tuple[int, int] | None
    seconds: tuple[float, float]
    done: bool = False


def plan(
    kind: str,
    conditions: dict,
    record: dict,
    probes: dict,
    s: Sizes,
    expect: int,
    steps: tuple[int, int] | None = None,
) -> list[Planned]:
    """The stages of ``kind`` (``back-translation`` or ``distillation``) under ``conditions``
    with their planned steps and seconds; a stage finished in ``record`` (its ``stages`` and
    ``runs``) counts with its measured seconds, a finished baseline fixes the forward models'
    steps. The early-stopped runs are expected to stop at ``expect`` steps, at most at
    ``s.cap``. Distillation's teacher and student train the ``steps`` (expected, at most) of
    back-translation's continued baseline, or its ``conditions["steps"]`` once it ran."""
    c, test = conditions, conditions["test_lines"]
    stages, runs = record.get("stages", {}), record.get("runs", {})
    rows: list[Planned] = []

    def add(key: str, steps: tuple[int, int] | None, seconds: tuple[float, float]) -> None:
        if key in stages:
            done = runs.get(key, {}).get("steps")
            rows.append(
                Planned(key, (done, done) if done else None, (stages[key]["seconds"],) * 2, True)
            )
        else:
            rows.append(Planned(key, steps, seconds))

    def train(key: str, probe: str, steps: tuple[int, int]) -> None:
        p = probes[probe]
        add(
            key,
            steps,
            (
                train_seconds(p, steps[0], s.eval_every, test),
                train_seconds(p, steps[1], s.eval_every, test),
            ),
        )

    early = (expect, s.cap)
    evaluate = (EVALUATE_SECONDS, EVALUATE_SECONDS)
    if kind == "back-translation":
        student = probes["probe_student"]
        train("baseline", "probe_student", early)
        train("reverse", "probe_student", early)
        for m in c["methods"]:
            t = decode_seconds(student, c["mono_lines"])
            add(f"translate_{m}", None, (t, t))
        add("synthetic", None, evaluate)
        base = runs.get("baseline", {}).get("steps")
        steps = (base, base) if base else early
        forward = (forward_steps(steps[0], c["ratio"]), forward_steps(steps[1], c["ratio"]))
        for m in c["methods"]:
            train(f"forward_{m}", "probe_student", forward)
        add("test", None, evaluate)
        # the control for the forward models' total updates: the baseline's further steps
        more = (forward[0] - steps[0], forward[1] - steps[1])
        train("baseline_long", "probe_student", more)
        add("test_long", None, evaluate)
    else:
        teacher = probes["probe_teacher"]
        if "steps" in c:  # the student on the original targets' steps
            early = (c["steps"], c["steps"])
        elif steps is not None:
            early = steps
        train("teacher", "probe_teacher", early)
        t = decode_seconds(teacher, c["pairs"])
        add("distill", None, (t, t))
        add("distilled", None, evaluate)
        train("student_distilled", "probe_student", early)
        t = EVALUATE_SECONDS + decode_seconds(teacher, test)
        t += 2 * decode_seconds(probes["probe_student"], test)
        add("test", None, (t, t))
    return rows


def plan_text(rows: list[Planned], title: str) -> tuple[str, float, float]:
    """The plan as a table, and its total seconds (expected, at most)."""
    lines = [
        f"{title}:",
        f"  {'stage':<68} {'steps (expected / at most)':>27} {'minutes':>15}",
    ]
    for r in rows:
        steps = "" if r.steps is None else f"{r.steps[0]:,} / {r.steps[1]:,}"
        minutes = f"{r.seconds[0] / 60:.1f} / {r.seconds[1] / 60:.1f}"
        name = stage_name(r.key) + (" (done)" if r.done else "")
        lines.append(f"  {name:<68} {steps:>27} {minutes:>15}")
    total = (sum(r.seconds[0] for r in rows), sum(r.seconds[1] for r in rows))
    return "\n".join(lines), total[0], total[1]


def show_plan(record: Record, parts: list[tuple[str, list[Planned]]], probes: dict) -> None:
    """Print the plan of each part and the estimated total against the session; the first
    plan printed is kept in the record (``plan``) for the page."""
    speeds = ", ".join(
        f"{k.removeprefix('probe_')} {p['step_s']:.3f} s/step, {p['line_s'] * 1000:.0f} ms/line"
        for k, p in probes.items()
    )
    print(f"plan (from the probes: {speeds}; an untrained model decodes to the length limit):")
    expected = most = 0.0
    for title, rows in parts:
        text, e, m = plan_text(rows, title)
        print(text)
        expected, most = expected + e, most + m
    fits = "fits" if expected <= SESSION_MINUTES * 60 else "does NOT fit"
    print(
        f"estimated total {expected / 60:.0f} min (at most {most / 60:.0f} min): {fits} a "
        f"{SESSION_MINUTES}-minute session",
        flush=True,
    )
    if "plan" not in record.data:
        record.data["plan"] = {
            "parts": {t: [r.__dict__ for r in rows] for t, rows in parts},
            "expected_s": expected,
            "at_most_s": most,
        }
        record.save()


def estimate(record: Record, probes: dict, s: Sizes, key: str) -> float:
    """The expected seconds of stage ``key`` in the plan as it stands."""
    d = record.data
    rows = plan(d["kind"], d["conditions"], d, probes, s, d["expect_steps"])
    return next(r.seconds[0] for r in rows if r.key == key)


def back_translation(args: argparse.Namespace, record: Record, s: Sizes) -> None:
    """The back-translation stages (see the module docstring), each skipped when done."""
    out, c = Path(args.out), record.data["conditions"]
    data = _path(c["data"])
    write_data(data, c["pairs"], c["mono_lines"], c["test_lines_asked"], c["dev_lines_asked"])
    probes = {
        "probe_student": probe(record, "probe_student", s.student, data, out, s),
        "probe_teacher": probe(record, "probe_teacher", [*s.student, *s.teacher], data, out, s),
    }
    nothing: dict = {}
    rows = plan(args.recipe, c, record.data, probes, s, args.expect_steps)
    # distillation trains the continued baseline's steps: the forward models'
    forward = next(r.steps for r in rows if r.key.startswith("forward_"))
    next_rows = plan("distillation", c, nothing, probes, s, args.expect_steps, forward)
    show_plan(
        record, [("back-translation", rows), ("distillation (the next command)", next_rows)], probes
    )
    if args.plan:
        return

    def train(key: str, extra: list[str]) -> dict:
        workdir = out / key
        command = _train(workdir, data, extra)
        return record.train(key, workdir, command, estimate(record, probes, s, key))

    early = [f"train.steps={s.cap}", *s.student, *args.set]
    baseline = train("baseline", [_real_pairs(data), *early])
    pin = f"tokenizer.model_file={_rel(out / 'baseline' / 'spm.model')}"
    train("reverse", ["data.src_lang=es", "data.tgt_lang=en", _real_pairs(data), pin, *early])
    mono = _lines(data / "mono.es")
    synthetic = record.data.setdefault("synthetic", {})
    for m in c["methods"]:
        key, target = f"translate_{m}", data / f"synthetic_{m}.en"
        record.run(
            key,
            [
                "translate",
                "--workdir",
                _rel(out / "reverse"),
                "--input",
                _rel(data / "mono.es"),
                "--output-dir",
                _rel(out / f"bulk_{m}"),
                "--output",
                _rel(target),
                *METHODS[m].options,
            ],
            out / f"{key}.log",
            outputs=[target],
            estimate=estimate(record, probes, s, key),
        )
        _copy(data / "mono.es", data / f"synthetic_{m}.es")
        synthetic[m] = synthetic_measures(_lines(target), mono)
    hyps = [a for m in c["methods"] for a in ("--hyp", _rel(data / f"synthetic_{m}.en"))]
    report = record.evaluate(
        "synthetic",
        ["evaluate", "--ref", _rel(data / "mono_withheld.en"), *hyps],
        out / "synthetic.json",
        EVALUATE_SECONDS,
    )
    for m, system in zip(c["methods"], report["systems"]):
        synthetic[m].update(bleu=system["BLEU"]["score"], chrf=system["chrF"]["score"])
    real = synthetic_measures(_lines(data / "small.en"), _lines(data / "small.es"))
    synthetic["real pairs"] = real
    steps = forward_steps(baseline["steps"], c["ratio"])
    for m in c["methods"]:
        run = train(
            f"forward_{m}",
            [
                f"data.train.0.path={_rel(data / 'small')}",
                "data.train.0.weight=1",
                f"data.train.1.path={_rel(data / f'synthetic_{m}')}",
                f"data.train.1.weight={c['ratio']:g}",
                pin,
                *s.student,
                *args.set,
                f"train.steps={steps}",
                "train.patience=0",  # the whole budget: equal real-data exposure
            ],
        )
        if run["real_updates"] < baseline["steps"]:
            raise SystemExit(
                f"forward_{m}: {run['real_updates']} updates on real pairs, fewer than the "
                f"baseline's {baseline['steps']}: not the equal real-data exposure it needs"
            )
    record.data["arms"] = [f"forward_{m}" for m in c["methods"]]
    hyps = [
        a for r in ("baseline", *record.data["arms"]) for a in ("--hyp", _rel(out / r / "test.hyp"))
    ]
    report = record.evaluate(
        "test",
        ["evaluate", "--ref", _rel(data / "test.es"), *hyps],
        out / "test.json",
        EVALUATE_SECONDS,
    )
    labels = ["baseline (real pairs only)"]
    labels += [f"+ back-translation, {METHODS[m].label}" for m in c["methods"]]
    record.data["test"] = {
        "labels": labels,
        "report": report,
        "table": record.data["stages"]["test"]["output"],
    }
    record.save()

    # The control for the forward models' 1 + r times more updates: the baseline continued on
    # the real pairs to their step count, without early stopping. It resumes from a copy of the
    # baseline's run (its last checkpoint, the data position and the best dev score with it);
    # the rate falls as the inverse square root of the step whatever train.steps is, so this is
    # the run a baseline of that many steps would have made (exact resume, tests/test_resume.py).
    long = out / "baseline_long"
    if not long.exists():
        partial = long.with_name(f"{long.name}.copying")
        shutil.rmtree(partial, ignore_errors=True)
        skip = shutil.ignore_patterns("test.json", "test.hyp", "summary.md")
        shutil.copytree(out / "baseline", partial, ignore=skip)
        os.replace(partial, long)
    run = train(
        "baseline_long",
        [_real_pairs(data), *s.student, *args.set, f"train.steps={steps}", "train.patience=0"],
    )
    if run["steps"] != steps:
        raise SystemExit(f"baseline_long: {run['steps']} steps, not the forward models' {steps}")
    hyps = [
        a
        for r in ("baseline_long", *record.data["arms"])
        for a in ("--hyp", _rel(out / r / "test.hyp"))
    ]
    report = record.evaluate(
        "test_long",
        ["evaluate", "--ref", _rel(data / "test.es"), *hyps],
        out / "test_long.json",
        EVALUATE_SECONDS,
    )
    record.data["test_long"] = {
        "labels": [f"baseline continued to {steps:,} steps (real pairs only)", *labels[1:]],
        "report": report,
        "table": record.data["stages"]["test_long"]["output"],
    }
    record.save()


def distillation(args: argparse.Namespace, record: Record, s: Sizes, bt: dict) -> None:
    """The distillation stages (see the module docstring) on the data, tokenizer, probes and
    baseline of the back-translation record ``bt``, each skipped when done."""
    out, c = Path(args.out), record.data["conditions"]
    original = bt["runs"][c["student_original"]]
    data, baseline = _path(bt["conditions"]["data"]), _path(original["workdir"])
    probes = bt["probes"]
    show_plan(
        record,
        [("distillation", plan(args.recipe, c, record.data, probes, s, args.expect_steps))],
        probes,
    )
    if args.plan:
        return

    def train(key: str, extra: list[str]) -> dict:
        workdir = out / key
        command = _train(workdir, data, extra)
        return record.train(key, workdir, command, estimate(record, probes, s, key))

    pin = f"tokenizer.model_file={_rel(_path(bt['runs']['baseline']['workdir']) / 'spm.model')}"
    # the student on the original targets' budget: its steps, no early stopping, the best
    # checkpoint by dev BLEU tested (back-translation's baseline stopped early before its plateau)
    budget = [pin, f"train.steps={c['steps']}", "train.patience=0", *s.student]
    train("teacher", [_real_pairs(data), *budget, *s.teacher, *args.set])
    teacher, distilled = out / "teacher", out / "data" / "distilled"
    targets = Path(f"{distilled}.es")
    targets.parent.mkdir(parents=True, exist_ok=True)
    record.run(
        "distill",
        [
            "translate",
            "--workdir",
            _rel(teacher),
            "--input",
            _rel(data / "small.en"),
            "--output-dir",
            _rel(out / "bulk"),
            "--output",
            _rel(targets),
            *s.teacher_search,
        ],
        out / "distill.log",
        outputs=[targets],
        estimate=estimate(record, probes, s, "distill"),
    )
    _copy(data / "small.en", Path(f"{distilled}.en"))
    report = record.evaluate(
        "distilled",
        ["evaluate", "--ref", _rel(data / "small.es"), "--hyp", _rel(targets)],
        out / "distilled.json",
        EVALUATE_SECONDS,
    )
    record.data["distilled"] = {
        **synthetic_measures(_lines(targets), _lines(data / "small.es")),
        "bleu": report["BLEU"]["score"],
        "chrf": report["chrF"]["score"],
    }
    path = json.dumps(_rel(distilled))
    train("student_distilled", [f"data.train=[{{path: {path}}}]", *budget, *args.set])
    record.data["runs"]["student_original"] = original
    student = out / "student_distilled"
    models = [a for w in (baseline, student, teacher) for a in ("--workdir", _rel(w))]
    report = record.evaluate(
        "test",
        ["evaluate", "--ref", _rel(data / "test.es"), *models, "--src", _rel(data / "test.en")]
        + ["--compare"],
        out / "test.json",
        estimate(record, probes, s, "test"),
    )
    record.data["test"] = {
        "labels": ["student, original targets", "student, distilled targets", "teacher"],
        "report": report,
        "table": record.data["stages"]["test"]["output"],
    }
    record.save()


# --- the page, from the record alone ------------------------------------------------------------

SPEED = re.compile(r"^(.+?): (\d+) sentences in [\d.]+ s \(([\d.]+) sentences/s\)", re.M)


def summary(test: dict) -> list[str]:
    """Markdown bullets from ``seq2seq-evaluate --json``: each system's BLEU and chrF against the
    first (the difference and the approximate-randomization p-value) and, where the systems were
    decoded (``--compare``), their sentences/s as a multiple of the last system's."""
    report, labels = test["report"], test["labels"]
    lines = ["Read from the table:", ""]
    first = report["systems"][0]
    for label, system in zip(labels, report["systems"]):
        parts = []
        for metric in ("BLEU", "chrF"):
            score = system[metric]["score"]
            if system is first:
                parts.append(f"{metric} {score:.2f}")
            else:
                delta, p = score - first[metric]["score"], system[metric]["p_ar"]
                parts.append(f"{metric} {score:.2f} ({delta:+.2f}, p = {p:.4f})")
        lines.append(f"- {label}: " + ", ".join(parts))
    speeds = [float(m.group(3)) for m in SPEED.finditer(test["table"])]
    if len(speeds) == len(labels) > 1:
        lines.append(
            "- decoding the test split (beam search, the model loaded), sentences/s: "
            + ", ".join(
                f"{label} {v:.1f} ({v / speeds[-1]:.2f}× {labels[-1]})"
                for label, v in zip(labels, speeds)
            )
        )
    return [*lines, ""]


def plot_curves(runs: list[tuple[str, dict]], path: Path, real_axis: bool) -> None:
    """Dev BLEU by step, one line per run (its best checkpoint starred); with ``real_axis`` a
    second panel against the updates on real pairs (step × the real share)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11 if real_axis else 6.5, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2 if real_axis else 1, sharey=True, squeeze=False)[0]
    for label, run in runs:
        points = run["dev_bleu"]
        steps, bleu = [p[0] for p in points], [p[1] for p in points]
        share = 1.0 - run["synthetic_share"]
        for ax, scale in zip(axes, (1.0, share)):
            (line,) = ax.plot([x * scale for x in steps], bleu, marker=".", label=label)
            if run["best_step"] in steps:
                i = steps.index(run["best_step"])
                ax.plot(steps[i] * scale, bleu[i], "*", ms=12, color=line.get_color())
    axes[0].set_xlabel("step")
    axes[0].set_ylabel("dev BLEU (greedy, the best checkpoint starred)")
    axes[0].legend(fontsize=8)
    if real_axis:
        axes[1].set_xlabel("updates on real pairs (step × the real pairs' share of the batches)")
    for ax in axes:
        ax.grid(alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)


def _stopped(run: dict, early: bool) -> str:
    """How a run ended: at its dev plateau, at the cap, or (``early`` false) its fixed steps."""
    if not early:
        best = run["best_step"]
        where = "its last evaluation: still improving" if best == run["steps"] else f"step {best:,}"
        return f"its fixed steps (best dev BLEU at {where})"
    if run["status"] == "early_stopping":
        return "its dev plateau (early stopping)"
    return f"**the cap ({run['status']}), not its plateau**"


def _runs_table(rows: list[tuple[str, dict, bool]], exposure: bool) -> list[str]:
    """A table of runs (label, ``run_info``, early-stopped); with ``exposure`` the updates on
    real pairs and the synthetic share of the batches."""
    mixed = "updates on real pairs | synthetic batches | " if exposure else ""
    lines = [
        f"| model | parameters | trained to | steps | {mixed}best dev BLEU (step) "
        "| test BLEU / chrF (that checkpoint) | tokenizer sha256 |",
        "|---|--:|---|--:|" + ("--:|--:|" if exposure else "") + "--:|--:|---|",
    ]
    for label, r, early in rows:
        best = "–" if r["best_dev_bleu"] is None else f"{r['best_dev_bleu']:.2f}"
        shares = f"{r['real_updates']:,} | {r['synthetic_share']:.1%} | " if exposure else ""
        lines.append(
            f"| {label} | {r['parameters']:,} | {_stopped(r, early)} | {r['steps']:,} | "
            f"{shares}{best} ({r['best_step']:,}) | {r['test_bleu']:.2f} / "
            f"{r['test_chrf']:.2f} | `{r['spm_sha256'][:12]}` |"
        )
    return [*lines, ""]


def _header(record: dict, title: str, doc: Path, record_path: Path) -> list[str]:
    """Title, provenance (command, record, machine) and the time planned and measured."""
    m = record["machine"]
    link = os.path.relpath(record_path, doc.parent)
    plan = record.get("plan", {})
    measured = sum(s["seconds"] for s in record["stages"].values())
    return [
        f"# {title}",
        "",
        f"Generated by `{record['command']}` "
        "([`benchmarks/workflows.py`](../benchmarks/workflows.py)) "
        f"from its record [`{_rel(record_path)}`]({link}), started {record['started']}; "
        f"{m['cpu']}, {m['cores']} cores, jax {m['jax']} ({m['backend']}). The stages ran "
        f"{measured / 60:.0f} min in all; the plan printed before them said "
        f"{plan.get('expected_s', 0) / 60:.0f} min (at most {plan.get('at_most_s', 0) / 60:.0f}) "
        f"for {' and '.join(plan.get('parts', {}))}. The same command again regenerates this "
        "page from the record (every finished stage is kept); an interrupted run continues "
        "where it stopped.",
        "",
    ]


def _value(conditions: dict, key: str) -> Any:
    """A setting of the runs (``section.key``): the last override among the conditions' size
    and ``--set``, else configs/back_translation.yaml's."""
    section, name = key.split(".")
    overrides = [*conditions["size"], *conditions["set"]]
    return _setting(overrides, key, SETTINGS[section][name])


def _training_conditions(record: dict, run: dict, runs: list[dict]) -> list[str]:
    """The bullets on the model size, the tokenizer and the stopping rule."""
    c = record["conditions"]
    v = lambda key: _value(c, key)  # noqa: E731
    size = f" with {', '.join(f'`{o}`' for o in c['size'])}" if c["size"] else ""
    hashes = {r["spm_sha256"] for r in runs}
    evals = f"dev BLEU (greedy, all {c['dev_lines']:,} dev pairs) every {c['eval_every']} steps"
    if "steps" in c:  # distillation: every model the same steps
        stopping = f"- trained {c['steps']:,} steps (no early stopping): {evals}"
    else:
        stopping = (
            f"- trained to the dev plateau: {evals}, stopped after {v('train.patience')} "
            f"evaluations without a better one (at most {c['cap']:,} steps)"
        )
    stopping += ", the best checkpoint tested"
    return [
        f"- models: [`configs/back_translation.yaml`](../configs/back_translation.yaml){size}: "
        f"d_model {v('model.d_model')}, {v('model.num_heads')} heads, "
        f"{v('model.num_encoder_layers')}+{v('model.num_decoder_layers')} layers, d_ff "
        f"{v('model.d_ff')}, dropout {v('model.dropout_rate')}; {run['parameters']:,} "
        f"parameters, batches of {v('data.max_tokens')} tokens. Smaller than the preset "
        "(d_model 256, d_ff 1024: 7.6M parameters with its 8,000 pieces), so that each "
        f"experiment was planned to fit a {SESSION_MINUTES}-minute session on a 2-core CPU "
        "(the plan came from a probe of each size, its step time measured; the header gives "
        "the time measured).",
        f"- tokenizer: the baseline's SentencePiece model ({v('tokenizer.model_type')}, "
        f"{v('tokenizer.vocab_size')} pieces, trained on both sides of the real pairs with "
        "`<BT>` a user-defined symbol) is the `tokenizer.model_file` of every other run: "
        f"{len(hashes)} distinct model file(s) among the {len(runs)} runs (sha256 in the table).",
        f"{stopping}; the learning rate {v('train.learning_rate')} after "
        f"{v('train.warmup_steps')} warmup steps, then falling as the inverse square root of the "
        "step (the same rate at a given step in every run, however long it trains).",
    ]


def _stages(record: dict) -> list[str]:
    """The stages' table (planned and measured time, peak memory) and their commands."""
    stages = list(record["stages"].values())
    lines = [
        "## Stages",
        "",
        "| stage | planned | wall time | peak RSS |",
        "|---|--:|--:|--:|",
    ]
    for s in stages:
        lines.append(
            f"| {s['name']} | {s['estimate_s'] / 60:.1f} min | {s['seconds'] / 60:.1f} min | "
            f"{s['peak_rss_mib']:,.0f} MiB |"
        )
    lines += [
        "",
        "The commands, in order. They read files that the script writes under the runs' "
        "`data/` folders (the splits, the monolingual text, copies of the sources), so run the "
        "script once before rerunning a single stage:",
        "",
        "```bash",
        *[shlex.join(["python", "-m", "seq2seq", *s["command"]]) for s in stages],
        "```",
        "",
    ]
    return lines


def _scores(record: dict, key: str = "test", title: str = "Test scores") -> list[str]:
    """A section with the paired test ``record[key]``: sacreBLEU's table and its reading."""
    return [
        f"## {title}",
        "",
        "Paired tests against the first row (sacreBLEU; `seq2seq-evaluate --hyp ... --hyp ...` "
        "or `--compare`); 95% confidence intervals from bootstrap resampling.",
        "",
        "```",
        record[key]["table"].rstrip(),
        "```",
        "",
        *summary(record[key]),
    ]


def _arm_label(arm: str) -> str:
    """``forward, <the method's label>`` for run ``forward_<method>``."""
    return f"forward, {METHODS[arm.removeprefix('forward_')].label}"


def _after_best(run: dict) -> int:
    """Dev evaluations after a run's best one, none of them better."""
    steps = [step for step, _ in run["dev_bleu"]]
    return len(steps) - 1 - steps.index(run["best_step"])


def _bt_result(record: dict) -> list[str]:
    """The page's reading of its two paired tests: what more updates alone gave the baseline,
    and what back-translation gave over the baseline with the forward models' updates."""
    runs, test = record["runs"], record["test"]
    long = runs.get("baseline_long")
    if long is None or "test_long" not in record:
        return []
    base, arms = runs["baseline"], record["arms"]
    steps = runs[arms[0]]["steps"]
    systems = record["test_long"]["report"]["systems"]
    gains = [
        f"{METHODS[a.removeprefix('forward_')].label} {s['BLEU']['score']:.2f} "
        f"({s['BLEU']['score'] - systems[0]['BLEU']['score']:+.2f} BLEU, p = "
        f"{s['BLEU']['p_ar']:.4f}; chrF {s['chrF']['score'] - systems[0]['chrF']['score']:+.2f}, "
        f"p = {s['chrF']['p_ar']:.4f})"
        for a, s in zip(arms, systems[1:])
    ]
    first = test["report"]["systems"][0]["BLEU"]["score"]
    return [
        "## Result",
        "",
        f"- more updates alone: the baseline, stopped at step {base['steps']:,} "
        f"({'early stopping' if base['status'] == 'early_stopping' else 'its cap'}; best dev "
        f"BLEU {base['best_dev_bleu']:.2f} at {base['best_step']:,}, {_after_best(base)} "
        f"evaluations after it none better), scores {first:.2f} test BLEU; continued on the "
        f"real pairs to the forward models' {steps:,} steps it scores {long['test_bleu']:.2f} "
        f"({long['test_bleu'] - first:+.2f}), its best dev BLEU {long['best_dev_bleu']:.2f} at "
        f"step {long['best_step']:,}, {_after_best(long)} evaluations after it none better. "
        f"The baseline's stopping rule (patience {_value(record['conditions'], 'train.patience')}"
        ") had not found its plateau, so the first table below overstates what "
        "back-translation adds; the second is the comparison at equal updates.",
        "- back-translation against that baseline (the same updates, the same tokenizer, the "
        "same model): " + "; ".join(gains) + ".",
        "",
    ]


def bt_page(record: dict, doc: Path, record_path: Path, curves: Path) -> str:
    """The back-translation page, from its record."""
    c, runs, syn = record["conditions"], record["runs"], record["synthetic"]
    base, rev = runs["baseline"], runs["reverse"]
    arms = record["arms"]
    steps = runs[arms[0]]["steps"]
    lines = _header(record, "Back-translation on the shipped corpus", doc, record_path)
    lines += _bt_result(record)
    lines += [
        "## Conditions",
        "",
        f"- data: the first {c['pairs']:,} pairs of the shipped training split (the real pairs); "
        f"monolingual: the Spanish side of the next {c['mono_lines']:,} lines (their English "
        "side is read only to score the synthetic sources below); test: "
        f"{c['test_lines']:,} pairs of the shipped test split, used for no choice (every "
        "choice, early stopping and the checkpoint tested, is made on "
        f"{c['dev_lines']:,} pairs of the shipped dev split).",
        *_training_conditions(record, base, list(runs.values())),
        f"- synthetic:real batch ratio {c['ratio']:g}:1 (`data.train` weights 1 and "
        f"{c['ratio']:g}, the synthetic sources tagged `<BT>`): each forward model trains "
        f"{steps:,} steps, without early stopping (the best checkpoint by dev BLEU tested, as "
        f"for the others): at least S × (1 + {c['ratio']:g}) for the baseline's S = "
        f"{base['steps']:,}, rounded up to a multiple of 100 batches, where the corpora's shares "
        "are exact to within one batch, so that it makes at least as many updates on real pairs "
        "as the baseline (measured below).",
        "- the synthetic sources, one forward model each: "
        + "; ".join(f"{METHODS[m].label} (`{' '.join(METHODS[m].options)}`)" for m in c["methods"])
        + ", from the reverse model's best checkpoint.",
        "",
        *_scores(record),
    ]
    long = runs.get("baseline_long")
    if long and "test_long" in record:
        lines += [
            *_scores(record, "test_long", "Against the baseline at equal total updates"),
            f"The forward models make {c['ratio'] + 1:g} times the baseline's updates. The "
            f"baseline continued on the real pairs alone to their {steps:,} steps, without "
            "early stopping (it resumed from its own last checkpoint; at a given step the rate "
            "is the same whatever the run's length), is the control for that: the gain above "
            "over the early-stopped baseline is the technique's only where it holds here too.",
            "",
        ]
    rows = [("baseline (en→es)", base, True), ("reverse model (es→en)", rev, True)]
    rows += [(_arm_label(a), runs[a], False) for a in arms]
    if long:
        rows.append(("baseline, continued (en→es)", long, False))
    lines += [
        "## What the runs measured",
        "",
        *_runs_table(rows, exposure=True),
        f"- the reverse model (es→en): best dev BLEU {rev['best_dev_bleu']:.2f} (greedy, step "
        f"{rev['best_step']:,}), test BLEU {rev['test_bleu']:.2f}, chrF {rev['test_chrf']:.2f} "
        "(beam search): the quality of the synthetic sources is bounded by it.",
        "",
        "The synthetic sources against the withheld English of the monolingual lines (the real "
        f"pairs' English has {syn['real pairs']['length_ratio']:.2f} words per Spanish word):",
        "",
        "| method | identical to the Spanish line | words, synthetic / Spanish | empty lines "
        "| BLEU / chrF against the withheld English |",
        "|---|--:|--:|--:|--:|",
    ]
    for m in c["methods"]:
        x = syn[m]
        lines.append(
            f"| {METHODS[m].label} | {x['copy_rate']:.1%} | {x['length_ratio']:.2f} | "
            f"{x['empty_rate']:.1%} | {x['bleu']:.2f} / {x['chrf']:.2f} |"
        )
    lines += [
        "",
        "## Dev curves",
        "",
        f"![dev BLEU of every run by step and by updates on real pairs]"
        f"({os.path.relpath(curves, doc.parent)})",
        "",
        *_stages(record),
    ]
    return "\n".join(lines)


def _curve_gaps(record: dict) -> list[str]:
    """A bullet: the distilled student's mean dev BLEU lead over the student on the original
    targets in the first fifth, the next three and the last fifth of the steps (evaluations at
    the same steps), and each run's last fifth over the fifth before (about 0 on a plateau);
    empty when the record has no curves."""
    runs = record["runs"]
    a = dict(map(tuple, runs["student_original"].get("dev_bleu", [])))
    b = dict(map(tuple, runs["student_distilled"].get("dev_bleu", [])))
    steps = sorted(set(a) & set(b))
    if not steps:
        return []
    end = record["conditions"]["steps"]
    parts = []
    for lo, hi in ((0, end // 5), (end // 5, 4 * end // 5), (4 * end // 5, end)):
        gaps = [b[k] - a[k] for k in steps if lo < k <= hi]
        if gaps:
            parts.append(f"{sum(gaps) / len(gaps):+.2f} over steps {lo + 1:,}–{hi:,}")
    late = []
    for key, label in (
        ("teacher", "teacher"),
        ("student_original", "student, original targets"),
        ("student_distilled", "student, distilled targets"),
    ):
        c = dict(map(tuple, runs[key].get("dev_bleu", [])))
        last = [c[k] for k in c if 4 * end // 5 < k <= end]
        before = [c[k] for k in c if 3 * end // 5 < k <= 4 * end // 5]
        if last and before:
            late.append(f"{label} {sum(last) / len(last) - sum(before) / len(before):+.2f}")
    still = (
        " How far each curve still rose: mean dev BLEU of the last fifth of the steps over the "
        f"fifth before (about 0 on a plateau), {', '.join(late)}."
        if late
        else ""
    )
    return [
        "- the dev curves (below): the distilled student's mean dev BLEU lead over the other, "
        + ", ".join(parts)
        + ". A comparison early in training sees the first figure, not the last."
        + still,
    ]


def _distill_result(record: dict) -> list[str]:
    """The page's reading of its paired test: what the teacher's targets gave the student, as a
    share of the teacher's lead, and how far those targets are from the original ones."""
    c, d = record["conditions"], record["distilled"]
    systems = record["test"]["report"]["systems"]
    original, distilled, teacher = (s["BLEU"]["score"] for s in systems)
    lead, gain, p = teacher - original, distilled - original, systems[1]["BLEU"]["p_ar"]
    chrf = [s["chrF"]["score"] for s in systems[:2]]
    chrf_text = (
        f"; chrF {chrf[1]:.2f} against {chrf[0]:.2f} ({chrf[1] - chrf[0]:+.2f}, p = "
        f"{systems[1]['chrF']['p_ar']:.4f})"
    )
    share = f", {gain / lead:.0%} of the teacher's lead of {lead:.2f}" if lead > 0 else ""
    reading = (
        " Sequence-level distillation (Kim and Rush 2016) replaces each target with the "
        "teacher's beam output; a teacher that reproduces most of its own training targets, "
        "as this one does after that many passes over them, leaves the student mostly the "
        "original targets."
        if d["copy_rate"] >= 0.5
        else ""
    )
    return [
        "## Result",
        "",
        f"- the student on the teacher's targets scores {distilled:.2f} test BLEU against "
        f"{original:.2f} on the original ones ({gain:+.2f}{share}; paired approximate "
        f"randomization, p = {p:.4f}){chrf_text}; the teacher scores {teacher:.2f} BLEU.",
        *_curve_gaps(record),
        f"- what the student saw: the teacher's translations of its own {c['pairs']:,} training "
        f"sources (on which it trained {c['steps']:,} steps) score BLEU {d['bleu']:.2f} against "
        f"the original targets; {1 - d['copy_rate']:.1%} of them differ from the original."
        + reading,
        "",
    ]


def distillation_page(record: dict, doc: Path, record_path: Path, curves: Path) -> str:
    """The distillation page, from its record."""
    c, runs, d = record["conditions"], record["runs"], record["distilled"]
    student = runs["student_original"]
    lines = _header(record, "Sequence-level distillation on the shipped corpus", doc, record_path)
    lines += _distill_result(record)
    lines += [
        "## Conditions",
        "",
        f"- data: the back-translation experiment's {c['pairs']:,} real pairs and its test "
        f"split ({c['test_lines']:,} pairs; its record: `{c['bt_record']}`).",
        *_training_conditions(record, student, list(runs.values())),
        f"- the teacher: the same file with {', '.join(f'`{o}`' for o in c['teacher'])} (the "
        f"preset's width; {runs['teacher']['parameters']:,} parameters).",
        f"- every model here trains {c['steps']:,} steps without early stopping, the best "
        "checkpoint by dev BLEU tested (the runs table gives each one's best step). The "
        "student on the original targets is a run of the back-translation experiment "
        f"(`{student['workdir']}`: the same size, data and tokenizer), not trained again; the "
        "student on the teacher's targets trains with the same settings on the teacher's "
        "beam-search translations of the training sources.",
        f"- the teacher's targets against the original ones: BLEU {d['bleu']:.2f}, chrF "
        f"{d['chrf']:.2f}; {d['length_ratio']:.2f} words per original word, "
        f"{d['copy_rate']:.1%} identical.",
        "",
        *_scores(record),
        "## What the runs measured",
        "",
        *_runs_table(
            [
                ("student, original targets", student, False),
                ("student, distilled targets", runs["student_distilled"], False),
                ("teacher", runs["teacher"], False),
            ],
            exposure=False,
        ),
        "## Dev curves",
        "",
        f"![dev BLEU of every run by step]({os.path.relpath(curves, doc.parent)})",
        "",
        *_stages(record),
    ]
    return "\n".join(lines)


TITLES = {"back-translation": "back_translation", "distillation": "distillation"}


def _bt_record(args: argparse.Namespace, local: bool) -> dict:
    """The back-translation record the distillation builds on (its data, tokenizer, probes and
    baseline).

    Raises:
      SystemExit: no record, or its baseline has not finished.
    """
    path = Path(args.bt_out) / "back_translation.json"
    if not local and args.bt_out == "runs/back_translation":
        path = ROOT / "docs" / "data" / "back_translation.json"
    if not path.is_file():
        raise SystemExit(f"{path}: no back-translation record; run back-translation first")
    bt = json.loads(path.read_text(encoding="utf-8"))
    if "baseline" not in bt.get("runs", {}):
        raise SystemExit(f"{path}: the back-translation baseline has not finished yet")
    return {**bt, "path": _rel(path)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe", choices=sorted(TITLES))
    parser.add_argument("--pairs", type=int, default=20_000, help="real pairs (20,000)")
    parser.add_argument("--mono-lines", type=int, default=40_000, help="monolingual lines (40,000)")
    parser.add_argument("--dev-lines", type=int, help="dev pairs (default: all 1,416)")
    parser.add_argument("--test-lines", type=int, help="test pairs (default: all 2,780)")
    parser.add_argument(
        "--ratio", type=float, default=1.0, help="r, synthetic batches per real batch (1)"
    )
    parser.add_argument(
        "--methods",
        help="ways of producing the synthetic sources, two or more of: "
        f"{', '.join(METHODS)} (default topk10,beam; --smoke: {SMOKE_METHODS})",
    )
    parser.add_argument(
        "--expect-steps",
        type=int,
        default=2000,
        help="the plan's guess of the step where early stopping ends a run (2,000)",
    )
    parser.add_argument("--probe-steps", type=int, default=40, help="steps of each probe (40)")
    parser.add_argument("--plan", action="store_true", help="run the probes, print the plan, stop")
    parser.add_argument(
        "--bt-out", default="runs/back_translation", help="back-translation's --out"
    )
    parser.add_argument("--out", help="runs, data and logs (default runs/<recipe with _>)")
    parser.add_argument("--doc", help="the page (default docs/<recipe with _>.md)")
    parser.add_argument("--record", help="the JSON record (default docs/data/<recipe with _>.json)")
    parser.add_argument("--set", action="append", default=[], help="key=value for every training")
    parser.add_argument("--smoke", action="store_true", help="tiny models, data and steps")
    args = parser.parse_args(argv)
    given = argv if argv is not None else sys.argv[1:]
    # the command that runs the stages and regenerates the page (``--plan`` alone runs none)
    command = shlex.join(
        ["python", "-m", "benchmarks.workflows", *[a for a in given if a != "--plan"]]
    )
    args.methods = args.methods or (SMOKE_METHODS if args.smoke else "topk10,beam")
    methods = [m for m in args.methods.split(",") if m]
    if len(set(methods)) < 2 or len(set(methods)) < len(methods) or set(methods) - set(METHODS):
        parser.error(f"--methods {args.methods}: two or more distinct of {', '.join(METHODS)}")
    stem = TITLES[args.recipe]
    local = args.out is not None or args.smoke  # else the shipped page and record
    if args.smoke:
        args.pairs, args.mono_lines, args.expect_steps = 400, 200, 8
        args.dev_lines, args.test_lines = 100, 40
        eval_every = int(_setting(SMOKE, "train.eval_every", 0))
        sizes = Sizes(SMOKE, SMOKE_TEACHER, 12, eval_every, 8, 10, SMOKE_TEACHER_SEARCH)
        if args.bt_out == "runs/back_translation":
            args.bt_out = "runs/smoke_back_translation"
    else:
        train = SETTINGS["train"]
        sizes = Sizes([], TEACHER, train["steps"], train["eval_every"], args.probe_steps, 200, [])
    sizes.eval_every = int(_setting(args.set, "train.eval_every", sizes.eval_every))
    sizes.cap = int(_setting(args.set, "train.steps", sizes.cap))
    out = Path(args.out or f"runs/{'smoke_' if args.smoke else ''}{stem}")
    args.out = str(out)
    doc = Path(args.doc or (out / f"{stem}.md" if local else f"docs/{stem}.md"))
    record_path = Path(args.record or (out / f"{stem}.json" if local else f"docs/data/{stem}.json"))
    import jax

    head: dict[str, Any] = {
        "kind": args.recipe,
        "command": command,
        "started": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": {
            "cpu": cpu_name(),
            "cores": os.cpu_count(),
            "jax": jax.__version__,
            "backend": jax.default_backend(),
        },
        "expect_steps": args.expect_steps,
    }
    conditions: dict[str, Any] = {
        "config": _rel(CONFIG),
        "size": sizes.student,
        "teacher": sizes.teacher,
        "cap": sizes.cap,
        "eval_every": sizes.eval_every,
        "set": args.set,
    }
    if args.recipe == "back-translation":
        conditions.update(
            data=_rel(out / "data"),
            pairs=args.pairs,
            mono_lines=args.mono_lines,
            test_lines=len(_lines(SHIPPED / "test.en.gz")[: args.test_lines]),
            test_lines_asked=args.test_lines,
            dev_lines=len(_lines(SHIPPED / "dev.en.gz")[: args.dev_lines]),
            dev_lines_asked=args.dev_lines,
            ratio=args.ratio,
            methods=methods,
        )
        record = Record(record_path, {**head, "conditions": conditions})
        back_translation(args, record, sizes)
        page, real_axis = bt_page, True
        runs = [("baseline", "baseline"), ("reverse", "reverse model (es→en)")]
        runs += [(arm, _arm_label(arm)) for arm in record.data.get("arms", [])]
        if "baseline_long" in record.data["runs"]:
            runs.append(("baseline_long", "baseline, continued from its last checkpoint"))
    else:
        bt = _bt_record(args, local)
        # the student on the original targets: back-translation's baseline at the forward
        # models' updates where that stage ran (the early-stopped one had not reached its
        # plateau), else its baseline; the teacher and the distilled student get its steps
        original = "baseline_long" if "baseline_long" in bt["runs"] else "baseline"
        conditions.update(
            student_original=original,
            steps=bt["runs"][original]["steps"],
            bt_out=_rel(Path(args.bt_out)),
            bt_record=bt["path"],
            pairs=bt["conditions"]["pairs"],
            test_lines=bt["conditions"]["test_lines"],
            dev_lines=bt["conditions"]["dev_lines"],
        )
        record = Record(record_path, {**head, "conditions": conditions})
        distillation(args, record, sizes, bt)
        page, real_axis = distillation_page, False
        runs = [
            ("student_original", "student, original targets"),
            ("student_distilled", "student, distilled targets"),
            ("teacher", "teacher"),
        ]
    if args.plan:
        return 0
    curves = doc.with_name(f"{stem}_curves.png")
    plotted = {k: record.data["runs"][k] for k, _ in runs}
    if args.recipe == "back-translation" and "baseline_long" in plotted:
        # the continuation alone: its first points are the baseline's, which it would hide
        start = plotted["baseline"]["steps"]
        long = plotted["baseline_long"]
        points = [p for p in long["dev_bleu"] if p[0] >= start]
        plotted["baseline_long"] = {**long, "dev_bleu": points}
    plot_curves([(label, plotted[k]) for k, label in runs], curves, real_axis)
    text = page(record.data, doc, record_path, curves)
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
