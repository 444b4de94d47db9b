"""The application: one training run from a config, from data preparation to its report.

``train`` is what ``seq2seq-train`` runs: check every setting before any work
(``check_run_config``), prepare the data and tokenizers (``prepare_run``), train or resume with
dev BLEU passed in as a callable (``seq2seq.training.loop.fit``), decode and score the test
split, and write ``test.hyp``, ``test.json`` and ``summary.md`` (``seq2seq.summary``). The
layers below never import this module: training knows steps and checkpoints, translation
knows decoding, and this module wires them into a run.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

import jax

from seq2seq import evaluation
from seq2seq.config import (
    Config,
    ConfigError,
    ModelConfig,
    check_position_limits,
    flatten,
    load_config,
    replace,
    save_config,
)
from seq2seq.data import recipe
from seq2seq.data.batching import MixedBatches
from seq2seq.data.pipeline import (
    MIN_DECODE_SOURCE_LEN,
    PreparedData,
    check_corpora,
    check_vocabularies,
    decode_source_limit,
    fill_vocab_sizes,
    prepare,
)
from seq2seq.data.sources import FORMATS
from seq2seq.data.tokenizer import TokenizerPair, load_pair, model_names
from seq2seq.sharding import (
    Partitioner,
    initialize_distributed,
    is_main_process,
    main_process_first,
)
from seq2seq.summary import write_summary_md
from seq2seq.training.init_from import Parent, check_init_from
from seq2seq.training.loop import DevBleu, Interrupted, TrainingDiverged, check_train_config, fit
from seq2seq.training.metrics import MetricsWriter
from seq2seq.training.step import abstract_train_state
from seq2seq.translation import Translator, check_decode_config
from seq2seq.workdir import checkpoint_steps, config_changes_path, config_path, skipped_path

log = logging.getLogger(__name__)

__all__ = [
    "RESUMABLE",
    "Interrupted",
    "TrainingDiverged",
    "check_resume",
    "check_run_config",
    "resolve_recipe",
    "dev_bleu",
    "prepare_run",
    "train",
]

# Keys (or sections, ending in ".") that may change when a run resumes: they change how it goes
# on, not what it is. Any other change is refused unless train.allow_config_change=true.
RESUMABLE = (
    "workdir",
    "train.steps",
    "train.token_budget",
    "train.eval_every",
    "train.checkpoint_every",
    "train.log_every",
    "train.dev_bleu",
    "train.bleu_subset",
    "train.bleu_beam_size",
    "train.patience",
    "train.keep_checkpoints",
    "train.keep_best",
    "train.test_checkpoint",
    "train.max_seconds",
    "train.time_budget",
    "train.max_skipped_steps",
    "train.allow_config_change",
    "decode.",
    "data.dev.",
    "data.test.",
    "data.dev",  # a list of dev/test corpora is one key
    "data.test",
    "mesh.",
    "distributed.",
)
# Changes that move the data position: it is remapped by examples (see remap_position).
BATCHING = ("data.max_tokens", "data.max_len", "data.packing")


def check_run_config(config: Config) -> None:
    """Every check that needs no data, run before any work starts (no file read or written).

    ``train`` (``check_train_config``), ``decode`` (``check_decode_config``), tokenizer and
    vocabulary settings (``check_vocabularies``), the corpus entries (``check_corpora``:
    weights, tags, directions), ``train.init_from`` (``check_init_from``: the parent's
    model must match), the data formats and batch arithmetic, the
    model (built abstractly, nothing allocated, so shape errors surface here and not after
    training the tokenizer) and the mesh (its sizes, whole heads and FFN units per ``tensor``
    shard, batch rows divisible by ``data × fsdp``).

    Raises:
      ConfigError / MeshError / ValueError: the message names the key and value at fault.
    """
    check_train_config(config)
    check_decode_config(config.decode)
    check_vocabularies(config)
    check_corpora(config)
    d, m = config.data, config.model
    for split in ("train", "dev", "test"):
        entries = d.corpora(split)
        for i, source in enumerate(entries):
            if source.format not in FORMATS:
                key = f"data.{split}.{i}" if len(entries) > 1 else f"data.{split}"
                raise ConfigError(
                    f"{key}.format must be one of {', '.join(FORMATS)}; got {source.format!r}"
                )
    if d.max_len < 2:
        raise ConfigError(f"data.max_len must be >= 2 (a token and EOS), got {d.max_len}")
    if d.max_tokens < 0:
        raise ConfigError(f"data.max_tokens must be >= 0 (0 = from the corpus), got {d.max_tokens}")
    if d.max_tokens and d.max_tokens < d.max_len:
        raise ConfigError(
            f"data.max_tokens={d.max_tokens} is less than one row of "
            f"data.max_len={d.max_len} tokens"
        )
    if not 0 <= d.concat_pairs_to_tokens <= d.max_len:
        raise ConfigError(
            f"data.concat_pairs_to_tokens={d.concat_pairs_to_tokens} must be in "
            f"[0, data.max_len={d.max_len}] (a document must fit a row; 0 = off)"
        )
    if m.positions == "learned" and m.max_len < d.max_len:
        raise ConfigError(
            f"model.positions=learned has a table of model.max_len={m.max_len} "
            f"positions, fewer than data.max_len={d.max_len}: raise model.max_len"
        )
    check_position_limits(
        config,
        max(d.max_len, MIN_DECODE_SOURCE_LEN),
        f"the test decode's source limit max(data.max_len, "
        f"{MIN_DECODE_SOURCE_LEN}) up to model.max_len",
        capped=True,
    )
    if m.d_model % m.num_heads:
        raise ConfigError(
            f"model.d_model={m.d_model} is not divisible by model.num_heads={m.num_heads}"
        )
    check_attention_config(m)
    check_init_from(config)  # the parent's model must match this one
    vocab = m.vocab_size or config.tokenizer.vocab_size
    abstract_train_state(
        replace(
            config, **{"model.vocab_size": vocab, "model.src_vocab_size": m.src_vocab_size or vocab}
        )
    )
    partitioner = Partitioner.from_config(config)
    if d.max_tokens:  # rows split over data × fsdp (0: the recipe's power of two, later)
        partitioner.process_rows(d.max_tokens // d.max_len)


def resolve_recipe(config: Config) -> tuple[Config, str]:
    """``config`` with ``data.max_tokens``, ``train.steps`` and ``train.warmup_steps`` that are
    0 and a null ``model.dropout_rate`` filled in: on resume with the run's saved values, else
    by the recipe's rule from the training corpus (``seq2seq/data/recipe.py``); and the line
    to log (empty: nothing chosen).

    A ``train.steps`` given by the user (not 0) turns ``train.time_budget`` off: the budget
    only chooses the steps that are left to it.

    Raises:
      DataError / FileNotFoundError: the training corpus cannot be read (only read when needed).
    """
    given = ""
    if config.train.steps and config.train.time_budget:
        given = (
            f"train.steps={config.train.steps} is given: "
            f"train.time_budget={config.train.time_budget:g} does not apply"
        )
        config = replace(config, **{"train.time_budget": 0.0})
    if not recipe.left_to_recipe(config):
        return config, given
    workdir = Path(config.workdir)
    if checkpoint_steps(workdir) and config_path(workdir).is_file():
        saved = load_config(config_path(workdir))
        keep = {  # the recipe's keys that this command leaves to it: the run's values
            "data.max_tokens": (not config.data.max_tokens, saved.data.max_tokens),
            "train.steps": (not config.train.steps, saved.train.steps),
            "train.warmup_steps": (not config.train.warmup_steps, saved.train.warmup_steps),
            "model.dropout_rate": (config.model.dropout_rate is None, saved.model.dropout_rate),
        }
        config = replace(config, **{k: old for k, (left, old) in keep.items() if left})
    config, note = recipe.resolve(config)
    return config, "; ".join(n for n in (note, given) if n)


def check_attention_config(m: ModelConfig) -> None:
    """``model.attention`` and its block sizes (``model/attention.py``).

    Raises:
      ConfigError: a block size < 1, or ``cudnn`` (cuDNN flash attention) without a GPU
        backend; the message names the key, the value and the reason.
    """
    for key in ("attention_q_block", "attention_kv_block"):
        if getattr(m, key) < 1:
            raise ConfigError(f"model.{key} must be >= 1, got {getattr(m, key)}")
    backend = jax.default_backend()
    if m.attention == "cudnn" and backend != "gpu":
        raise ConfigError(
            f"model.attention=cudnn needs a GPU backend (cuDNN flash attention); this "
            f"JAX backend is {backend}: use model.attention=chunked (same memory "
            f"behaviour, any backend) or dense"
        )


def _resumable(key: str) -> bool:
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in RESUMABLE)


def check_resume(
    config: Config, *, quiet: bool = False
) -> tuple[Config | None, list[tuple[str, Any, Any]]]:
    """Compare ``config`` with the saved ``config.yaml`` of a run that has checkpoints.

    Keys in ``RESUMABLE`` may change (each change is logged); a change to any other key is
    refused unless ``train.allow_config_change``. A vocabulary size of 0 (from the tokenizer)
    matches the saved size. Nothing is written; ``quiet``: the changes are not logged.

    Returns:
      (the saved config, or None for a new run; the changes as ``(key, saved, new)``).

    Raises:
      ConfigError: a refused change; the message names each key with its saved and new value.
    """
    workdir = Path(config.workdir)
    steps = checkpoint_steps(workdir)
    if not steps or not config_path(workdir).is_file():
        return None, []
    saved = load_config(config_path(workdir))
    old, new = flatten(saved), flatten(config)
    changes = [
        (k, old.get(k), v)
        for k, v in new.items()
        if old.get(k) != v
        and k != "workdir"
        and not (k in ("model.vocab_size", "model.src_vocab_size") and v == 0)
    ]
    refused = [c for c in changes if not _resumable(c[0])]
    listed = "; ".join(f"{k}: {a!r} → {b!r}" for k, a, b in refused)
    if refused and not config.train.allow_config_change:
        raise ConfigError(
            f"{workdir} holds a run at step {steps[-1]} whose {config_path(workdir).name} differs "
            f"in settings that change what the run is: {listed}. Resume with the saved values, "
            f"use another workdir, or set train.allow_config_change=true"
        )
    for k, a, b in [] if quiet else changes:
        level = logging.WARNING if (k, a, b) in refused else logging.INFO
        log.log(level, "resuming step %d with %s changed: %r → %r", steps[-1], k, a, b)
    return saved, changes


def dev_bleu(data: PreparedData, config: Config) -> DevBleu:
    """The dev-BLEU callable ``fit`` calls at each evaluation: sacreBLEU BLEU/chrF of the first
    ``train.bleu_subset`` dev sentences (0 = all; with several dev corpora, shared out evenly
    over them, ``_subset``), decoded by ``Translator`` with beam
    ``train.bleu_beam_size`` (1 = greedy, 0 = ``decode.beam_size``) and the rest of the
    ``decode`` settings, on the run's mesh. Returns ``bleu``, ``chrf`` and ``bleu_sentences``.
    """
    t = config.train
    chosen = [
        i
        for _, first, count in _subset(data.dev_parts, t.bleu_subset, len(data.dev_text.sources))
        for i in range(first, first + count)
    ]
    sources = [data.dev_text.sources[i] for i in chosen]
    refs = [data.dev_text.targets[i] for i in chosen]
    decode = replace(config.decode, beam_size=t.bleu_beam_size or config.decode.beam_size)

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


def prepare_run(config: Config, *, checked: bool = False) -> tuple[Config, PreparedData, Any]:
    """Fill in the recipe's keys left at 0 (``seq2seq/data/recipe.py``), check the config
    (and, when resuming, its changes: ``check_resume``), create the workdir, prepare the data
    and write ``config.yaml``. With ``train.init_from`` the parent's tokenizer settings
    replace this config's and its models are copied into the workdir (``_reuse_tokenizer``)
    instead of training new ones.

    ``checked``: the caller already ran ``resolve_recipe`` and ``check_run_config`` (they
    are not run twice).

    Returns:
      The config with ``model.vocab_size`` filled in from the tokenizer; the data; and the
      saved ``DataConfig`` when a resume changed the batching (``BATCHING``), else None.

    Raises:
      ConfigError / MeshError: invalid settings (``check_run_config``), before any work.
      ValueError: ``model.vocab_size`` disagrees with the tokenizer (and data errors, see
        ``seq2seq.data.pipeline.prepare``).
    """
    initialize_distributed(config.distributed)  # no-op for a single process; before devices
    if not checked:  # seq2seq-train checks before it sets up its log
        config, note = resolve_recipe(config)
        if note:
            log.info("%s", note)
        check_run_config(config)
    workdir = Path(config.workdir)
    parent = check_init_from(config)
    if parent is not None:  # the parent's tokenizer settings: its models are reused
        tok = parent.config.tokenizer
        config = replace(
            config,
            tokenizer=replace(tok, model_file=None, src_model_file=None, tgt_model_file=None),
        )
    saved, changes = check_resume(config)  # before anything in the run directory is rewritten
    workdir.mkdir(parents=True, exist_ok=True)
    with main_process_first("prepare"):  # the tokenizer is trained once, then loaded
        reused = _reuse_tokenizer(config, parent, workdir) if parent is not None else None
        data = prepare(config, workdir, tokenizer=reused)
    config = fill_vocab_sizes(config, data.tokenizer)
    if is_main_process():  # only process 0 writes files other than checkpoints
        save_config(config, config_path(workdir))
        _write_skipped(workdir, data.skipped)
        if changes:
            step = checkpoint_steps(workdir)[-1]
            with config_changes_path(workdir).open("a", encoding="utf-8") as f:
                for key, old, new in changes:
                    f.write(
                        json.dumps(
                            {"step": step, "key": key, "saved": old, "new": new}, ensure_ascii=False
                        )
                        + "\n"
                    )
    remap = saved.data if saved and any(k in BATCHING for k, _, _ in changes) else None
    return config, data, remap


def _write_skipped(workdir: Path, skipped: list[str]) -> None:
    """``skipped.txt``: every pair skipped for an empty side (none: no file)."""
    path = skipped_path(workdir)
    if skipped:
        path.write_text("".join(line + "\n" for line in skipped), encoding="utf-8")
        log.warning("the %d skipped pairs are listed in %s", len(skipped), path)
    else:
        path.unlink(missing_ok=True)


def train(config: Config, *, checked: bool = False) -> dict[str, Any]:
    """Train (or resume) the run described by ``config``, then evaluate on the test split
    (``checked``: as in ``prepare_run``).

    Writes ``test.hyp``, ``test.json`` (the summary below) and ``summary.md`` to the workdir.

    Returns:
      A summary dict: ``status`` (``finished``, ``early_stopping`` or ``max_seconds``),
      ``step``, last ``dev`` metrics, ``best`` (metric, value, step, dev loss),
      ``best_checkpoint``, ``test_step`` (checkpoint decoded), ``test_bleu``/``test_chrf`` with
      signatures,
      ``tokens_seen`` (real source+target tokens), ``train_seconds`` (all runs), this run's
      ``wall_seconds``, ``checkpoints``, ``discarded_checkpoints`` (steps whose save a crash
      interrupted, deleted at the start) with ``resume_note`` (what the log said about them,
      "" when none), ``examples``.

    Raises:
      Interrupted: SIGINT/SIGTERM arrived; a checkpoint of the last finished step was saved.
      TrainingDiverged: too many non-finite steps in a row.
      DataError / TokenizerError / ConfigError: bad input (messages name the culprit).
      CheckpointError: the existing checkpoint does not match the configured model.
    """
    wall_start = time.perf_counter()
    config, data, remap = prepare_run(config, checked=checked)
    workdir = Path(config.workdir)
    try:
        result = fit(config, data, dev_bleu=dev_bleu(data, config), remap_data_from=remap)
        config = result.config  # train.steps as train.time_budget chose it
    except (Interrupted, TrainingDiverged) as e:
        status = "interrupted" if isinstance(e, Interrupted) else "diverged"
        if is_main_process():
            write_summary_md(
                workdir,
                config,
                {
                    "status": status,
                    "message": str(e),
                    "step": e.step,
                    "wall_seconds": time.perf_counter() - wall_start,
                },
            )
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
    summary = {
        "status": result.stopped,
        "step": step,
        "dev": p.dev,
        "best": result.best.to_json(),
        "best_checkpoint": result.best_checkpoint,
        "test_step": result.test_step,
        "test_bleu": scores.bleu,
        "test_chrf": scores.chrf,
        "bleu_signature": scores.bleu_signature,
        "chrf_signature": scores.chrf_signature,
        "test_sentences": scores.num_sentences,
        "test_by_corpus": by_corpus,
        "corpus_shares": shares,
        "ema_decay": config.train.ema_decay,
        "tokens_seen": p.tokens_seen,
        "target_tokens_seen": p.target_tokens_seen,
        "skipped_steps": p.skipped_total,
        "train_seconds": p.train_seconds,
        "eval_seconds": p.eval_seconds,
        "decode_seconds": decode_seconds,
        "wall_seconds": time.perf_counter() - wall_start,
        "parameters": result.parameters,
        "checkpoints": result.checkpoints,
        "discarded_checkpoints": result.discarded,
        "resume_note": result.resume_note,
        "data": data.stats,
        "examples": [
            {"source": s, "reference": r, "hypothesis": h}
            for s, r, h in list(zip(sources, refs, hyps))[:5]
        ],
    }
    if main:
        (workdir / "test.json").write_text(
            json.dumps(summary, indent=1, ensure_ascii=False), encoding="utf-8"
        )
        write_summary_md(workdir, config, summary)
    return summary
