"""Back-translation and sequence-level distillation on the shipped corpus, stage by stage, timed.

Every stage is a real command (``python -m seq2seq train | translate | evaluate``) in its own
process; the page written to ``--doc`` lists each command, its wall time and peak memory, and
the test scores with 95% confidence intervals and paired significance (``seq2seq-evaluate
--hyp ... --hyp ...``: sacreBLEU's paired bootstrap and approximate randomization).

``back-translation`` (Sennrich et al. 2016; tagged, Caswell et al. 2019):

1. the parallel data: the first ``--pairs`` (20,000) pairs of the shipped training split (the
   ``small/`` split); the monolingual data: the Spanish side of the lines after them (their
   English side is never read), ``--mono-lines`` of them (default all, 116,672);
2. a reverse model es→en on the parallel data (the preset, ``--steps`` steps);
3. the reverse model samples an English source for every monolingual line
   (``seq2seq-translate --output-dir``, ``--search sampling``, Edunov et al. 2018);
4. the baseline en→es on the parallel data alone, and the forward model on the parallel data
   plus the tagged synthetic pairs (``configs/back_translation.yaml``), both ``--steps`` steps
   of the same batch size: the same training budget;
5. both scored on the shipped test split (2,780 pairs, never used for a choice here).

``distillation`` (Kim & Rush 2016, sequence-level):

1. the teacher (``--teacher``, default the back-translation recipe's baseline, trained on the
   same 20k pairs) translates the parallel data's sources with its beam search;
2. a student of half the width (``d_model`` 128, ``d_ff`` 512, 4 heads, 3+3 layers) trains
   ``--steps`` steps on the original targets, and the same student on the teacher's;
3. all three scored on the test split, with their decoding speed (beam 4, the same
   ``seq2seq-evaluate`` call).

Usage::

    python scripts/workflows.py back-translation --steps 300 --set train.eval_every=300
    python scripts/workflows.py distillation --steps 300 --set train.eval_every=300
    python scripts/workflows.py back-translation --smoke   # tiny models and data (a minute)
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import os
import re
import shlex
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from lora_adapt import cpu_name, run_command  # noqa: E402

SHIPPED = ROOT / "data" / "tatoeba-en-es"
PRESET = ROOT / "configs" / "tatoeba_en_es.yaml"
BT_CONFIG = ROOT / "configs" / "back_translation.yaml"
STUDENT = ["model.d_model=128", "model.d_ff=512", "model.num_heads=4"]
# --smoke: tiny models, a few steps, a few hundred lines (checks the plumbing, not quality)
TINY = [
    "tokenizer.vocab_size=300",
    "model.d_model=32",
    "model.num_heads=2",
    "model.d_ff=64",
    "model.num_encoder_layers=1",
    "model.num_decoder_layers=1",
    "data.max_tokens=1024",
    "train.eval_every=1000",
    "train.checkpoint_every=1000",
    "decode.beam_size=2",
]


@dataclass
class Stage:
    """One command of a recipe: what ran, for how long, with how much memory."""

    name: str
    command: list[str]
    seconds: float
    peak_rss_mib: float
    output: str = ""


@dataclass
class Recipe:
    """The stages run so far and the scores (``seq2seq-evaluate --json``)."""

    stages: list[Stage] = field(default_factory=list)
    scores: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def run(self, name: str, command: list[str], log: Path) -> Stage:
        """Run ``python -m seq2seq COMMAND`` to completion (``lora_adapt.run_command``), timed
        in wall seconds, with the process's peak RSS."""
        print(f"[{name}]", flush=True)
        start = time.perf_counter()
        out, peak = run_command(command, log)  # SystemExit with the log's tail on failure
        seconds = time.perf_counter() - start
        stage = Stage(name, command, seconds, peak, out)
        self.stages.append(stage)
        print(f"[{name}] {seconds:.0f} s, peak RSS {stage.peak_rss_mib:.0f} MiB", flush=True)
        return stage


