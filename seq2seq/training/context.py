"""A training run's context, built once from its resolved config and its mesh
(``train_context``).

What ``seq2seq-train`` compiles and what ``seq2seq-plan`` compiles ahead of time for a device
it does not have are the same object: the model's graph, the abstract ``TrainState`` and its
shardings, the optimizer, the ``train.init_from`` parent, and the step jitted over the mesh
with the run's donation, row axis, micro-batch count and schedule horizon
(``sharded_train_step``). The loop, the restore, the init from a parent and the test decode's
checkpoint restore read them from here; none is built twice in a run. Nothing here touches
data or allocates a parameter: the batch shape comes from the config (``batch_rows``), and the
partitioner's mesh may hold compile-only devices (``jax.experimental.topologies``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import optax
from flax import nnx

from seq2seq.config import Config
from seq2seq.data.batching import FIELDS, batch_rows
from seq2seq.data.tokenizer import BOS_ID
from seq2seq.sharding import Partitioner
from seq2seq.training.init_from import Parent
from seq2seq.training.step import (
    TrainSpec,
    TrainState,
    build_train_model,
    create_train_state,
    sharded_train_step,
    train_spec,
)


@dataclasses.dataclass(frozen=True)
class TrainContext:
    """A run's compiled-step ingredients (``train_context``).

    Attributes:
      config: the resolved config.
      partitioner: the mesh and its sharding rules.
      graphdef: the model's static graph.
      abstract: the ``TrainState`` as ``jax.ShapeDtypeStruct`` leaves (nothing allocated).
      shardings: its ``NamedSharding`` per leaf (``Partitioner.shardings``).
      tx: the optimizer (``make_optimizer``).
      step: ``(state, batch[, horizon]) → (state, metrics)`` jitted over the mesh, the state
        donated; ``horizon`` (int32 scalar) only with ``train.time_budget``.
      parent: the run ``train.init_from`` names (``resolve_parent``), or None.
    """

    config: Config
    partitioner: Partitioner
    graphdef: nnx.GraphDef
    abstract: TrainState
    shardings: TrainState
    tx: optax.GradientTransformation
    step: Callable[..., tuple[TrainState, dict[str, jax.Array]]]
    parent: Parent | None = None

    @property
    def spec(self) -> TrainSpec:
        """The graph, abstract state and optimizer (what ``train_spec`` builds)."""
        return TrainSpec(self.graphdef, self.abstract, self.tx)

    @property
    def runtime_horizon(self) -> bool:
        """Whether the step takes the schedule's horizon as a third argument."""
        return bool(self.config.train.time_budget)

    def batch_shape(self) -> tuple[int, int, int]:
        """``(micro-batches, rows, length)`` of one step's global batch."""
        d = self.config.data
        return self.config.train.grad_accum_steps, batch_rows(d), d.max_len

    def abstract_args(self) -> tuple[Any, ...]:
        """The step's arguments as ``jax.ShapeDtypeStruct`` with their shardings: the state,
        the int32 ``[accum, rows, length]`` batch of ``seq2seq.data.batching.FIELDS`` (rows
        split over ``data × fsdp``) and, with ``train.time_budget``, the horizon."""
        p = self.partitioner
        rows = p.rows_sharding(1)
        batch = {
            k: jax.ShapeDtypeStruct(self.batch_shape(), np.int32, sharding=rows) for k in FIELDS
        }
        horizon = jax.ShapeDtypeStruct((), np.int32, sharding=p.replicated)
        return (p.abstract(self.abstract), batch, *((horizon,) if self.runtime_horizon else ()))

    def lower(self) -> Any:
        """The step lowered for the mesh's devices (``jax.stages.Lowered``; ``.compile()``
        compiles it, for a compile-only target too)."""
        return self.step.lower(*self.abstract_args())  # type: ignore[attr-defined]

    def fresh_state(self) -> TrainState:
        """A new run's ``TrainState``: the model (with its LoRA adapters) initialised from
        ``train.seed``, the optimizer's state and, with ``train.ema_decay``, the EMA; each
        device creates only its shards (``Partitioner.init_state``)."""
        t = self.config.train

        def init() -> TrainState:
            model = build_train_model(self.config)
            return create_train_state(model, self.tx, t.seed, ema=t.ema_decay > 0)[1]

        return self.partitioner.init_state(init, self.abstract)


def train_context(
    config: Config,
    partitioner: Partitioner,
    *,
    bos_id: int = BOS_ID,
    spec: TrainSpec | None = None,
    parent: Parent | None = None,
) -> TrainContext:
    """The train step of ``config`` over ``partitioner``'s mesh, as the training loop runs it.

    ``bos_id``: the target tokenizer's BOS id (``shift_right``; every SentencePiece model
    trained here has ``BOS_ID``). ``spec``: the run's graph, abstract state and optimizer when
    already built (``seq2seq.resolve.Resolved.spec``; default: built here). ``parent``: the
    resolved ``train.init_from`` run.

    Raises:
      ValueError: as ``train_spec`` (a model that cannot be built).
    """
    t = config.train
    graphdef, abstract, tx = spec if spec is not None else train_spec(config)
    shardings = partitioner.shardings(abstract)
    # micro-batches [accum, rows, length]: rows (axis 1) are split over data × fsdp
    step = sharded_train_step(
        partitioner,
        shardings,
        graphdef,
        tx,
        bos_id=bos_id,
        label_smoothing=t.label_smoothing,
        row_axis=1,
        ema_decay=t.ema_decay,
        runtime_horizon=bool(t.time_budget),
        lora=t.lora_rank > 0,
    )
    return TrainContext(config, partitioner, graphdef, abstract, shardings, tx, step, parent)
