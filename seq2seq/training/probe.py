"""The train step's speed, timed before a run with ``train.time_budget`` is resolved.

The recipe's step count, warmup and dropout (``seq2seq.data.recipe``) count the steps a run
makes; with a time budget that count depends on the machine (about 440 steps of the preset in
780 s on a 2-core CPU without bfloat16 units, 1,900 on one with AMX). ``step_seconds``
compiles the run's step on its mesh and times it on random batches of the run's shapes
(every step computes the whole ``[accum, rows, length]`` batch, so its time does not depend on
the tokens), so that the recipe can count the steps the budget buys before the config is
resolved, once; the end of the warmup corrects the schedule's horizon from the real steps
(``seq2seq.training.actions.time_budget``).
"""

from __future__ import annotations

import time

import jax
import numpy as np

from seq2seq.config import Config
from seq2seq.sharding import Partitioner
from seq2seq.training.context import train_context

PROBE_STEPS = 4  # timed after the first (compiled) step


def step_seconds(
    config: Config, partitioner: Partitioner, steps: int = PROBE_STEPS
) -> tuple[float, float]:
    """Seconds per train step of ``config`` over ``partitioner``'s mesh, the mean of ``steps``
    steps after the first, on one random batch (ids drawn from ``[4, vocab)``, one segment per
    row); and the seconds of the first step (its compilation). Nothing is written; the state
    is discarded.

    Raises:
      ValueError: as ``seq2seq.training.step.train_spec`` (a model that cannot be built).
    """
    context = train_context(config, partitioner)
    accum, rows, length = context.batch_shape()
    m = config.model
    vocab = min(v for v in (m.vocab_size, m.src_vocab_size) if v > 0)
    rng = np.random.default_rng(0)
    positions = np.broadcast_to(np.arange(length, dtype=np.int32), (accum, rows, length))
    batch: dict[str, np.ndarray] = {}
    for side in ("src", "tgt"):
        batch[side] = rng.integers(4, max(vocab, 5), (accum, rows, length), dtype=np.int32)
        batch[f"{side}_segments"] = np.ones((accum, rows, length), np.int32)
        batch[f"{side}_positions"] = positions.copy()
    sharded = partitioner.shard_batch(batch, 1)
    horizon = (
        (jax.device_put(np.int32(max(config.train.steps, 1)), partitioner.replicated),)
        if context.runtime_horizon
        else ()
    )
    state = context.fresh_state()
    t0 = time.perf_counter()
    state, metrics = context.step(state, sharded, *horizon)
    jax.block_until_ready(metrics)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(steps):
        state, metrics = context.step(state, sharded, *horizon)
    jax.block_until_ready(metrics)
    return (time.perf_counter() - t0) / max(steps, 1), first
