"""A run's config, resolved once before any work: YAML file + overrides → final frozen Config.

``resolve(path, overrides)`` (or ``resolve_config`` of a loaded config) runs these stages in
this order, and no placeholder is left after them:

1. **recipe**: ``data.max_tokens``, ``train.steps`` and ``train.warmup_steps`` left at 0 and a
   null ``model.dropout_rate`` take the saved values of the run being resumed (a workdir with
   a checkpoint and ``config.yaml``), else the recipe's rule from the training corpus
   (``seq2seq/data/recipe.py``); a ``train.steps`` given by the user turns
   ``train.time_budget`` off (the budget only chooses steps left to it);
2. **init_from**: with ``train.init_from`` the parent's tokenizer settings replace this run's
   (its SentencePiece models are reused, ``seq2seq.training.init_from``);
3. **vocabulary sizes**: ``model.vocab_size`` / ``model.src_vocab_size`` left at 0 take the
   parent's, else the resumed run's, else the size of a given ``.model`` file, else
   ``tokenizer.vocab_size`` (SentencePiece trains exactly that many pieces; the run layer
   checks the trained model against it);
4. **resume**: the changes against the saved ``config.yaml``; a key whose rule in the schema
   is not ``free`` on resume (``seq2seq.config.RESUMABLE``) is refused unless
   ``train.allow_config_change`` (a ``remapped`` one, ``seq2seq.config.BATCHING``, then
   moves the data position by examples);
5. **validation**: every check that needs no data (``check_run_config``).

Every command and script builds its config here; nothing below the run layer fills in or
refuses a placeholder. Only ``seq2seq.run.prepare_run`` writes the result to ``config.yaml``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax

from seq2seq.config import (
    BATCHING,
    FREE,
    Config,
    ConfigError,
    ModelConfig,
    check_position_limits,
    check_ranges,
    flatten,
    load_config,
    replace,
    rule_of,
)
from seq2seq.data import recipe
from seq2seq.data.pipeline import MIN_DECODE_SOURCE_LEN, check_corpora, check_vocabularies
from seq2seq.data.sources import FORMATS
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.sharding import Partitioner
from seq2seq.training.checks import check_train_config
from seq2seq.training.init_from import (
    Parent,
    check_init_from,
    check_parent_shapes,
    resolve_parent,
)
from seq2seq.training.step import TrainSpec, train_spec
from seq2seq.translation import check_decode_config
from seq2seq.workdir import checkpoint_steps, config_path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Change:
    """One key that differs from the resumed run's saved ``config.yaml``.

    Attributes:
      key: the dotted key (``train.steps``).
      saved / new: its saved and its new value.
      free: the key's rule lets it change on resume; False: allowed only by
        ``train.allow_config_change``.
    """

    key: str
    saved: Any
    new: Any
    free: bool


@dataclass(frozen=True)
class Resolved:
    """A run's final config and what resolving it found.

    Attributes:
      config: the final, frozen config (no placeholder left).
      notes: lines to log: what the recipe chose, a time budget turned off.
      saved: the saved config of the run being resumed, or None for a new run.
      resumed_step: the newest checkpoint of that run (0 for a new run).
      changes: the keys that differ from ``saved``.
      parent: the run ``train.init_from`` starts from, or None.
      spec: the model's graph, abstract ``TrainState`` and optimizer, built by the check
        (``check_run_config``) and used again by training; None when not validated.
    """

    config: Config
    notes: tuple[str, ...] = ()
    saved: Config | None = None
    resumed_step: int = 0
    changes: tuple[Change, ...] = ()
    parent: Parent | None = None
    spec: TrainSpec | None = None

    @property
    def remap_data_from(self) -> Any:
        """The saved ``DataConfig`` when a resume changed the batching (``BATCHING``), else
        None."""
        if self.saved is not None and any(c.key in BATCHING for c in self.changes):
            return self.saved.data
        return None


def resolve(
    path: str | Path | None, overrides: list[str] | tuple[str, ...] = (), *, validate: bool = True
) -> Resolved:
    """``load_config(path, overrides)`` resolved by ``resolve_config``.

    Raises:
      ConfigError / MeshError / DataError / FileNotFoundError: see ``resolve_config``.
    """
    return resolve_config(load_config(path, overrides), validate=validate)


def resolve_config(
    config: Config, *, validate: bool = True, budget_steps: int | None = None
) -> Resolved:
    """``config`` through the stages of the module docstring; reads only the training corpus
    (when the recipe needs it), given tokenizer model files and the saved ``config.yaml`` of
    this run and of its ``train.init_from`` parent; writes nothing.

    ``validate``: False skips the resume check and ``check_run_config`` (``seq2seq-params``,
    which only counts parameters). ``budget_steps``: the steps ``train.time_budget`` buys at
    the timed speed (``seq2seq.run``), which the recipe counts instead of the token budget's.

    Raises:
      ConfigError / MeshError: a setting is invalid or a resume changes a key it may not
        (the message names the key and value).
      DataError / FileNotFoundError / TokenizerError: the corpus or a model file cannot be
        read (only read when needed).
    """
    workdir = Path(config.workdir)
    steps = checkpoint_steps(workdir)
    saved = load_config(config_path(workdir)) if steps and config_path(workdir).is_file() else None
    config, notes = _recipe(config, saved, budget_steps)
    parent = resolve_parent(config)
    if parent is not None:  # the parent's tokenizer settings: its models are reused
        tok = parent.config.tokenizer
        config = replace(
            config,
            tokenizer=replace(tok, model_file=None, src_model_file=None, tgt_model_file=None),
        )
    config = _vocab_sizes(config, parent, saved)
    changes = _changes(config, saved) if saved is not None else ()
    spec = None
    if validate:
        refused = [c for c in changes if not c.free]
        if refused and not config.train.allow_config_change:
            listed = "; ".join(f"{c.key}: {c.saved!r} → {c.new!r}" for c in refused)
            raise ConfigError(
                f"{workdir} holds a run at step {steps[-1]} whose {config_path(workdir).name} "
                f"differs in settings that change what the run is: {listed}. Resume with the "
                f"saved values, use another workdir, or set train.allow_config_change=true"
            )
        spec = _check_run_config(config, parent, mesh=True)
    return Resolved(config, notes, saved, steps[-1] if saved else 0, changes, parent, spec)


def _recipe(
    config: Config, saved: Config | None, budget_steps: int | None = None
) -> tuple[Config, tuple[str, ...]]:
    """Stage 1: the recipe's placeholders filled (the resumed run's values first)."""
    notes = []
    if config.train.steps and config.train.time_budget:
        notes.append(
            f"train.steps={config.train.steps} is given: "
            f"train.time_budget={config.train.time_budget:g} does not apply"
        )
        config = replace(config, **{"train.time_budget": 0.0})
    if saved is not None:  # the recipe's keys that this command leaves to it: the run's values
        keep = {
            "data.max_tokens": (not config.data.max_tokens, saved.data.max_tokens),
            "train.steps": (not config.train.steps, saved.train.steps),
            "train.warmup_steps": (not config.train.warmup_steps, saved.train.warmup_steps),
            "model.dropout_rate": (config.model.dropout_rate is None, saved.model.dropout_rate),
        }
        config = replace(config, **{k: old for k, (left, old) in keep.items() if left})
    config, note = recipe.resolve(config, budget_steps=budget_steps)
    return config, tuple(n for n in (note, *notes) if n)


def _vocab_sizes(config: Config, parent: Parent | None, saved: Config | None) -> Config:
    """Stage 3: ``model.vocab_size`` / ``model.src_vocab_size`` left at 0 filled in."""
    m, tok = config.model, config.tokenizer
    if m.vocab_size and (m.src_vocab_size or tok.joint):
        return config
    known = parent.config if parent is not None else saved
    if known is not None and (parent is not None or known.tokenizer == tok):
        target, source = known.model.vocab_size, known.model.src_vocab_size  # its models
    else:

        def size(model_file: str | None) -> int:
            return Tokenizer(model_file).vocab_size if model_file else tok.vocab_size

        if tok.joint:
            target = source = size(tok.model_file)
        else:
            target, source = size(tok.tgt_model_file), size(tok.src_model_file)
    return replace(
        config,
        **{
            "model.vocab_size": m.vocab_size or target,
            "model.src_vocab_size": m.src_vocab_size or (0 if tok.joint else source),
        },
    )


def _changes(config: Config, saved: Config) -> tuple[Change, ...]:
    """Stage 4: the keys of ``config`` that differ from the saved run's (``workdir`` aside)."""
    old, new = flatten(saved), flatten(config)
    return tuple(
        Change(k, old.get(k), v, rule_of(k).resume == FREE)
        for k, v in new.items()
        if old.get(k) != v and k != "workdir"
    )


