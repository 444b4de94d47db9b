"""The application: one training run from a config, from data preparation to its report.

``train`` is what ``seq2seq-train`` runs on a config resolved before any work
(``seq2seq.resolve``): prepare the data and tokenizers (``prepare_run``), train or resume with
dev BLEU passed in as a callable (``seq2seq.training.loop.fit``), decode and score the test
split, and write ``test.hyp``, ``test.json`` and ``summary.md`` (``seq2seq.summary``). The
layers below never import this module: training knows steps and checkpoints, translation
knows decoding, and this module wires them into a run.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from seq2seq import evaluation
from seq2seq.config import Config, replace, save_config
from seq2seq.data.batching import MixedBatches
from seq2seq.data.pipeline import PreparedData, decode_source_limit, fill_vocab_sizes, prepare
from seq2seq.data.tokenizer import TokenizerPair, load_pair, model_names, vocab_path
from seq2seq.resolve import Resolved, check_run_config, log_changes, resolve_config
from seq2seq.sharding import (
    Partitioner,
    agree_on_steps,
    initialize_distributed,
    is_main_process,
    main_process_first,
)
from seq2seq.summary import RunSummary, write_summary_md
from seq2seq.training.actions import Action
from seq2seq.training.context import train_context
from seq2seq.training.init_from import Parent
from seq2seq.training.loop import DevBleu, Interrupted, fit
from seq2seq.training.metrics import MetricsWriter
from seq2seq.training.probe import step_seconds
from seq2seq.training.progress import TrainingDiverged
from seq2seq.translation import Translator
from seq2seq.workdir import compile_cache_dir, config_changes_path, config_path, skipped_path

log = logging.getLogger(__name__)

__all__ = [
    "Action",
    "Interrupted",
    "TrainingDiverged",
    "check_run_config",
    "dev_bleu",
    "prepare_run",
    "resolve_run",
    "train",
]


def dev_bleu(data: PreparedData, config: Config) -> DevBleu:
    """The dev-BLEU callable ``fit`` calls at each evaluation: sacreBLEU BLEU/chrF of the first
    ``train.bleu_subset`` dev sentences (0 = all; with several dev corpora, shared out evenly
    over them, ``_subset``), decoded by ``Translator`` with beam search of
    ``train.bleu_beam_size`` (1 = greedy, 0 = ``decode.beam_size``) and the rest of the
    ``decode`` settings (length penalty, limits), on the run's mesh, whatever ``decode.search``
    says: a sampled or MBR dev score would move with the seed (and MBR costs more), and it picks
    the best checkpoint; the test decode uses ``decode.search``. Returns ``bleu``, ``chrf`` and
    ``bleu_sentences``.
    """
    t = config.train
    chosen = [
        i
        for _, first, count in _subset(data.dev_parts, t.bleu_subset, len(data.dev_text.sources))
        for i in range(first, first + count)
    ]
    sources = [data.dev_text.sources[i] for i in chosen]
    refs = [data.dev_text.targets[i] for i in chosen]
    decode = replace(
        config.decode, search="beam", beam_size=t.bleu_beam_size or config.decode.beam_size
    )

    def score(params: Any, graphdef: Any, partitioner: Partitioner | None) -> dict[str, float]:
        translator = Translator(
            graphdef,
            params,
            data.tokenizer,
            decode,
            max_src_len=decode_source_limit(config),
            partitioner=partitioner,
        )
        scores = evaluation.score([h[0].text for h in translator.translate(sources)], refs)
        log.debug("dev BLEU signature: %s", scores.bleu_signature)
        return {"bleu": scores.bleu, "chrf": scores.chrf, "bleu_sentences": scores.num_sentences}

    return score


def _subset(parts: list[tuple[str, int]], limit: int, total: int) -> list[tuple[str, int, int]]:
    """``(name, first, count)`` of the sentences taken from each part of a concatenated split
    (``PreparedData.dev_parts`` / ``test_parts``; none: one part of ``total``): all of them
    for ``limit`` 0, else ``limit`` shared out as evenly as the parts allow, the first ones
    of each part."""
    parts = parts or [("", total)]
    base, extra = divmod(limit, len(parts))
    out, first = [], 0
    for i, (name, size) in enumerate(parts):
        out.append((name, first, min(size, base + (i < extra)) if limit else size))
        first += size
    return out


def _reuse_tokenizer(config: Config, parent: Parent, workdir: Path) -> TokenizerPair:
    """Copy the parent run's SentencePiece model(s) into ``workdir`` (under this run's file
    names) and load them (``train.init_from``)."""
    p = parent.config
    theirs = load_pair(
        p.tokenizer, parent.workdir, src_lang=p.data.src_lang, tgt_lang=p.data.tgt_lang
    )
    names = model_names(config.tokenizer, config.data.src_lang, config.data.tgt_lang)
    for tok, name in zip((theirs.source, theirs.target), names):
        dest = workdir / f"{name}.model"
        if not dest.is_file() or dest.read_bytes() != tok.path.read_bytes():
            shutil.copyfile(tok.path, dest)
            log.info("tokenizer: %s copied from %s (train.init_from)", dest, tok.path)
    if theirs.target.vocab_path is not None and config.tokenizer.vocab_file is not None:
        to = vocab_path(config.tokenizer, workdir)  # the map that numbers the pieces
        if to is not None and to.resolve() != theirs.target.vocab_path.resolve():
            shutil.copyfile(theirs.target.vocab_path, to)
    return load_pair(
        config.tokenizer, workdir, src_lang=config.data.src_lang, tgt_lang=config.data.tgt_lang
    )


def _translate_and_score(
    translator: Translator, sources: list[str], references: list[str], out_path: Path | None = None
) -> tuple[evaluation.Scores, list[str]]:
    hyps = [h[0].text for h in translator.translate(sources, progress=True)]
    if out_path is not None:
        out_path.write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    return evaluation.score(hyps, references), hyps


def prepare_run(run: Config | Resolved) -> tuple[Config, PreparedData, Any]:
    """Create the workdir, prepare the data and write ``config.yaml`` (its one writer) for a
    resolved run (a ``Config`` is resolved first: ``seq2seq.resolve.resolve_config``). With
    ``train.init_from`` the parent's models are copied into the workdir
    (``_reuse_tokenizer``) instead of training new ones. A resume's changes are logged and
    appended to ``config_changes.jsonl``.

    Returns:
      The config; the data; and the saved ``DataConfig`` when a resume changed the batching
      (``seq2seq.config.BATCHING``), else None.

    Raises:
      ConfigError / MeshError: invalid settings (when ``run`` is a ``Config``), before any
        work.
      ValueError: the trained tokenizer disagrees with ``model.vocab_size`` (and data errors,
        see ``seq2seq.data.pipeline.prepare``).
    """
    run = _resolved(run)
    config, parent = run.config, run.parent
    log_changes(run)
    workdir = Path(config.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    with main_process_first("prepare"):  # the tokenizer is trained once, then loaded
        reused = _reuse_tokenizer(config, parent, workdir) if parent is not None else None
        data = prepare(config, workdir, tokenizer=reused)
    fill_vocab_sizes(config, data.tokenizer)  # the sizes resolved must be the models'
    if is_main_process():  # only process 0 writes files other than checkpoints
        save_config(config, config_path(workdir))
        _write_skipped(workdir, data.skipped)
        if run.changes:
            with config_changes_path(workdir).open("a", encoding="utf-8") as f:
                for c in run.changes:
                    record = {"key": c.key, "saved": c.saved, "new": c.new}
                    line = json.dumps({"step": run.resumed_step, **record}, ensure_ascii=False)
                    f.write(line + "\n")
    return config, data, run.remap_data_from


def _resolved(run: Config | Resolved) -> Resolved:
    """``run`` resolved (``resolve_config``, after ``jax.distributed`` starts), its notes logged;
    a ``Resolved`` as it is."""
    if isinstance(run, Resolved):
        return run
    initialize_distributed(run.distributed)  # no-op for a single process; before devices
    resolved = resolve_run(run)
    for note in resolved.notes:
        log.info("%s", note)
    return resolved


def resolve_run(config: Config) -> Resolved:
    """``resolve_config``; for a new run whose ``train.time_budget`` chooses its steps, once
    more with the steps the budget buys at the speed of its train step
    (``budget_steps``), so that the recipe's warmup and dropout count them. The timing is
    the first of the notes. Call after ``jax.distributed`` starts.

    Raises:
      as ``resolve_config``.
    """
    resolved = resolve_config(config)
    timed = budget_steps(resolved)
    if timed is None:
        return resolved
    steps, note = timed
    again = resolve_config(config, budget_steps=steps)
    return dataclasses.replace(again, notes=(note, *again.notes))


def budget_steps(resolved: Resolved) -> tuple[int, str] | None:
    """For a new run whose ``train.time_budget`` chooses its steps: the steps the budget buys
    at the speed of its train step, timed on random batches of its shapes
    (``seq2seq.training.probe``; the processes agree on the smallest count), and a line that
    says so; None otherwise (a resume keeps its saved steps)."""
    config = resolved.config
    if resolved.saved is not None or not config.train.time_budget:
        return None
    seconds, compiled = step_seconds(config, Partitioner.from_config(config))
    steps = agree_on_steps(max(1, int(config.train.time_budget / max(seconds, 1e-9))))
    return steps, (
        f"train.time_budget={config.train.time_budget:g}s: the step timed at {seconds:.3f} s "
        f"({compiled:.0f} s to compile): {steps} steps"
    )


def _write_skipped(workdir: Path, skipped: list[str]) -> None:
    """``skipped.txt``: every pair skipped for an empty side (none: no file)."""
    path = skipped_path(workdir)
    if skipped:
        path.write_text("".join(line + "\n" for line in skipped), encoding="utf-8")
        log.warning("the %d skipped pairs are listed in %s", len(skipped), path)
    else:
        path.unlink(missing_ok=True)


def use_compile_cache(workdir: Path) -> None:
    """JAX's persistent compilation cache in ``workdir/compile_cache`` unless one is set
    already (``JAX_COMPILATION_CACHE_DIR``): a resume then loads the train, eval and decoding
    steps it compiled before instead of compiling them again (the same programs)."""
    import jax

    if not jax.config.jax_compilation_cache_dir:  # type: ignore[attr-defined]
        jax.config.update("jax_compilation_cache_dir", str(compile_cache_dir(workdir)))


def train(run: Config | Resolved, *, actions: Sequence[Action] = ()) -> RunSummary:
    """Train (or resume) the run described by ``run`` (resolved, or a ``Config`` to resolve:
    see ``prepare_run``), then evaluate on the test split.

    ``actions``: periodic actions added to the loop's own (``seq2seq.training.actions``;
    run after its checkpoint action, e.g. ``Action("histogram", 100, fn)`` calls
    ``fn(loop)`` after every 100th step and the last).

    Writes ``test.hyp``, ``test.json`` (the summary below) and ``summary.md`` to the workdir.

    Returns:
      The ``RunSummary`` (``seq2seq.summary``; ``test.json`` is its ``to_json``).

    Raises:
      Interrupted: SIGINT/SIGTERM arrived; a checkpoint of the last finished step was saved.
      TrainingDiverged: too many non-finite steps in a row.
      DataError / TokenizerError / ConfigError: bad input (messages name the culprit).
      CheckpointError: the existing checkpoint does not match the configured model.
    """
    wall_start = time.perf_counter()
    resolved = _resolved(run)
    config, data, remap = prepare_run(resolved)
    workdir = Path(config.workdir)
    use_compile_cache(workdir)
    # the graph, abstract state, optimizer and parent resolving built: nothing is built twice
    context = train_context(
        config,
        Partitioner.from_config(config),
        bos_id=data.tokenizer.bos_id,
        spec=resolved.spec,
        parent=resolved.parent,
    )
    try:
        result = fit(
            config,
            data,
            dev_bleu=dev_bleu(data, config),
            actions=actions,
            remap_data_from=remap,
            context=context,
        )
    except (Interrupted, TrainingDiverged) as e:
        status = "interrupted" if isinstance(e, Interrupted) else "diverged"
        if is_main_process():
            stopped = RunSummary(
                status, e.step, message=str(e), wall_seconds=time.perf_counter() - wall_start
            )
            write_summary_md(workdir, config, stopped)
        raise

    translator = Translator(
        result.graphdef,
        result.test_params,
        data.tokenizer,
        config.decode,
        max_src_len=decode_source_limit(config),
        partitioner=result.partitioner,
    )
    parts = _subset(data.test_parts, config.decode.test_limit, len(data.test_text.sources))
    chosen = [i for _, first, count in parts for i in range(first, first + count)]
    sources = [data.test_text.sources[i] for i in chosen]
    refs = [data.test_text.targets[i] for i in chosen]
    main = is_main_process()
    t0 = time.perf_counter()
    scores, hyps = _translate_and_score(
        translator, sources, refs, workdir / "test.hyp" if main else None
    )
    decode_seconds = time.perf_counter() - t0
    step = int(result.state.step)
    writer = MetricsWriter(workdir, enabled=main)
    writer.write(
        step, "test", {"bleu": scores.bleu, "chrf": scores.chrf, "checkpoint": result.test_step}
    )
    by_corpus: dict[str, dict[str, float]] = {}
    if len(parts) > 1:  # one score per test corpus (e.g. per direction), in test.hyp's order
        at = 0
        for name, _, count in parts:
            part = evaluation.score(hyps[at : at + count], refs[at : at + count])
            at += count
            by_corpus[name] = {"bleu": part.bleu, "chrf": part.chrf, "sentences": count}
            writer.write(step, f"test_{name}", {"bleu": part.bleu, "chrf": part.chrf})
            log.info(
                "test %s: BLEU %.2f chrF %.2f (%d sentences)", name, part.bleu, part.chrf, count
            )
    writer.close()
    shares: dict[str, tuple[float, float]] = {}
    if isinstance(data.train, MixedBatches):
        counts = data.train.counts(result.progress.micro_batches)
        shares = {
            name: (float(n) / max(int(counts.sum()), 1), float(w))
            for name, n, w in zip(data.train_corpora, counts, data.train.weights)
        }
    p = result.progress
    summary = RunSummary(
        status=result.stopped,
        step=step,
        steps=p.steps(config),
        dev=p.dev,
        best=result.best.to_json(),
        best_checkpoint=result.best_checkpoint,
        test_step=result.test_step,
        test_bleu=scores.bleu,
        test_chrf=scores.chrf,
        bleu_signature=scores.bleu_signature,
        chrf_signature=scores.chrf_signature,
        test_sentences=scores.num_sentences,
        test_by_corpus=by_corpus,
        corpus_shares=shares,
        ema_decay=config.train.ema_decay,
        tokens_seen=p.tokens_seen,
        target_tokens_seen=p.target_tokens_seen,
        skipped_steps=p.skipped_total,
        train_seconds=p.train_seconds,
        eval_seconds=p.eval_seconds,
        decode_seconds=decode_seconds,
        wall_seconds=time.perf_counter() - wall_start,
        parameters=result.parameters,
        trainable_parameters=result.trainable,
        optimizer_moment_bytes=result.moment_bytes,
        checkpoints=result.checkpoints,
        discarded_checkpoints=result.discarded,
        resume_note=result.resume_note,
        data=data.stats,
        examples=[
            {"source": s, "reference": r, "hypothesis": h}
            for s, r, h in list(zip(sources, refs, hyps))[:5]
        ],
    )
    if main:
        (workdir / "test.json").write_text(
            json.dumps(summary.to_json(), indent=1, ensure_ascii=False), encoding="utf-8"
        )
        write_summary_md(workdir, config, summary)
    return summary
