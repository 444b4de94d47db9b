"""The run directory: where each artefact of a run lives (paths only; loading and averaging a
trained run are in ``seq2seq.trained``, its report in ``seq2seq.summary``).

Layout::

    workdir/
      config.yaml          resolved config (vocab_size filled in)
      config_changes.jsonl settings changed on resume: ``{"step", "key", "saved", "new"}``
      spm.model, spm.json  SentencePiece model and the hash of its inputs (separate
                           vocabularies: spm.{src_lang}.model/.json, spm.{tgt_lang}.model/.json)
      tokens/              the token store: ids of each split and side as memory-mapped flat
                           arrays, the training files' fingerprints, epoch batch counts
                           (seq2seq.data.token_cache)
      skipped.txt          pairs skipped for an empty side: ``split<TAB>file:line`` per line
      checkpoints/<step>/  orbax checkpoints (state + JSON bookkeeping), last k + best
      metrics.jsonl        one JSON object per log/eval event
      tensorboard/         the same metrics as TensorBoard event files
      test.hyp, test.json  test-set hypotheses and scores
      curves.png           training curves (``seq2seq-plot``)
      summary.md           human-readable summary of the run
      train.log            the log
      compile_cache/       JAX's persistent compilation cache of the run's commands (compiled
                           programs, trusted like code; absent when JAX_COMPILATION_CACHE_DIR
                           names another)

Nothing in it is a pickle: arrays are tensorstore/zarr, everything else is text (or, in
``compile_cache/``, XLA executables).
"""

from __future__ import annotations

from pathlib import Path


def config_path(workdir: str | Path) -> Path:
    """``workdir/config.yaml``."""
    return Path(workdir) / "config.yaml"


def config_changes_path(workdir: str | Path) -> Path:
    """``workdir/config_changes.jsonl``."""
    return Path(workdir) / "config_changes.jsonl"


def tokenizer_path(workdir: str | Path) -> Path:
    """``workdir/spm.model``."""
    return Path(workdir) / "spm.model"


def skipped_path(workdir: str | Path) -> Path:
    """``workdir/skipped.txt``."""
    return Path(workdir) / "skipped.txt"


def compile_cache_dir(workdir: str | Path) -> Path:
    """``workdir/compile_cache``."""
    return Path(workdir) / "compile_cache"


def checkpoint_dir(workdir: str | Path) -> Path:
    """``workdir/checkpoints``."""
    return Path(workdir) / "checkpoints"


def checkpoint_steps(workdir: str | Path) -> list[int]:
    """Steps of the complete checkpoints in ``workdir/checkpoints`` (ascending), read from the
    folder names alone (half-written ``*.orbax-checkpoint-tmp-*`` folders are not counted)."""
    d = checkpoint_dir(workdir)
    if not d.is_dir():
        return []
    return sorted(int(p.name) for p in d.iterdir() if p.is_dir() and p.name.isdigit())