def log_changes(resolved: Resolved) -> None:
    """Log each resume change (a warning for one allowed only by
    ``train.allow_config_change``)."""
    for c in resolved.changes:
        level = logging.INFO if c.free else logging.WARNING
        log.log(
            level,
            "resuming step %d with %s changed: %r → %r",
            resolved.resumed_step,
            c.key,
            c.saved,
            c.new,
        )


def check_run_config(config: Config, *, mesh: bool = True) -> TrainSpec:
    """Every check that needs no data, run before any work starts (no file read or written).

    Every key's ``Range`` in the schema (``seq2seq.config.check_ranges``, section by section),
    ``train`` (``check_train_config``), ``decode`` (``check_decode_config``), tokenizer and
    vocabulary settings (``check_vocabularies``), the corpus entries (``check_corpora``:
    weights, tags, directions), ``train.init_from`` (``check_init_from``: the parent's
    model must match), the data formats and batch arithmetic, the
    model (built abstractly, nothing allocated, so shape errors surface here and not after
    training the tokenizer) and the mesh (its sizes, whole heads and FFN units per ``tensor``
    shard, batch rows divisible by ``data × fsdp``; ``mesh`` False: not against this
    process's devices, for ``seq2seq-plan``, which checks it against the target's).

    Returns:
      The ``TrainSpec`` the model check built (the run's graph, abstract state, optimizer).

    Raises:
      ConfigError / MeshError / ValueError: the message names the key and value at fault.
    """
    return _check_run_config(config, resolve_parent(config), mesh=mesh)


