"""The run's report: ``summary.md`` (status, results, data, tokenizer, checkpoints, dev curve,
files, examples and the resolved config), written by ``seq2seq.run``."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from seq2seq.config import Config, config_yaml
from seq2seq.training.metrics import read_metrics
from seq2seq.workdir import checkpoint_steps, config_changes_path, config_path, tokenizer_path


def _fmt(value: Any, spec: str = ".4g") -> str:
    if value is None:
        return "–"
    return format(value, spec) if isinstance(value, (int, float)) else str(value)


def _minutes(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds / 60:.1f} min"


def _sources(config: Config) -> str:
    """``train `path`, dev `path`, test `path``` (each entry's direction, tag and weight too
    when a split has several or a tag)."""
    d, parts = config.data, []
    for split in ("train", "dev", "test"):
        entries = d.corpora(split)
        texts = []
        for s in entries:
            text = f"`{s.path}`"
            if len(entries) > 1 or s.tag:
                extra = "→".join(d.direction(s))
                extra += f", tag {s.tag}" if s.tag else ""
                extra += f", weight {s.weight:g}" if split == "train" and len(entries) > 1 else ""
                text += f" ({extra})"
            texts.append(text)
        parts.append(f"{split} " + ", ".join(texts))
    return ", ".join(parts)


def summary_markdown(workdir: str | Path, config: Config, summary: dict[str, Any]) -> str:
    """The run's ``summary.md``: status, results, data, tokenizer, checkpoints, dev curve,
    files, example translations and the resolved config.

    Args:
      workdir: the run directory (checkpoints and ``metrics.jsonl`` are read from it).
      config: the resolved config of the run.
      summary: the dict returned by ``seq2seq.run.train`` (or, for a run that stopped
        before its test decode, ``status``, ``message`` and ``step``); missing keys show as –.
    """
    workdir = Path(workdir)
    t = config.train
    records = read_metrics(workdir)
    dev_rows = {r["step"]: r for r in records if r.get("split") == "dev"}
    best = summary.get("best") or {}
    status = summary.get("status", "unknown")
    lines = [
        f"# Run `{workdir.name}`",
        "",
        f"Written {time.strftime('%Y-%m-%d %H:%M:%S')} by `seq2seq-train`. Resume or extend it "
        f"with `seq2seq-train --config {config_path(workdir)}` (add `train.steps=N` to go on).",
        "",
    ]
    step, steps = summary.get("step"), summary.get("steps", t.steps)  # as the budget chose
    if status in ("interrupted", "diverged"):
        lines += [
            f"**Status: {status} at step {step} of {steps}.** {summary.get('message', '')}",
            "",
        ]
    else:
        lines += [f"**Status: {status.replace('_', ' ')} at step {step} of {steps}.**", ""]
    if summary.get("resume_note"):  # a save cut short by a crash, found at the start
        lines += [f"**Resume: {summary['resume_note']}.**", ""]

    tokens = summary.get("tokens_seen")
    lines += [
        "## Results",
        "",
        "| | |",
        "|---|---|",
        f"| best dev {best.get('metric', t.best_metric)} | {_fmt(best.get('value'))} at step "
        f"{_fmt(best.get('step'))} (checkpoint kept: {_fmt(summary.get('best_checkpoint'))}) |",
        f"| test BLEU | {_fmt(summary.get('test_bleu'), '.2f')} "
        f"(checkpoint {_fmt(summary.get('test_step'))}, "
        f"{_fmt(summary.get('test_sentences'))} sentences) |",
        f"| test chrF | {_fmt(summary.get('test_chrf'), '.2f')} |",
        *(
            f"| test BLEU {name} | {_fmt(part.get('bleu'), '.2f')} (chrF "
            f"{_fmt(part.get('chrf'), '.2f')}, {_fmt(part.get('sentences'))} sentences) |"
            for name, part in (summary.get("test_by_corpus") or {}).items()
        ),
        *(
            f"| corpus share {name} | {_fmt(share, '.1%')} of the training batches "
            f"(weight {_fmt(weight, '.1%')}) |"
            for name, (share, weight) in (summary.get("corpus_shares") or {}).items()
        ),
        *(
            [f"| weights evaluated | EMA, decay {t.ema_decay} (train.ema_decay) |"]
            if t.ema_decay
            else []
        ),
        *([f"| initialised from | `{t.init_from}` |"] if t.init_from else []),
        f"| signatures | `{summary.get('bleu_signature', '–')}`; "
        f"`{summary.get('chrf_signature', '–')}` |",
        f"| tokens seen (source + target, real) | {_fmt(tokens, ',')} |",
        f"| training time (all runs) | {_minutes(summary.get('train_seconds'))} + "
        f"{_minutes(summary.get('eval_seconds'))} dev evaluation |",
        f"| test decode | {_fmt(summary.get('decode_seconds'), '.0f')} s |",
        f"| wall time (this invocation) | {_minutes(summary.get('wall_seconds'))} |",
        f"| parameters | {_fmt(summary.get('parameters'), ',')} |",
        *(
            [
                f"| trained parameters | {_fmt(summary.get('trainable_parameters'), ',')} "
                f"(LoRA rank {t.lora_rank}, alpha {t.lora_alpha:g}, on "
                f"{', '.join(t.lora_targets)}; Adam moments "
                f"{_fmt(summary.get('optimizer_moment_bytes'), ',')} bytes) |"
            ]
            if t.lora_rank
            else []
        ),
        f"| skipped (non-finite) steps | {_fmt(summary.get('skipped_steps'))} |",
        "",
    ]

    if summary.get("data"):
        lines += [
            "## Data",
            "",
            f"{config.data.src_lang} → {config.data.tgt_lang}; {_sources(config)}.",
            "",
            "| statistic | value |",
            "|---|---|",
        ]
        lines += [f"| {k} | {_fmt(v, '.6g')} |" for k, v in summary["data"].items()] + [""]

    tok = config.tokenizer
    lines += [
        "## Tokenizer",
        "",
        f"SentencePiece {tok.model_type}, {config.model.vocab_size or tok.vocab_size} pieces: "
        f"`{tok.model_file or tokenizer_path(workdir).name}`.",
        "",
    ]

    steps = checkpoint_steps(workdir)
    lines += [
        "## Checkpoints",
        "",
        f"In `checkpoints/` (orbax; last {t.keep_checkpoints} kept"
        f"{' plus the best' if t.keep_best else ''}).",
        "",
        "| step | dev loss | dev BLEU | |",
        "|---|---|---|---|",
    ]
    for s in steps:
        d = dev_rows.get(s, {})
        note = ", ".join(
            n for n, ok in (("best", s == best.get("step")), ("latest", s == steps[-1])) if ok
        )
        lines.append(
            f"| {s} | {_fmt(d.get('loss'), '.3f')} | {_fmt(d.get('bleu'), '.2f')} | {note} |"
        )
    lines.append("")

    if dev_rows:
        lines += [
            "## Dev evaluations",
            "",
            "| step | loss | accuracy | ppl | BLEU |",
            "|---|---|---|---|---|",
        ]
        for s, d in sorted(dev_rows.items())[-30:]:
            lines.append(
                f"| {s} | {_fmt(d.get('loss'), '.3f')} | {_fmt(d.get('accuracy'), '.3f')} | "
                f"{_fmt(d.get('ppl'), '.2f')} | {_fmt(d.get('bleu'), '.2f')} |"
            )
        lines.append("")

    changes_file = config_changes_path(workdir)
    if changes_file.is_file():
        lines += [
            "## Config changes on resume",
            "",
            "| at step | key | saved | new |",
            "|---|---|---|---|",
        ]
        for line in changes_file.read_text(encoding="utf-8").splitlines():
            c = json.loads(line)
            lines.append(f"| {c['step']} | `{c['key']}` | {c['saved']!r} | {c['new']!r} |")
        lines.append("")

    files = [
        ("config.yaml", "resolved config"),
        ("config_changes.jsonl", "changes on resume"),
        ("spm.model", "SentencePiece model"),
        ("checkpoints", "orbax checkpoints"),
        ("metrics.jsonl", "metrics, one JSON object per line"),
        ("tensorboard", "TensorBoard event files"),
        ("test.hyp", "test hypotheses"),
        ("test.json", "test scores, signatures, timings, examples"),
        ("curves.png", "training curves (seq2seq-plot)"),
        ("train.log", "the log"),
    ]
    lines += ["## Files", "", "| file | what |", "|---|---|"]
    lines += [f"| `{name}` | {what} |" for name, what in files if (workdir / name).exists()] + [""]

    if summary.get("examples"):
        lines += ["## Examples (test)", ""]
        for ex in summary["examples"]:
            lines += [
                f"- SRC {ex['source']}",
                f"  REF {ex['reference']}",
                f"  HYP {ex['hypothesis']}",
            ]
        lines.append("")
    lines += [
        "## Config",
        "",
        "```yaml",
        config_yaml(config).rstrip(),
        "```",
        "",
    ]
    return "\n".join(lines)


def write_summary_md(workdir: str | Path, config: Config, summary: dict[str, Any]) -> Path:
    """Write ``summary_markdown`` to ``workdir/summary.md`` and return its path."""
    path = Path(workdir) / "summary.md"
    path.write_text(summary_markdown(workdir, config, summary), encoding="utf-8")
    return path
