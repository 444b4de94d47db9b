"""Opening trained runs for inference: the one place ``seq2seq-translate``, ``-evaluate``,
``-score``, ``-serve``, ``-plot`` and ``-export`` load a model.

``open_run`` takes the members (one run at its default checkpoint, one checkpoint, or several
runs or checkpoints for an ensemble), chooses each checkpoint (``seq2seq.trained.default_step``),
loads the tokenizers and parameters, checks that an ensemble's members agree, and applies the
command line's decoding changes; ``Opened.translator`` places it on a mesh (``partitioner_for``)
under the source-length rules. An ensemble is one model here: an ``EnsembleDef`` and the tuple
of its members' parameters (``seq2seq.decoding``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from seq2seq import evaluation, trained, translation
from seq2seq.config import Config, DecodeConfig, MeshConfig, check_position_limits, replace
from seq2seq.data.pipeline import MIN_DECODE_SOURCE_LEN, decode_source_limit
from seq2seq.data.tokenizer import TokenizerPair
from seq2seq.decoding import ensemble_size
from seq2seq.search import Strategy, strategy
from seq2seq.sharding import MeshError, Partitioner

log = logging.getLogger(__name__)

Member = tuple[str | Path, int | None]  # (run directory, checkpoint step or None: its default)


def members(workdirs: Sequence[str | Path], steps: Sequence[int] | None = None) -> list[Member]:
    """The ``(workdir, step)`` of each model: one per workdir (at its step, one per workdir, or
    its default), or one per step of a single workdir.

    Raises:
      ValueError: several workdirs with a different number of steps.
    """
    steps = list(steps or [])
    if not steps:
        return [(w, None) for w in workdirs]
    if len(workdirs) == 1:
        return [(workdirs[0], s) for s in steps]
    if len(steps) != len(workdirs):
        raise ValueError(
            f"{len(workdirs)} --workdir but {len(steps)} --step: give one --step per "
            "--workdir, none (each run's default checkpoint), or several with one --workdir"
        )
    return list(zip(workdirs, steps))


def partitioner_for(config: Config) -> Partitioner:
    """The run's mesh on this machine's devices, or data parallel over them when the run's
    mesh does not fit here (e.g. trained with ``mesh.fsdp=8``, translated on one CPU)."""
    try:
        return Partitioner.from_config(config)
    except MeshError as e:
        log.info("%s; decoding data parallel on this machine", e)
        return Partitioner.from_config(replace(config, mesh=MeshConfig()))


@dataclasses.dataclass(frozen=True)
class Opened:
    """A trained model ready for inference.

    Attributes:
      configs: each member's run config (one for a single model).
      tokenizer: the SentencePiece model(s) (the first member's; the members share them).
      graphdef: the model's ``nnx`` graphdef, or an ``EnsembleDef``.
      params: its parameters (the EMA when the run kept one), or the members' tuple.
      decode: the decoding config: the run's with the requested changes.
    """

    configs: tuple[Config, ...]
    tokenizer: TokenizerPair
    graphdef: Any
    params: Any
    decode: DecodeConfig

    @property
    def config(self) -> Config:
        """The first member's config (its data, tokenizer and mesh serve the ensemble)."""
        return self.configs[0]

    @property
    def strategy(self) -> Strategy:
        """The search ``decode.search`` names, with its options (``seq2seq.search``)."""
        return strategy(self.decode)

    @property
    def models(self) -> int:
        """Models behind it: 1, or an ensemble's members."""
        return ensemble_size(self.graphdef)

    def translator(
        self,
        *,
        max_src_tokens: int | None = None,
        on_long: str = "truncate",
        partitioner: Partitioner | None = None,
    ) -> translation.Translator:
        """A ``Translator`` of the model on ``partitioner`` (default: ``partitioner_for(config)``).

        Args:
          max_src_tokens: source limit in tokens, EOS included (default
            ``decode_source_limit``: max(data.max_len, 256), capped by a learned table).
          on_long: ``truncate`` or ``reject`` longer sources.

        Raises:
          ValueError: a member's learned position table is shorter than the lengths decoded.
        """
        for member in self.configs:
            if max_src_tokens:
                check_position_limits(
                    replace(member, decode=self.decode), max_src_tokens, "--max-src-tokens"
                )
            else:
                check_position_limits(
                    replace(member, decode=self.decode),
                    max(self.config.data.max_len, MIN_DECODE_SOURCE_LEN),
                    f"the default --max-src-tokens max(data.max_len, "
                    f"{MIN_DECODE_SOURCE_LEN}) up to model.max_len",
                    capped=True,
                )
        return translation.Translator(
            self.graphdef,
            self.params,
            self.tokenizer,
            self.decode,
            max_src_len=max_src_tokens or decode_source_limit(self.config),
            on_long=on_long,
            partitioner=partitioner or partitioner_for(self.config),
        )

    def decoding(self, **options: Any) -> evaluation.Decoding:
        """The model as ``evaluation.evaluate`` decodes a system: its config, a ``translator``
        (``options``: ``translator``'s) and its search as reports name it."""
        return evaluation.Decoding(
            self.config, self.translator(**options), self.strategy.describe()
        )


def open_run(
    chosen: Sequence[Member],
    *,
    decode_changes: Mapping[str, Any] | None = None,
    matmul_dtype: str | None = None,
) -> Opened:
    """Load one model, or an ensemble of several, for inference.

    Args:
      chosen: ``(workdir, step)`` of each member (``members``); step None is the run's
        default checkpoint (the one its test score used).
      decode_changes: ``decode.*`` values that replace the run's (e.g. ``{"beam_size": 8}``).
      matmul_dtype: ``model.matmul_dtype`` to decode with (``seq2seq.trained.load_trained``).

    Returns:
      the ``Opened`` model.

    Raises:
      FileNotFoundError, CheckpointError: a member is not a run or has no usable checkpoint.
      ValueError: an ensemble's members differ in vocabulary or decoding config.
    """
    changes = dict(decode_changes or {})
    if len(chosen) == 1:
        config, tokenizer, graphdef, params = trained.load_trained(
            *chosen[0], matmul_dtype=matmul_dtype
        )
        configs = [config]
    else:
        configs, tokenizer, graphdef, params = trained.load_ensemble(
            chosen, matmul_dtype=matmul_dtype
        )
        trained.check_same_decode(chosen, [replace(c.decode, **changes) for c in configs])
    decode = replace(configs[0].decode, **changes)
    return Opened(tuple(configs), tokenizer, graphdef, params, decode)


def decoder(
    workdir: str | Path,
    step: int | None = None,
    *,
    decode_changes: Mapping[str, Any] | None = None,
    name: str | None = None,
) -> evaluation.Decoder:
    """The run ``workdir`` at ``step`` (None: its default checkpoint) as a system of
    ``evaluation.evaluate``, opened (``open_run``) when its turn comes and named ``name``
    (default ``DIR`` or ``DIR@STEP``, as ``seq2seq-evaluate`` names it).

    ``decoder("runs/x", decode_changes={"search": "mbr"})`` is ``seq2seq-evaluate --workdir
    runs/x --search mbr`` without the files: ``evaluate(refs, sources=src, decoders=[...])``.
    """
    label = name or (str(workdir) if step is None else f"{workdir}@{step}")
    return evaluation.Decoder(
        label, lambda: open_run([(workdir, step)], decode_changes=decode_changes).decoding()
    )