def _check_run_config(config: Config, parent: Parent | None, *, mesh: bool) -> TrainSpec:
    """``check_run_config`` with the parent already resolved (``resolve_config``)."""
    check_train_config(config)
    check_decode_config(config.decode)
    check_ranges(config.distributed, "distributed.")
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
    check_ranges(d, "data.")  # each key's Range in the schema: max_len ≥ 2, max_tokens ≥ 0, ...
    check_ranges(m, "model.")  # sizes ≥ 1, dropout rates in [0, 1), block sizes, ...
    if d.max_tokens < d.max_len:
        raise ConfigError(
            f"data.max_tokens={d.max_tokens} is less than one row of "
            f"data.max_len={d.max_len} tokens"
        )
    if d.concat_pairs_to_tokens > d.max_len:
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
    check_init_from(config, parent)  # the parent's model settings must match this one's
    spec = train_spec(config)  # the model, built abstractly
    if parent is not None:
        check_parent_shapes(config, parent, spec.abstract)
    if mesh:
        Partitioner.from_config(config).process_rows(d.max_tokens // d.max_len)
    return spec


def check_attention_config(m: ModelConfig) -> None:
    """``model.attention`` and its block sizes (``model/attention.py``).

    The block sizes' range (≥ 1) is the schema's, checked with the other ``model`` keys.

    Raises:
      ConfigError: ``cudnn`` (cuDNN flash attention) without a GPU backend; the message names
        the key, the value and the reason.
    """
    backend = jax.default_backend()
    if m.attention == "cudnn" and backend != "gpu":
        raise ConfigError(
            f"model.attention=cudnn needs a GPU backend (cuDNN flash attention); this "
            f"JAX backend is {backend}: use model.attention=chunked (same memory "
            f"behaviour, any backend) or dense"
        )
