"""The run directory: where each artefact of a run lives, and loading a trained model from it.

Layout::

    workdir/
      config.yaml          resolved config (vocab_size filled in)
      spm.model, spm.json  SentencePiece model and the hash of its inputs (separate
                           vocabularies: spm.{src_lang}.model/.json, spm.{tgt_lang}.model/.json)
      tokens/              cached token ids of each split and side (seq2seq.data.token_cache)
      checkpoints/<step>/  orbax checkpoints (state + JSON bookkeeping), last k + best
      metrics.jsonl        one JSON object per log/eval event
      tensorboard/         the same metrics as TensorBoard event files
      test.hyp, test.json  test-set hypotheses and scores
      curves.png           training curves (``seq2seq-plot``)
      summary.md           human-readable summary of the run
      train.log            the log

Nothing in it is a pickle: arrays are tensorstore/zarr, everything else is text.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any, Sequence

import jax
import numpy as np
import yaml

from seq2seq.config import Config, load_config, replace, save_config, to_dict
from seq2seq.data.tokenizer import TokenizerPair, load_pair, model_names
from seq2seq.model import build_model
from seq2seq.training.checkpoints import Checkpointer, CheckpointError
from seq2seq.training.metrics import read_metrics
from seq2seq.training.step import TrainState, create_train_state, make_optimizer


def config_path(workdir: str | Path) -> Path:
    """``workdir/config.yaml``."""
    return Path(workdir) / "config.yaml"


def tokenizer_path(workdir: str | Path) -> Path:
    """``workdir/spm.model``."""
    return Path(workdir) / "spm.model"


def checkpoint_dir(workdir: str | Path) -> Path:
    """``workdir/checkpoints``."""
    return Path(workdir) / "checkpoints"


def abstract_train_state(config: Config) -> tuple[Any, TrainState]:
    """``(graphdef, TrainState of jax.ShapeDtypeStruct)`` for ``config``, allocating nothing."""
    holder = {}

    def init():
        model = build_model(config.model, config.train.seed)
        graphdef, state = create_train_state(model, make_optimizer(config.train), config.train.seed)
        holder["graphdef"] = graphdef
        return state

    state = jax.eval_shape(init)
    return holder["graphdef"], state


def load_trained(workdir: str | Path, step: int | None = None) -> tuple[Config, TokenizerPair, Any, Any]:
    """Load a run's config, tokenizer and parameters for translation/evaluation.

    Args:
      workdir: a run directory written by training.
      step: checkpoint step (default: the latest).

    Returns:
      ``(config, tokenizer, graphdef, params)``.

    Raises:
      FileNotFoundError: the directory has no config.yaml or no tokenizer.
      CheckpointError: no checkpoint, or it does not match the configured model.
    """
    workdir = Path(workdir)
    if not config_path(workdir).is_file():
        raise FileNotFoundError(f"{workdir} is not a run directory (no config.yaml)")
    config = load_config(config_path(workdir))
    tokenizer = load_pair(config.tokenizer, workdir, src_lang=config.data.src_lang,
                          tgt_lang=config.data.tgt_lang)
    graphdef, abstract_state = abstract_train_state(config)
    checkpointer = Checkpointer(checkpoint_dir(workdir), async_save=False)
    try:
        step = checkpointer.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"no checkpoint in {checkpoint_dir(workdir)}")
        state, _ = checkpointer.restore(abstract_state, step)
    finally:
        checkpointer.close()
    return config, tokenizer, graphdef, state.params


def checkpoint_steps(workdir: str | Path) -> list[int]:
    """Steps of the complete checkpoints in ``workdir/checkpoints`` (ascending), read from the
    folder names alone (half-written ``*.orbax-checkpoint-tmp-*`` folders are not counted)."""
    d = checkpoint_dir(workdir)
    if not d.is_dir():
        return []
    return sorted(int(p.name) for p in d.iterdir() if p.is_dir() and p.name.isdigit())


def average_checkpoints(workdir: str | Path, output: str | Path, *, steps: Sequence[int] | None = None,
                        last: int | None = None, overwrite: bool = False) -> tuple[Path, list[int]]:
    """Average the parameters of several checkpoints into a new run directory.

    The mean is taken elementwise in float64 and stored in the parameters' dtype. ``output``
    gets the run's config (``workdir`` pointing at ``output``), tokenizer and one checkpoint
    named after the newest averaged step, whose optimizer state, RNG and step are those of the
    newest averaged checkpoint; its metadata records ``averaged_from``. ``seq2seq-translate``
    and ``seq2seq-evaluate`` read it with ``--workdir output``.

    Args:
      workdir: a run directory written by training.
      output: the new run directory.
      steps: the checkpoints to average; or
      last: average the newest ``last`` checkpoints.
      overwrite: replace checkpoints already in ``output``.

    Returns:
      ``(output, steps averaged)``.

    Raises:
      ValueError: neither or both of ``steps``/``last``, fewer than 1 step, a step that is not
        a checkpoint of ``workdir``, or ``output`` is ``workdir``.
      FileNotFoundError: ``workdir`` is not a run directory.
      FileExistsError: ``output`` already holds checkpoints and ``overwrite`` is False.
      CheckpointError: a checkpoint does not match the run's model.
    """
    workdir, output = Path(workdir), Path(output)
    if not config_path(workdir).is_file():
        raise FileNotFoundError(f"{workdir} is not a run directory (no config.yaml)")
    if output.resolve() == workdir.resolve():
        raise ValueError("the output must be a new directory, not the run directory itself")
    if (steps is None) == (last is None):
        raise ValueError("give either the steps to average or how many of the last ones")
    available = checkpoint_steps(workdir)
    if last is not None:
        if last < 1:
            raise ValueError(f"--last must be >= 1, got {last}")
        if last > len(available):
            raise ValueError(f"asked for the last {last} checkpoints but {checkpoint_dir(workdir)} "
                             f"has {len(available)}: {available}")
        steps = available[-last:]
    steps = sorted(set(int(s) for s in steps))
    missing = [s for s in steps if s not in available]
    if not steps or missing:
        raise ValueError(f"no checkpoint of step(s) {missing} in {checkpoint_dir(workdir)}; "
                         f"available: {available}")
    if checkpoint_steps(output) and not overwrite:
        raise FileExistsError(f"{output} already holds checkpoints; choose another output or overwrite")

    config = load_config(config_path(workdir))
    _, abstract = abstract_train_state(config)
    source = Checkpointer(checkpoint_dir(workdir), keep=None, async_save=False)
    try:
        total, newest, meta = None, None, {}
        for s in steps:
            state, meta = source.restore(abstract, s)
            params = jax.tree.map(lambda x: np.asarray(x, np.float64), state.params)
            total = params if total is None else jax.tree.map(np.add, total, params)
            newest = state
    finally:
        source.close()
    mean = jax.tree.map(lambda t, p: (t / len(steps)).astype(p.dtype), total, newest.params)
    averaged = newest.replace(params=jax.tree.map(jax.numpy.asarray, mean))

    output.mkdir(parents=True, exist_ok=True)
    if overwrite and checkpoint_dir(output).exists():
        shutil.rmtree(checkpoint_dir(output))
    save_config(replace(config, workdir=str(output)), config_path(output))
    for stem in dict.fromkeys(model_names(config.tokenizer, config.data.src_lang,
                                          config.data.tgt_lang)):  # joint: one; else one per side
        for name in (f"{stem}.model", f"{stem}.json"):
            if (workdir / name).is_file():
                shutil.copy2(workdir / name, output / name)
    target = Checkpointer(checkpoint_dir(output), keep=None, async_save=False)
    try:
        target.save(steps[-1], averaged, {**meta, "averaged_from": steps, "source": str(workdir)})
    finally:
        target.close()
    (output / "summary.md").write_text(
        f"# Checkpoint average\n\nParameters: elementwise mean of checkpoints {steps} of "
        f"`{workdir}` (optimizer state, RNG and step from checkpoint {steps[-1]}).\n\n"
        f"Use it with `seq2seq-translate --workdir {output}` or "
        f"`seq2seq-evaluate --workdir {output}`.\n", encoding="utf-8")
    return output, steps


def _fmt(value: Any, spec: str = ".4g") -> str:
    if value is None:
        return "–"
    return format(value, spec) if isinstance(value, (int, float)) else str(value)


def _minutes(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds / 60:.1f} min"


def summary_markdown(workdir: str | Path, config: Config, summary: dict[str, Any]) -> str:
    """The run's ``summary.md``: status, results, data, tokenizer, checkpoints, dev curve,
    files, example translations and the resolved config.

    Args:
      workdir: the run directory (checkpoints and ``metrics.jsonl`` are read from it).
      config: the resolved config of the run.
      summary: the dict returned by ``seq2seq.training.loop.train`` (or, for a run that stopped
        before its test decode, ``status``, ``message`` and ``step``); missing keys show as –.
    """
    workdir = Path(workdir)
    t = config.train
    records = read_metrics(workdir)
    dev_rows = {r["step"]: r for r in records if r.get("split") == "dev"}
    best = summary.get("best") or {}
    status = summary.get("status", "unknown")
    lines = [f"# Run `{workdir.name}`", "",
             f"Written {time.strftime('%Y-%m-%d %H:%M:%S')} by `seq2seq-train`. Resume or extend it "
             f"with `seq2seq-train --config {config_path(workdir)}` (add `train.steps=N` to go on).", ""]
    step = summary.get("step")
    if status in ("interrupted", "diverged"):
        lines += [f"**Status: {status} at step {step} of {t.steps}.** {summary.get('message', '')}", ""]
    else:
        lines += [f"**Status: {status.replace('_', ' ')} at step {step} of {t.steps}.**", ""]

    tokens = summary.get("tokens_seen")
    lines += ["## Results", "", "| | |", "|---|---|",
              f"| best dev {best.get('metric', t.best_metric)} | {_fmt(best.get('value'))} at step "
              f"{_fmt(best.get('step'))} (checkpoint kept: {_fmt(summary.get('best_checkpoint'))}) |",
              f"| test BLEU | {_fmt(summary.get('test_bleu'), '.2f')} (checkpoint {_fmt(summary.get('test_step'))}, "
              f"{_fmt(summary.get('test_sentences'))} sentences) |",
              f"| test chrF | {_fmt(summary.get('test_chrf'), '.2f')} |",
              f"| signatures | `{summary.get('bleu_signature', '–')}`; `{summary.get('chrf_signature', '–')}` |",
              f"| tokens seen (source + target, real) | {_fmt(tokens, ',')} |",
              f"| training time (all runs) | {_minutes(summary.get('train_seconds'))} + "
              f"{_minutes(summary.get('eval_seconds'))} dev evaluation |",
              f"| test decode | {_fmt(summary.get('decode_seconds'), '.0f')} s |",
              f"| wall time (this invocation) | {_minutes(summary.get('wall_seconds'))} |",
              f"| parameters | {_fmt(summary.get('parameters'), ',')} |",
              f"| skipped (non-finite) steps | {_fmt(summary.get('skipped_steps'))} |", ""]

    if summary.get("data"):
        lines += ["## Data", "", f"{config.data.src_lang} → {config.data.tgt_lang}; "
                  f"train `{config.data.train.path}`, dev `{config.data.dev.path}`, "
                  f"test `{config.data.test.path}`.", "", "| statistic | value |", "|---|---|"]
        lines += [f"| {k} | {_fmt(v, '.6g')} |" for k, v in summary["data"].items()] + [""]

    tok = config.tokenizer
    lines += ["## Tokenizer", "",
              f"SentencePiece {tok.model_type}, {config.model.vocab_size or tok.vocab_size} pieces: "
              f"`{tok.model_file or tokenizer_path(workdir).name}`.", ""]

    steps = checkpoint_steps(workdir)
    lines += ["## Checkpoints", "", f"In `checkpoints/` (orbax; last {t.keep_checkpoints} kept"
              f"{' plus the best' if t.keep_best else ''}).", "",
              "| step | dev loss | dev BLEU | |", "|---|---|---|---|"]
    for s in steps:
        d = dev_rows.get(s, {})
        note = ", ".join(n for n, ok in (("best", s == best.get("step")), ("latest", s == steps[-1])) if ok)
        lines.append(f"| {s} | {_fmt(d.get('loss'), '.3f')} | {_fmt(d.get('bleu'), '.2f')} | {note} |")
    lines.append("")

    if dev_rows:
        lines += ["## Dev evaluations", "", "| step | loss | accuracy | ppl | BLEU |", "|---|---|---|---|---|"]
        for s, d in sorted(dev_rows.items())[-30:]:
            lines.append(f"| {s} | {_fmt(d.get('loss'), '.3f')} | {_fmt(d.get('accuracy'), '.3f')} | "
                         f"{_fmt(d.get('ppl'), '.2f')} | {_fmt(d.get('bleu'), '.2f')} |")
        lines.append("")

    files = [("config.yaml", "resolved config"), ("spm.model", "SentencePiece model"),
             ("checkpoints", "orbax checkpoints"), ("metrics.jsonl", "metrics, one JSON object per line"),
             ("tensorboard", "TensorBoard event files"), ("test.hyp", "test hypotheses"),
             ("test.json", "test scores, signatures, timings, examples"),
             ("curves.png", "training curves (seq2seq-plot)"), ("train.log", "the log")]
    lines += ["## Files", "", "| file | what |", "|---|---|"]
    lines += [f"| `{name}` | {what} |" for name, what in files if (workdir / name).exists()] + [""]

    if summary.get("examples"):
        lines += ["## Examples (test)", ""]
        for ex in summary["examples"]:
            lines += [f"- SRC {ex['source']}", f"  REF {ex['reference']}", f"  HYP {ex['hypothesis']}"]
        lines.append("")
    lines += ["## Config", "", "```yaml", yaml.safe_dump(to_dict(config), sort_keys=False).rstrip(),
              "```", ""]
    return "\n".join(lines)


def write_summary_md(workdir: str | Path, config: Config, summary: dict[str, Any]) -> Path:
    """Write ``summary_markdown`` to ``workdir/summary.md`` and return its path."""
    path = Path(workdir) / "summary.md"
    path.write_text(summary_markdown(workdir, config, summary), encoding="utf-8")
    return path
