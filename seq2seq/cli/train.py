"""``seq2seq-train``: train (or resume) a run, then report its test scores."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from seq2seq.cli.common import LOG, _config_from_argv, _fail, _setup_logging
from seq2seq.config import config_yaml


def train_main(argv: Sequence[str] | None = None) -> int:
    """``seq2seq-train --config FILE [key=value ...]``: train, resume, then report test BLEU."""
    config = _config_from_argv(
        "seq2seq-train",
        "Train (or resume) a Transformer NMT run, then "
        "score the test split with sacreBLEU. Rerun the same command to "
        "resume.",
        argv,
    )
    if isinstance(config, int):
        return config
    from seq2seq.run import Interrupted, resolve_run, train  # heavy imports
    from seq2seq.sharding import initialize_distributed, is_main_process

    initialize_distributed(config.distributed)  # before any device use; no-op for one process
    try:  # every check that needs no data, before the run directory or its log exist (or move)
        run = resolve_run(config)  # a time budget's step timed first (seq2seq.run)
    except (ValueError, FileNotFoundError) as e:
        return _fail(str(e))
    config = run.config
    try:
        _setup_logging(Path(config.workdir) if is_main_process() else None)  # one train.log
    except OSError as e:  # the workdir is a file, or cannot be created
        return _fail(f"workdir={config.workdir}: cannot hold the run: {e}")
    for note in run.notes:
        LOG.info("%s", note)
    LOG.info("config:\n%s", config_yaml(config))
    try:
        summary = train(run)
    except Interrupted as e:
        print(str(e), file=sys.stderr)
        return 128 + e.signum  # 130 for SIGINT (Ctrl-C), 143 for SIGTERM
    except KeyboardInterrupt:  # before the training loop (data, tokenizer): nothing to save
        print(
            "interrupted before training started; no checkpoint was written by this run",
            file=sys.stderr,
        )
        return 130
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        return _fail(str(e))
    best = summary.best
    status = {
        "finished": "",
        "early_stopping": " (stopped early)",
        "max_seconds": " (train.max_seconds reached)",
    }.get(summary.status, "")
    value = "–" if best["value"] is None else f"{best['value']:.4g}"
    print(
        f"\nstep {summary.step}{status}: best dev {best['metric']} {value} at step {best['step']}"
    )
    print(
        f"test BLEU {summary.test_bleu:.2f}, chrF {summary.test_chrf:.2f} on "
        f"{summary.test_sentences} sentences (checkpoint of step {summary.test_step})"
    )
    print(f"  {summary.bleu_signature}\n  {summary.chrf_signature}")
    train_s, eval_s, decode_s, wall_s = (
        x or 0.0
        for x in (
            summary.train_seconds,
            summary.eval_seconds,
            summary.decode_seconds,
            summary.wall_seconds,
        )
    )
    print(
        f"  train {train_s / 60:.1f} min, dev evaluation {eval_s / 60:.1f} min, test decode "
        f"{decode_s:.0f} s, wall {wall_s / 60:.1f} min; {summary.tokens_seen or 0:,} tokens seen"
    )
    print(f"  outputs in {config.workdir} (see summary.md)")
    print("\nexamples:")
    for ex in summary.examples:
        print(f"  SRC {ex['source']}\n  REF {ex['reference']}\n  HYP {ex['hypothesis']}\n")
    return 0
