"""The run's report: ``RunSummary`` (what ``seq2seq.run.train`` returns and ``test.json``
holds) and ``summary.md`` rendered from it (status, results, data, tokenizer, checkpoints, dev
curve, files, examples and the resolved config), written by ``seq2seq.run``."""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from seq2seq.config import Config, config_yaml
from seq2seq.training.metrics import read_metrics
from seq2seq.workdir import checkpoint_steps, config_changes_path, config_path, tokenizer_path


@dataclass(frozen=True)
class RunSummary:
    """What one training run reports. A run stopped before its test decode (``interrupted``,
    ``diverged``) has ``status``, ``message``, ``step`` and ``wall_seconds`` only; the other
    fields keep their defaults (None or empty).

    Attributes:
      status: ``finished``, ``early_stopping``, ``max_seconds``, ``interrupted`` or
        ``diverged``.
      step: the last step trained.
      steps: the run's step count (``train.steps`` or the count ``train.time_budget`` chose).
      message: why a run stopped early ("" otherwise).
      dev: the last dev metrics (``loss``, ``nll``, ``accuracy``, ``ppl``, ``bleu``, ...).
      best: the best dev metric: ``metric``, ``value``, ``step`` and ``loss``.
      best_checkpoint: the step of the kept best checkpoint, or None.
      test_step: the checkpoint the test decode used.
      test_bleu / test_chrf: sacreBLEU corpus scores of the test decode (0–100).
      bleu_signature / chrf_signature: sacreBLEU's signatures of them.
      test_sentences: sentences decoded.
      test_by_corpus: per test corpus (several test entries): ``bleu``, ``chrf``,
        ``sentences``.
      corpus_shares: per training corpus (several): (share of the batches so far, weight).
      ema_decay: ``train.ema_decay`` (0: the raw weights were tested).
      tokens_seen / target_tokens_seen: real tokens trained on (source + target; target).
      skipped_steps: steps skipped for a non-finite loss or gradient.
      train_seconds / eval_seconds: training and dev evaluation time over all invocations, s.
      decode_seconds: the test decode, s; wall_seconds: this invocation, s.
      parameters / trainable_parameters: the model's parameters and those the optimizer
        updates (fewer with LoRA); optimizer_moment_bytes: the Adam moments' bytes.
      checkpoints: the steps kept; discarded_checkpoints: half-written saves of a crash,
        deleted at the start, with resume_note (what the log said, "" when none).
      data: the corpus statistics of ``seq2seq.data.pipeline.prepare``.
      examples: the first test sentences: ``source``, ``reference``, ``hypothesis``.
    """

    status: str
    step: int
    steps: int | None = None
    message: str = ""
    dev: dict[str, float] = field(default_factory=dict)
    best: dict[str, Any] = field(default_factory=dict)
    best_checkpoint: int | None = None
    test_step: int | None = None
    test_bleu: float | None = None
    test_chrf: float | None = None
    bleu_signature: str | None = None
    chrf_signature: str | None = None
    test_sentences: int | None = None
    test_by_corpus: dict[str, dict[str, float]] = field(default_factory=dict)
    corpus_shares: dict[str, tuple[float, float]] = field(default_factory=dict)
    ema_decay: float = 0.0
    tokens_seen: int | None = None
    target_tokens_seen: int | None = None
    skipped_steps: int | None = None
    train_seconds: float | None = None
    eval_seconds: float | None = None
    decode_seconds: float | None = None
    wall_seconds: float | None = None
    parameters: int | None = None
    trainable_parameters: int | None = None
    optimizer_moment_bytes: int | None = None
    checkpoints: list[int] = field(default_factory=list)
    discarded_checkpoints: list[int] = field(default_factory=list)
    resume_note: str = ""
    data: dict[str, float] = field(default_factory=dict)
    examples: list[dict[str, str]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The fields as ``test.json`` holds them (``message`` only when set)."""
        out = dataclasses.asdict(self)
        if not self.message:
            del out["message"]
        return out

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> RunSummary:
        """A summary read back from ``test.json`` (keys it does not know are refused).

        Raises:
          TypeError: a key that is no field.
        """
        shares = record.get("corpus_shares") or {}
        return cls(**{**record, "corpus_shares": {k: tuple(v) for k, v in shares.items()}})


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


def summary_markdown(workdir: str | Path, config: Config, summary: RunSummary) -> str:
    """The run's ``summary.md``: status, results, data, tokenizer, checkpoints, dev curve,
    files, example translations and the resolved config.

    Args:
      workdir: the run directory (checkpoints and ``metrics.jsonl`` are read from it).
      config: the resolved config of the run.
      summary: what ``seq2seq.run.train`` returns (a run stopped before its test decode has
        its status, message and step only); a field left at None shows as –.
    """
    workdir = Path(workdir)
    t = config.train
    records = read_metrics(workdir)
    dev_rows = {r["step"]: r for r in records if r.get("split") == "dev"}
    best = summary.best
    status = summary.status
    lines = [
        f"# Run `{workdir.name}`",
        "",
        f"Written {time.strftime('%Y-%m-%d %H:%M:%S')} by `seq2seq-train`. Resume or extend it "
        f"with `seq2seq-train --config {config_path(workdir)}` (add `train.steps=N` to go on).",
        "",
    ]
    step, steps = summary.step, summary.steps or t.steps  # as the budget chose
    if status in ("interrupted", "diverged"):
        lines += [
            f"**Status: {status} at step {step} of {steps}.** {summary.message}",
            "",
        ]
    else:
        lines += [f"**Status: {status.replace('_', ' ')} at step {step} of {steps}.**", ""]
    if summary.resume_note:  # a save cut short by a crash, found at the start
        lines += [f"**Resume: {summary.resume_note}.**", ""]

    tokens = summary.tokens_seen
    lines += [
        "## Results",
        "",
        "| | |",
        "|---|---|",
        f"| best dev {best.get('metric', t.best_metric)} | {_fmt(best.get('value'))} at step "
        f"{_fmt(best.get('step'))} (checkpoint kept: {_fmt(summary.best_checkpoint)}) |",
        f"| test BLEU | {_fmt(summary.test_bleu, '.2f')} "
        f"(checkpoint {_fmt(summary.test_step)}, "
        f"{_fmt(summary.test_sentences)} sentences) |",
        f"| test chrF | {_fmt(summary.test_chrf, '.2f')} |",
        *(
            f"| test BLEU {name} | {_fmt(part.get('bleu'), '.2f')} (chrF "
            f"{_fmt(part.get('chrf'), '.2f')}, {_fmt(part.get('sentences'))} sentences) |"
            for name, part in summary.test_by_corpus.items()
        ),
        *(
            f"| corpus share {name} | {_fmt(share, '.1%')} of the training batches "
            f"(weight {_fmt(weight, '.1%')}) |"
            for name, (share, weight) in summary.corpus_shares.items()
        ),
        *(
            [f"| weights evaluated | EMA, decay {t.ema_decay} (train.ema_decay) |"]
            if t.ema_decay
            else []
        ),
        *([f"| initialised from | `{t.init_from}` |"] if t.init_from else []),
        f"| signatures | `{_fmt(summary.bleu_signature)}`; `{_fmt(summary.chrf_signature)}` |",
        f"| tokens seen (source + target, real) | {_fmt(tokens, ',')} |",
        f"| training time (all runs) | {_minutes(summary.train_seconds)} + "
        f"{_minutes(summary.eval_seconds)} dev evaluation |",
        f"| test decode | {_fmt(summary.decode_seconds, '.0f')} s |",
        f"| wall time (this invocation) | {_minutes(summary.wall_seconds)} |",
        f"| parameters | {_fmt(summary.parameters, ',')} |",
        *(
            [
                f"| trained parameters | {_fmt(summary.trainable_parameters, ',')} "
                f"(LoRA rank {t.lora_rank}, alpha {t.lora_alpha:g}, on "
                f"{', '.join(t.lora_targets)}; Adam moments "
                f"{_fmt(summary.optimizer_moment_bytes, ',')} bytes) |"
            ]
            if t.lora_rank
            else []
        ),
        f"| skipped (non-finite) steps | {_fmt(summary.skipped_steps)} |",
        "",
    ]

    if summary.data:
        lines += [
            "## Data",
            "",
            f"{config.data.src_lang} → {config.data.tgt_lang}; {_sources(config)}.",
            "",
            "| statistic | value |",
            "|---|---|",
        ]
        lines += [f"| {k} | {_fmt(v, '.6g')} |" for k, v in summary.data.items()] + [""]

    tok = config.tokenizer
    lines += [
        "## Tokenizer",
        "",
        f"SentencePiece {tok.model_type}, {config.model.vocab_size or tok.vocab_size} pieces: "
        f"`{tok.model_file or tokenizer_path(workdir).name}`.",
        "",
    ]

    kept = checkpoint_steps(workdir)
    lines += [
        "## Checkpoints",
        "",
        f"In `checkpoints/` (orbax; last {t.keep_checkpoints} kept"
        f"{' plus the best' if t.keep_best else ''}).",
        "",
        "| step | dev loss | dev BLEU | |",
        "|---|---|---|---|",
    ]
    for s in kept:
        d = dev_rows.get(s, {})
        note = ", ".join(
            n for n, ok in (("best", s == best.get("step")), ("latest", s == kept[-1])) if ok
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

    if summary.examples:
        lines += ["## Examples (test)", ""]
        for ex in summary.examples:
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


def write_summary_md(workdir: str | Path, config: Config, summary: RunSummary) -> Path:
    """Write ``summary_markdown`` to ``workdir/summary.md`` and return its path."""
    path = Path(workdir) / "summary.md"
    path.write_text(summary_markdown(workdir, config, summary), encoding="utf-8")
    return path
