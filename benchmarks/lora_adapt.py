"""Adapt a trained run to another corpus by full fine-tuning and by LoRA, at equal steps, and
write the table: test BLEU / chrF before, after full fine-tuning and after LoRA, with the
trained parameters, the Adam-moment bytes and the peak memory (RSS) of each training.

Everything runs through the real commands (``python -m seq2seq train`` / ``evaluate``), each in
its own process:

1. ``seq2seq-evaluate`` of the base run on the adaptation test set ("before");
2. ``seq2seq-train --config BASE/config.yaml train.init_from=BASE`` on the adaptation corpus
   for ``--steps`` steps, once with every weight trained ("full") and once with
   ``train.lora_rank`` ("LoRA"); the step count is given (``train.time_budget`` off) and the
   last checkpoint is tested (``train.test_checkpoint=last``), so both runs see the same
   batches;
3. ``seq2seq-evaluate`` of each on the adaptation test set (LoRA read merged).

The corpus is given as text-format prefixes (``PREFIX.SRC`` / ``PREFIX.TGT``, optionally
``.gz``) for the base run's languages. The table goes to ``--doc`` (markdown, with the date, the
machine and the command) and to standard output.

Usage::

    python -m benchmarks.lora_adapt --base runs/tatoeba_en_es --train adapt/train \\
        --dev adapt/dev --test adapt/test --steps 400
    python -m benchmarks.lora_adapt --smoke        # a tiny base and corpus, a few steps (minutes)
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import os
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from benchmarks.harness import TINY_SIZES, cpu_name, run_command

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "data" / "tatoeba-en-es"
TINY = [
    *TINY_SIZES,
    "model.dropout_rate=0.1",
    "data.max_len=32",
    "data.max_tokens=256",
    "train.warmup_steps=2",
    "train.dev_bleu=false",
    "train.best_metric=loss",
    "decode.beam_size=1",
]


@dataclass
class Result:
    """One row of the table."""

    name: str
    bleu: float
    chrf: float
    trained: int | None = None
    parameters: int | None = None
    moment_bytes: int | None = None
    peak_rss_mib: float | None = None
    train_seconds: float | None = None


def _scores(out: str) -> tuple[float, float]:
    bleu = re.search(r"BLEU = (\d+(?:\.\d+)?)", out)
    chrf = re.search(r"chrF\d*\+* = (\d+(?:\.\d+)?)", out)
    if not bleu or not chrf:
        raise SystemExit(f"no BLEU/chrF in the evaluate output:\n{out[-2000:]}")
    return float(bleu.group(1)), float(chrf.group(1))


def _languages(base: Path) -> tuple[str, str]:
    text = (base / "config.yaml").read_text(encoding="utf-8")
    src = re.search(r"^  src_lang: (\S+)$", text, re.M)
    tgt = re.search(r"^  tgt_lang: (\S+)$", text, re.M)
    if not src or not tgt:
        raise SystemExit(f"{base}/config.yaml names no data.src_lang / data.tgt_lang")
    return src.group(1), tgt.group(1)


def _plain_file(prefix: str, lang: str, out: Path) -> Path:
    """``PREFIX.LANG`` (or ``.gz``) as a plain text file for seq2seq-evaluate."""
    for path in (Path(f"{prefix}.{lang}"), Path(f"{prefix}.{lang}.gz")):
        if path.is_file():
            if path.suffix != ".gz":
                return path
            target = out / f"test.{lang}"
            with gzip.open(path, "rt", encoding="utf-8") as f:
                target.write_text(f.read(), encoding="utf-8")
            return target
    raise SystemExit(f"no {prefix}.{lang} (or .gz)")


def adapt(args: argparse.Namespace) -> list[Result]:
    base, out = Path(args.base), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    src, tgt = _languages(base)
    test_src, test_ref = (_plain_file(args.test, lang, out) for lang in (src, tgt))
    evaluate = ["evaluate", "--src", str(test_src), "--ref", str(test_ref)]
    results = []
    stdout, _ = run_command([*evaluate, "--workdir", str(base)], out / "before.log")
    results.append(Result("before (the base run)", *_scores(stdout)))
    common = [
        "train",
        "--config",
        str(base / "config.yaml"),
        f"train.init_from={base}",
        "data.train.format=text",
        f"data.train.path={args.train}",
        "data.dev.format=text",
        f"data.dev.path={args.dev}",
        "data.test.format=text",
        f"data.test.path={args.test}",
        f"train.steps={args.steps}",
        f"train.warmup_steps={max(args.steps // 10, 1)}",
        "train.time_budget=0",
        "train.test_checkpoint=last",
        f"train.checkpoint_every={args.steps}",
        f"train.eval_every={args.steps}",
        *args.set,
    ]
    runs = {
        "full fine-tuning": [f"train.learning_rate={args.full_lr}", "train.lora_rank=0"],
        f"LoRA r={args.rank}, α={args.alpha:g}, {args.targets}": [
            f"train.learning_rate={args.lora_lr}",
            f"train.lora_rank={args.rank}",
            f"train.lora_alpha={args.alpha}",
            f"train.lora_targets=[{args.targets}]",
        ],
    }
    for (name, extra), folder in zip(runs.items(), ("full", "lora")):
        workdir = out / folder
        _, peak = run_command([*common, f"workdir={workdir}", *extra], out / f"{folder}.train.log")
        summary = json.loads((workdir / "test.json").read_text(encoding="utf-8"))
        stdout, _ = run_command([*evaluate, "--workdir", str(workdir)], out / f"{folder}.eval.log")
        results.append(
            Result(
                name,
                *_scores(stdout),
                trained=summary.get("trainable_parameters"),
                parameters=summary.get("parameters"),
                moment_bytes=summary.get("optimizer_moment_bytes"),
                peak_rss_mib=peak,
                train_seconds=summary.get("train_seconds"),
            )
        )
    return results


def table(results: list[Result], args: argparse.Namespace, command: str) -> str:
    import jax

    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    cores = os.cpu_count()
    lines = [
        "# LoRA against full fine-tuning at equal steps",
        "",
        f"{stamp}; {cpu_name()}, {cores} cores, jax {jax.__version__} ({jax.default_backend()}); "
        f"base `{args.base}`, adaptation corpus `{args.train}` (dev `{args.dev}`, test "
        f"`{args.test}`), {args.steps} steps each, learning rate {args.full_lr:g} (full) and "
        f"{args.lora_lr:g} (LoRA). Regenerate with:",
        "",
        "```bash",
        command,
        "```",
        "",
        "| model | test BLEU | chrF | trained parameters | Adam moments | peak RSS | training |",
        "|---|--:|--:|--:|--:|--:|--:|",
    ]

    def fmt(value, spec, unit=""):
        return "–" if value is None else f"{value:{spec}}{unit}"

    for r in results:
        trained = (
            "–"
            if r.trained is None or r.parameters is None
            else f"{r.trained:,} of {r.parameters:,} ({100 * r.trained / r.parameters:.2f}%)"
        )
        moments = None if r.moment_bytes is None else r.moment_bytes / 2**20
        lines.append(
            f"| {r.name} | {r.bleu:.2f} | {r.chrf:.2f} | {trained} | {fmt(moments, '.2f', ' MiB')}"
            f" | {fmt(r.peak_rss_mib, '.0f', ' MiB')} | {fmt(r.train_seconds, '.0f', ' s')} |"
        )
    lines += [
        "",
        "Peak RSS is the training process's whole resident memory (Python, XLA, data), so it "
        "moves less than the optimizer state does.",
    ]
    return "\n".join(lines) + "\n"


def smoke(out: Path) -> argparse.Namespace:
    """A tiny base run (4 steps on 400 shipped pairs) and an adaptation corpus of other pairs;
    the arguments for ``adapt`` with 2 steps."""
    data = out / "data"
    data.mkdir(parents=True, exist_ok=True)
    lines = {}
    for lang in ("en", "es"):
        with gzip.open(SHIPPED / f"train.{lang}.gz", "rt", encoding="utf-8") as f:
            lines[lang] = f.read().split("\n")[:1300]
    spans = {"train": (0, 400), "dev": (400, 416), "test": (416, 422)}
    spans |= {"adapt.train": (500, 1200), "adapt.dev": (1200, 1216), "adapt.test": (1216, 1240)}
    for name, (a, b) in spans.items():
        for lang in ("en", "es"):
            (data / f"{name}.{lang}").write_text("\n".join(lines[lang][a:b]) + "\n", "utf-8")
    base = out / "base"
    run_command(
        [
            "train",
            f"workdir={base}",
            *[f"data.{s}.path={data / s}" for s in ("train", "dev", "test")],
            *TINY,
            "train.steps=4",
        ],
        out / "base.train.log",
    )
    return argparse.Namespace(
        base=str(base),
        train=str(data / "adapt.train"),
        dev=str(data / "adapt.dev"),
        test=str(data / "adapt.test"),
        steps=2,
        rank=2,
        alpha=4.0,
        targets="attention",
        full_lr=1e-3,
        lora_lr=1e-2,
        set=[],
        out=str(out / "runs"),
        doc=str(out / "lora_adaptation.md"),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", help="the trained run to adapt")
    parser.add_argument("--train", help="adaptation training prefix (PREFIX.SRC, PREFIX.TGT)")
    parser.add_argument("--dev", help="adaptation dev prefix")
    parser.add_argument("--test", help="adaptation test prefix")
    parser.add_argument("--steps", type=int, default=400, help="steps of each adaptation")
    parser.add_argument("--rank", type=int, default=8, help="train.lora_rank")
    parser.add_argument("--alpha", type=float, default=16.0, help="train.lora_alpha")
    parser.add_argument("--targets", default="attention", help="train.lora_targets, a,b,...")
    parser.add_argument("--full-lr", type=float, default=5e-4, help="full fine-tuning's peak")
    parser.add_argument("--lora-lr", type=float, default=2e-3, help="LoRA's peak rate")
    parser.add_argument("--set", action="append", default=[], help="more key=value for both")
    parser.add_argument("--out", default="runs/lora_adapt", help="the runs and logs")
    parser.add_argument("--doc", default="docs/lora_adaptation.md", help="the table (markdown)")
    parser.add_argument("--smoke", action="store_true", help="tiny base, corpus and steps")
    args = parser.parse_args(argv)
    command = shlex.join(["python", "-m", "benchmarks.lora_adapt", *(argv or sys.argv[1:])])
    if args.smoke:
        args = smoke(Path(args.out) / "smoke")
    elif not (args.base and args.train and args.dev and args.test):
        parser.error("give --base, --train, --dev and --test (or --smoke)")
    results = adapt(args)
    text = table(results, args, command)
    Path(args.doc).write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