def _lines(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return f.read().splitlines()


def _write(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def write_data(out: Path, pairs: int, mono_lines: int | None, test_lines: int | None) -> Path:
    """``out/data``: ``small.{en,es}`` (the first ``pairs`` training pairs), ``mono.es`` (the
    Spanish side of the next ``mono_lines``, default all) and ``test.{en,es}`` (the shipped
    test split, or its first ``test_lines``) as plain text. Returns the folder."""
    data = out / "data"
    en, es = _lines(SHIPPED / "train.en.gz"), _lines(SHIPPED / "train.es.gz")
    if pairs >= len(en):
        raise SystemExit(f"--pairs {pairs}: the shipped training split has {len(en)} pairs")
    _write(data / "small.en", en[:pairs])
    _write(data / "small.es", es[:pairs])
    end = len(es) if mono_lines is None else pairs + mono_lines
    _write(data / "mono.es", es[pairs:end])
    for lang in ("en", "es"):
        _write(data / f"test.{lang}", _lines(SHIPPED / f"test.{lang}.gz")[:test_lines])
    return data


def _train(workdir: Path, data_path: Path, steps: int, extra: list[str]) -> list[str]:
    return [
        "train",
        "--config",
        _rel(PRESET),
        f"workdir={_rel(workdir)}",
        f"data.train.path={_rel(data_path)}",
        "train.time_budget=0",
        f"train.steps={steps}",
        *extra,
    ]


def _rel(path: Path) -> str:
    """``path`` relative to the checkout when inside it (the commands read as a user types them)."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def _compare(
    recipe: Recipe,
    name: str,
    systems: list[tuple[str, list[str]]],
    data: Path,
    src: str,
    tgt: str,
    out: Path,
) -> None:
    """``seq2seq-evaluate`` of ``systems`` (label, extra arguments) against the test split; the
    first system is the baseline of the paired tests. Stores the JSON report."""
    command = [
        "evaluate",
        "--ref",
        _rel(data / f"test.{tgt}"),
        "--json",
        _rel(out / f"{name}.json"),
    ]
    for _, args in systems:
        command += args
    if any("--workdir" in args for _, args in systems):
        command += ["--src", _rel(data / f"test.{src}"), "--compare"]
    stage = recipe.run(name, command, out / f"{name}.log")
    report = json.loads((out / f"{name}.json").read_text(encoding="utf-8"))
    recipe.scores[name] = {
        "labels": [label for label, _ in systems],
        "report": report,
        "table": stage.output,
    }


def back_translation(args: argparse.Namespace) -> Recipe:
    out = Path(args.out)
    data = write_data(out, args.pairs, args.mono_lines, args.test_lines)
    recipe = Recipe()
    mono = len(_lines(data / "mono.es"))
    recipe.notes.append(
        f"parallel data: the first {args.pairs:,} pairs of the shipped training split; "
        f"monolingual: the Spanish side of the next {mono:,} lines; test: "
        f"{len(_lines(data / 'test.en')):,} pairs of the shipped test split"
    )
    test = [f"data.test.path={_rel(data / 'test')}"]
    reverse, baseline, forward = out / "reverse", out / "baseline", out / "forward"
    recipe.run(
        "reverse model (es→en)",
        _train(
            reverse,
            data / "small",
            args.steps,
            ["data.src_lang=es", "data.tgt_lang=en", *test, *args.set],
        ),
        out / "reverse.log",
    )
    recipe.run(
        "back-translate the monolingual text (sampling)",
        [
            "translate",
            "--workdir",
            _rel(reverse),
            "--input",
            _rel(data / "mono.es"),
            "--output-dir",
            _rel(out / "bulk"),
            "--output",
            _rel(data / "synthetic.en"),
            "--search",
            "sampling",
            "--seed",
            "1",
        ],
        out / "bulk.log",
    )
    shutil.copyfile(data / "mono.es", data / "synthetic.es")
    recipe.run(
        "baseline (parallel data only)",
        _train(baseline, data / "small", args.steps, [*test, *args.set]),
        out / "baseline.log",
    )
    corpora = []
    if out.resolve() != (ROOT / "runs" / "back_translation").resolve():
        corpora = [
            f"data.train.0.path={_rel(data / 'small')}",
            f"data.train.1.path={_rel(data / 'synthetic')}",
        ]
    recipe.run(
        "forward model (parallel + tagged synthetic)",
        [
            "train",
            "--config",
            _rel(BT_CONFIG),
            f"workdir={_rel(forward)}",
            *corpora,
            *test,
            f"train.steps={args.steps}",
            *args.set,
        ],
        out / "forward.log",
    )
    _compare(
        recipe,
        "test",
        [
            ("baseline", ["--hyp", _rel(baseline / "test.hyp")]),
            ("+ back-translation", ["--hyp", _rel(forward / "test.hyp")]),
        ],
        data,
        "en",
        "es",
        out,
    )
    reverse_test = json.loads((reverse / "test.json").read_text(encoding="utf-8"))
    recipe.notes.append(
        f"the reverse model's own test score (es→en): BLEU {reverse_test['test_bleu']:.2f}, "
        f"chrF {reverse_test['test_chrf']:.2f}"
    )
    return recipe


def distillation(args: argparse.Namespace) -> Recipe:
    out = Path(args.out)
    bt = Path(args.bt_out)
    data = bt / "data"
    if not (data / "small.en").is_file():
        data = write_data(out, args.pairs, 0, args.test_lines)
    teacher = Path(args.teacher) if args.teacher else bt / "baseline"
    if not (teacher / "config.yaml").is_file():
        raise SystemExit(
            f"--teacher {teacher}: no trained run there (run back-translation "
            "first, or give --teacher RUN)"
        )
    recipe = Recipe()
    recipe.notes.append(f"teacher: `{_rel(teacher)}`; parallel data: `{_rel(data / 'small')}`")
    distilled = out / "data" / "distilled"
    distilled.parent.mkdir(parents=True, exist_ok=True)
    recipe.run(
        "teacher translates the training sources (its beam search)",
        [
            "translate",
            "--workdir",
            _rel(teacher),
            "--input",
            _rel(data / "small.en"),
            "--output-dir",
            _rel(out / "bulk"),
            "--output",
            _rel(Path(f"{distilled}.es")),
        ],
        out / "bulk.log",
    )
    shutil.copyfile(data / "small.en", f"{distilled}.en")
    test = [f"data.test.path={_rel(data / 'test')}"]
    original, student = out / "student_original", out / "student_distilled"
    recipe.run(
        "student on the original targets",
        _train(original, data / "small", args.steps, [*STUDENT, *test, *args.set]),
        out / "student_original.log",
    )
    recipe.run(
        "student on the teacher's targets",
        # the original student's SentencePiece model: beam outputs are less varied than the
        # references (8k pieces could not be learned from them), and one vocabulary for both
        # students keeps the comparison about the targets alone
        _train(
            student,
            distilled,
            args.steps,
            [*STUDENT, *test, *args.set, f"tokenizer.model_file={_rel(original / 'spm.model')}"],
        ),
        out / "student_distilled.log",
    )
    _compare(
        recipe,
        "test",
        [
            ("student, original targets", ["--workdir", _rel(original)]),
            ("student, distilled targets", ["--workdir", _rel(student)]),
            ("teacher", ["--workdir", _rel(teacher)]),
        ],
        data,
        "en",
        "es",
        out,
    )
    return recipe


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


COMMANDS_NOTE = (
    "The commands, in order. They read files that the script itself writes under `data/` (the "
    "splits, `mono.es`, and `synthetic.es` / `distilled.en`, copies of the sources), so run the "
    "script once before rerunning a single stage:"
)

TITLES = {
    "back-translation": "Back-translation on the shipped corpus",
    "distillation": "Sequence-level distillation on the shipped corpus",
}


def page(kind: str, recipe: Recipe, args: argparse.Namespace, command: str, started: str) -> str:
    """The markdown page: date, machine, command, the score table, the stages."""
    import jax

    cores = os.cpu_count()
    lines = [
        f"# {TITLES[kind]}",
        "",
        f"Generated by `{command}` ([`scripts/workflows.py`](../scripts/workflows.py)), started "
        f"{started}; {cpu_name()}, {cores} cores, jax {jax.__version__} ({jax.default_backend()}). "
        f"Every training run: the preset's recipe, {args.steps} steps (`train.time_budget=0`), "
        "the last checkpoint tested.",
        "",
        *[f"- {n}" for n in recipe.notes],
        "",
        "## Test scores",
        "",
        "Paired tests against the first row (sacreBLEU; `seq2seq-evaluate --hyp ... --hyp ...`"
        " or `--compare`); 95% confidence intervals from bootstrap resampling.",
        "",
        "```",
        recipe.scores["test"]["table"].rstrip(),
        "```",
        "",
        *summary(recipe.scores["test"]),
        "## Stages",
        "",
        "| stage | wall time | peak RSS |",
        "|---|--:|--:|",
    ]
    for s in recipe.stages:
        lines.append(f"| {s.name} | {s.seconds / 60:.1f} min | {s.peak_rss_mib:,.0f} MiB |")
    lines += [
        "",
        COMMANDS_NOTE,
        "",
        "```bash",
    ]
    for s in recipe.stages:
        lines.append(shlex.join(["python", "-m", "seq2seq", *s.command]))
    lines += ["```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe", choices=sorted(TITLES))
    parser.add_argument("--steps", type=int, default=960, help="steps of every training run")
    parser.add_argument("--pairs", type=int, default=20_000, help="parallel pairs (small/)")
    parser.add_argument("--mono-lines", type=int, help="monolingual lines (default: the rest)")
    parser.add_argument("--test-lines", type=int, help="test pairs (default: all 2,780)")
    parser.add_argument("--teacher", help="distillation: the teacher run (default: BT baseline)")
    parser.add_argument(
        "--bt-out", default="runs/back_translation", help="back-translation's --out"
    )
    parser.add_argument("--out", help="runs, data and logs (default runs/<recipe with _>)")
    parser.add_argument("--doc", help="the page (default docs/<recipe with _>.md)")
    parser.add_argument("--set", action="append", default=[], help="key=value for every training")
    parser.add_argument("--smoke", action="store_true", help="tiny models, data and steps")
    args = parser.parse_args(argv)
    command = shlex.join(["python", "scripts/workflows.py", *(argv or sys.argv[1:])])
    stem = args.recipe.replace("-", "_")
    if args.smoke:
        base = Path(args.out or f"runs/smoke_{stem}")
        args.steps, args.pairs, args.mono_lines, args.test_lines = 6, 400, 200, 40
        args.set = [*TINY, *args.set]
        if args.bt_out == "runs/back_translation":
            args.bt_out = "runs/smoke_back_translation"
        args.out = str(base)
        args.doc = args.doc or str(base / f"{stem}.md")
    args.out = args.out or f"runs/{stem}"
    args.doc = args.doc or f"docs/{stem}.md"
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    recipe = (back_translation if args.recipe == "back-translation" else distillation)(args)
    text = page(args.recipe, recipe, args, command, started)
    Path(args.doc).write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
