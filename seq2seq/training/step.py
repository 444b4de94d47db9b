"""Pure train and eval steps: (state, batch) → (state, metrics).

``make_train_step`` and ``make_eval_step`` bind the configuration (graph definition, optimizer,
special ids, label smoothing) by closure and return plain functions of arrays (Flax WMT style);
the caller compiles them once, with ``jax.jit`` or over a mesh with ``Partitioner.jit``.
Dropout keys
are ``fold_in(fold_in(state.rng, step), micro_batch)``: a resumed run draws exactly the
randomness it would have. A step may accumulate gradients over several micro-batches
(``jax.lax.scan``), normalising once by their total number of real target tokens.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from seq2seq.config import Config, TrainConfig, choices
from seq2seq.model import build_model
from seq2seq.model.lora import add_lora, has_lora
from seq2seq.sharding import Partitioner

Metrics = dict[str, jax.Array]
Batch = dict[str, jax.Array]


@flax.struct.dataclass
class TrainState:
    """Everything that changes during training (a pytree; checkpointed as is).

    Attributes:
      step: int32 scalar, optimizer steps taken.
      params: the model's ``nnx.Param`` state (float32).
      opt_state: optax state for ``params``.
      rng: base PRNG key; the dropout key of step k is ``fold_in(rng, k)``.
      skipped: int32 scalar, consecutive steps skipped for a non-finite loss or gradient.
      ema: the exponential moving average of ``params`` (same structure, float32) when
        ``train.ema_decay`` > 0, else None (no leaves: checkpoints without EMA are unchanged).
    """

    step: jax.Array
    params: Any
    opt_state: Any
    rng: jax.Array
    skipped: jax.Array
    ema: Any = None

    @property
    def eval_params(self) -> Any:
        """The weights to evaluate and decode: the EMA when it is kept, else ``params``."""
        return self.params if self.ema is None else self.ema


SCHEDULES = choices("train.schedule")  # from the schema (seq2seq/config.py)


def learning_rate_schedule(config: TrainConfig, horizon: Any = None) -> optax.Schedule:
    """Linear warmup to ``learning_rate``, then the decay ``train.schedule`` names.

    For optimizer step n = count + 1 (optax counts the updates already made from 0, so step 1
    trains at peak / warmup, not at 0), with W = ``warmup_steps`` and T = the horizon
    (``horizon``: an int or an int32 scalar array, e.g. the step count ``train.time_budget``
    chose at run time; None: ``steps``):

    * ``rsqrt``: peak · min(n / W, sqrt(W / n)) — Vaswani et al. 2017, eq. 3, with the peak
      set directly instead of through d_model^-0.5;
    * ``linear``: peak · min(n / W, (T - n + 1) / (T - W + 1)), clipped at 0 — a linear decay
      that reaches peak / (T - W + 1) at the last step and 0 after it (the "linear decay to
      zero" of fairseq's ``polynomial_decay`` and of BERT).
    """
    return functools.partial(_learning_rate, config, horizon=horizon)


def _learning_rate(config: TrainConfig, count: Any, horizon: Any = None) -> jax.Array:
    """The rate of ``learning_rate_schedule`` after ``count`` updates (float32 scalar)."""
    warmup = max(config.warmup_steps, 1)
    peak = config.learning_rate
    n = jnp.asarray(count, jnp.float32) + 1.0
    if config.schedule == "linear":
        if horizon is None:
            total: Any = max(config.steps, warmup)
        else:
            total = jnp.maximum(jnp.asarray(horizon, jnp.float32), float(warmup))
        decay = jnp.clip((total - n + 1.0) / (total - warmup + 1.0), 0.0, 1.0)
    else:
        decay = jnp.sqrt(warmup / n)
    return peak * jnp.minimum(n / warmup, decay)


def scale_by_schedule(config: TrainConfig) -> optax.GradientTransformationExtraArgs:
    """``optax.scale_by_learning_rate(learning_rate_schedule(config))`` whose horizon may be
    given at run time: ``update(..., horizon=T)`` (an int32 scalar, traced, so a compiled
    step serves every horizon); without it, ``train.steps``. Its state is optax's
    ``ScaleByScheduleState`` (the update count), so optimizer states are unchanged."""

    def init_fn(params: Any) -> optax.ScaleByScheduleState:
        del params
        return optax.ScaleByScheduleState(count=jnp.zeros([], jnp.int32))

    def update_fn(updates, state, params=None, *, horizon=None, **extra):
        del params, extra
        step_size = -1 * _learning_rate(config, state.count, horizon)
        updates = jax.tree.map(lambda g: jnp.array(step_size, dtype=g.dtype) * g, updates)
        return updates, optax.ScaleByScheduleState(count=optax.safe_increment(state.count))

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def _decay_mask(params: Any) -> Any:
    # Weight decay on matrices only: no decay on biases and LayerNorm scales (ndim 1).
    return jax.tree.map(lambda p: p.ndim > 1, params)


def make_optimizer(config: TrainConfig) -> optax.GradientTransformationExtraArgs:
    """AdamW (Loshchilov & Hutter 2019) with the schedule above and global-norm clipping.

    ``optax.adamw``'s own chain (Adam scaling, decoupled weight decay on matrices, the
    learning rate) with the rate from ``scale_by_schedule``, so that ``update`` takes the
    schedule's horizon as ``horizon=`` (see there); the state is ``optax.adamw``'s.
    """
    parts = []
    if config.clip_norm > 0:
        parts.append(optax.clip_by_global_norm(config.clip_norm))
    parts.append(
        optax.chain(
            optax.scale_by_adam(b1=config.b1, b2=config.b2, eps=config.eps),
            optax.add_decayed_weights(config.weight_decay, _decay_mask),
            scale_by_schedule(config),
        )
    )
    return optax.chain(*parts)


def build_train_model(config: Config) -> nnx.Module:
    """The model a run trains: ``build_model(config.model, train.seed)``, and with
    ``train.lora_rank`` its adapters (``seq2seq.model.lora.add_lora``; their keys from
    ``train.seed`` too, drawn apart from the model's)."""
    t = config.train
    model = build_model(config.model, t.seed)
    if t.lora_rank:
        add_lora(
            model,
            rank=t.lora_rank,
            alpha=t.lora_alpha,
            targets=t.lora_targets,
            seed=jax.random.fold_in(jax.random.key(t.seed), 1),
        )
    return model


def split_trainable(params: Any, lora: bool) -> tuple[Any, Any]:
    """``(trainable, frozen)`` parts of a model's ``nnx.Param`` state: with ``lora`` the
    adapters (``nnx.LoRAParam``) and everything else, else ``(params, None)``."""
    if not lora:
        return params, None
    adapters, frozen = nnx.split_state(params, nnx.LoRAParam, ...)
    return adapters, frozen


def base_params(params: Any) -> Any:
    """A model's ``nnx.Param`` state without its LoRA adapters (all of it when it has none)."""
    return nnx.split_state(params, nnx.LoRAParam, ...)[1]


def join_trainable(trainable: Any, frozen: Any) -> Any:
    """The inverse of ``split_trainable``: the whole state, with the structure it had."""
    return trainable if frozen is None else nnx.merge_state(frozen, trainable)


def create_train_state(
    model: nnx.Module, tx: optax.GradientTransformation, seed: int, *, ema: bool = False
) -> tuple[nnx.GraphDef, TrainState]:
    """Split a model into its static graph and a fresh ``TrainState`` (``ema``: keep an EMA
    of the weights, starting at the initial weights). A model with LoRA adapters
    (``seq2seq.model.lora``) trains only them: the optimizer state covers the adapters alone,
    so no Adam moments exist for the frozen weights."""
    graphdef, params = nnx.split(model, nnx.Param)
    trainable, _ = split_trainable(params, has_lora(model))
    state = TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=tx.init(trainable),
        rng=jax.random.key_data(jax.random.key(seed)),
        skipped=jnp.zeros((), jnp.int32),
        ema=jax.tree.map(jnp.copy, params) if ema else None,
    )
    return graphdef, state


def ema_update(ema: Any, params: Any, decay: float) -> Any:
    """One EMA step: ``decay · ema + (1 - decay) · params`` per leaf, in float32."""
    return jax.tree.map(lambda e, p: decay * e + (1.0 - decay) * p, ema, params)


def abstract_train_state(
    config: Config, tx: optax.GradientTransformation | None = None
) -> tuple[nnx.GraphDef, TrainState]:
    """``(graphdef, TrainState of jax.ShapeDtypeStruct)`` for ``config``, allocating nothing.

    The target structure for a checkpoint restore and for the mesh's shardings. ``tx``: the
    run's optimizer (default: ``make_optimizer(config.train)``).
    """
    holder = {}
    optimizer = make_optimizer(config.train) if tx is None else tx

    def init():
        model = build_train_model(config)
        graphdef, state = create_train_state(
            model, optimizer, config.train.seed, ema=config.train.ema_decay > 0
        )
        holder["graphdef"] = graphdef
        return state

    state = jax.eval_shape(init)
    return holder["graphdef"], state


class TrainSpec(NamedTuple):
    """What a training run builds once from its resolved config (``train_spec``), allocating
    nothing: the check of the model at resolve time, the restore target, the shardings and
    the train step all use these.

    Attributes:
      graphdef: the model's static graph.
      abstract: the ``TrainState`` with ``jax.ShapeDtypeStruct`` leaves.
      tx: the optimizer (``make_optimizer``).
    """

    graphdef: nnx.GraphDef
    abstract: TrainState
    tx: optax.GradientTransformation


def train_spec(config: Config) -> TrainSpec:
    """The ``TrainSpec`` of ``config``.

    Raises:
      ValueError: as ``build_model`` (a model that cannot be built).
    """
    tx = make_optimizer(config.train)
    return TrainSpec(*abstract_train_state(config, tx), tx)


@dataclasses.dataclass(frozen=True)
class TrainedSize:
    """What a run trains and what its optimizer holds (``train_size``).

    Attributes:
      parameters: every parameter of the model (adapters included).
      trainable: the parameters the optimizer updates (the adapters alone with LoRA).
      moment_bytes: bytes of the Adam moments (first and second, float32: 8 per trainable
        parameter), the optimizer state without its scalar counts.
    """

    parameters: int
    trainable: int
    moment_bytes: int


def train_size(state: TrainState) -> TrainedSize:
    """``TrainedSize`` of a (real or abstract) ``TrainState``."""
    lora = any(isinstance(v, nnx.LoRAParam) for v in jax.tree.leaves(state.params, is_leaf=_is_var))
    trainable, _ = split_trainable(state.params, lora)
    return TrainedSize(
        parameters=sum(x.size for x in jax.tree.leaves(state.params)),
        trainable=sum(x.size for x in jax.tree.leaves(trainable)),
        moment_bytes=sum(
            x.size * x.dtype.itemsize for x in jax.tree.leaves(state.opt_state) if x.ndim
        ),
    )


def _is_var(x: Any) -> bool:
    return isinstance(x, nnx.Variable)


def cross_entropy(
    logits: jax.Array, targets: jax.Array, weights: jax.Array, label_smoothing: float = 0.0
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Label-smoothed cross-entropy summed over weighted tokens, in float32.

    With smoothing ε the target distribution is (1-ε)·onehot + ε/V (Szegedy et al. 2016, §7;
    Vaswani et al. 2017, §5.4), so the loss is (1-ε)·NLL + ε·mean_v(-log p_v). Per token,
    with lse = log Σ_v exp(z_v): NLL = lse - z_target and mean_v(-log p_v) = lse - mean_v(z_v),
    so the forward pass reads the logits without writing a ``[batch, length, vocab]`` array of
    log-probabilities. The gradient is the closed form w·(softmax(z) - (1-ε)·onehot - ε/V)
    (and w·(softmax(z) - onehot) for the NLL), one fused pass over the logits instead of
    autodiff's several (``_cross_entropy_bwd``).

    Args:
      logits: ``[batch, length, vocab]`` (any float dtype; computed in float32).
      targets: int ``[batch, length]``.
      weights: ``[batch, length]``, 1 for real tokens and 0 for padding (not differentiated).
      label_smoothing: ε in [0, 1), a Python float (static).

    Returns:
      (smoothed loss sum, NLL sum, number of correct predictions), float32 scalars summed
      over tokens with nonzero weight. A prediction is correct when the target's logit is the
      largest (a tie with another token counts as correct; ties of float logits are rare).
    """
    return _cross_entropy(logits, targets, weights, float(label_smoothing))


def _cross_entropy_parts(logits, targets, weights, label_smoothing):
    z = logits.astype(jnp.float32)
    m = jax.lax.stop_gradient(jnp.max(z, axis=-1))
    lse = m + jnp.log(jnp.sum(jnp.exp(z - m[..., None]), axis=-1))
    z_target = jnp.take_along_axis(z, targets[..., None], axis=-1)[..., 0]
    nll = lse - z_target
    smooth = lse - jnp.mean(z, axis=-1)
    loss = (1.0 - label_smoothing) * nll + label_smoothing * smooth
    correct = (z_target >= m).astype(jnp.float32)
    w = weights.astype(jnp.float32)
    return (jnp.sum(loss * w), jnp.sum(nll * w), jnp.sum(correct * w)), lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _cross_entropy(logits, targets, weights, label_smoothing):
    return _cross_entropy_parts(logits, targets, weights, label_smoothing)[0]


def _cross_entropy_fwd(logits, targets, weights, label_smoothing):
    out, lse = _cross_entropy_parts(logits, targets, weights, label_smoothing)
    return out, (logits, targets, weights, lse)


def _cross_entropy_bwd(label_smoothing, residuals, cotangents):
    logits, targets, weights, lse = residuals
    g_loss, g_nll, _ = cotangents  # ``correct`` is piecewise constant: no gradient
    probs = jnp.exp(logits.astype(jnp.float32) - lse[..., None])
    onehot = jnp.arange(logits.shape[-1]) == targets[..., None]
    vocab = logits.shape[-1]
    # d loss/dz = p - (1-ε)·onehot - ε/V ; d nll/dz = p - onehot
    grad = (
        (g_loss + g_nll) * probs
        - jnp.where(onehot, (1.0 - label_smoothing) * g_loss + g_nll, 0.0)
        - label_smoothing / vocab * g_loss
    )
    grad = grad * weights.astype(jnp.float32)[..., None]
    return grad.astype(logits.dtype), None, None


_cross_entropy.defvjp(_cross_entropy_fwd, _cross_entropy_bwd)


def _forward(params, graphdef, batch, bos_id, label_smoothing, dropout_key, frozen=None):
    """Summed loss of one ``[rows, len]`` batch and its metric sums (the value to differentiate;
    ``frozen``: the parameters not differentiated, see ``split_trainable``)."""
    model = nnx.merge(graphdef, params) if frozen is None else nnx.merge(graphdef, params, frozen)
    rngs = None if dropout_key is None else nnx.Rngs(dropout=dropout_key)
    logits = model(batch, bos_id=bos_id, deterministic=rngs is None, rngs=rngs)
    weights = batch["tgt_segments"] > 0
    loss, nll, correct = cross_entropy(logits, batch["tgt"], weights, label_smoothing)
    tokens = jnp.sum(weights.astype(jnp.float32))
    return loss, dict(loss=loss, nll=nll, correct=correct, tokens=tokens)


def accumulate_gradients(
    params: Any,
    batch: dict[str, jax.Array],
    dropout_key: jax.Array,
    *,
    graphdef: nnx.GraphDef,
    bos_id: int,
    label_smoothing: float,
    frozen: Any = None,
) -> tuple[Any, Metrics]:
    """Gradient of the per-token loss over all micro-batches of ``batch``.

    The micro-batches are visited with ``jax.lax.scan`` (one at a time in memory); the gradients
    of their *summed* losses are added and divided once by the total number of real target
    tokens, so k micro-batches give the gradient of one batch made of their concatenation.

    Args:
      params: the model's ``nnx.Param`` state.
      batch: int32 arrays ``[accum, rows, max_len]`` (see ``seq2seq.data.batching``).
      dropout_key: typed PRNG key of this step; micro-batch i uses ``fold_in(key, i)``.
      graphdef, bos_id, label_smoothing: static configuration.
      frozen: the rest of the model's parameters when ``params`` is only its trainable part
        (``split_trainable``): used, not differentiated.

    Returns:
      (gradient, float32 metric sums ``loss``, ``nll``, ``correct``, ``tokens`` over all
      micro-batches). The gradient is float32 like ``params``.
    """
    accum = batch["tgt"].shape[0]
    grad_fn = jax.grad(_forward, has_aux=True)

    def body(carry, xs):
        grad_sum, sums = carry
        index, micro = xs
        grads, metrics = grad_fn(
            params,
            graphdef,
            micro,
            bos_id,
            label_smoothing,
            jax.random.fold_in(dropout_key, index),
            frozen,
        )
        return (jax.tree.map(jnp.add, grad_sum, grads), jax.tree.map(jnp.add, sums, metrics)), None

    zeros = jax.tree.map(jnp.zeros_like, params)
    sums0 = {k: jnp.zeros((), jnp.float32) for k in ("loss", "nll", "correct", "tokens")}
    (grad_sum, sums), _ = jax.lax.scan(body, (zeros, sums0), (jnp.arange(accum), batch))
    scale = 1.0 / jnp.maximum(sums["tokens"], 1.0)
    return jax.tree.map(lambda g: g * scale, grad_sum), sums


def make_train_step(
    graphdef: nnx.GraphDef,
    tx: optax.GradientTransformation,
    *,
    bos_id: int,
    label_smoothing: float,
    param_layout: Any = None,
    ema_decay: float = 0.0,
    lora: bool = False,
) -> Callable[[TrainState, Batch], tuple[TrainState, Metrics]]:
    """The optimizer step (teacher forcing, loss averaged over the real target tokens).

    Returns ``train_step(state, batch) → (state, metrics)``, a plain function to compile with
    ``jax.jit(train_step, donate_argnums=0)`` or ``Partitioner.jit``.

    ``batch`` may hold several micro-batches (gradient accumulation, see
    ``accumulate_gradients``): the step then equals one step on their concatenation.

    A step whose loss or gradient norm is not finite leaves parameters and optimizer state
    unchanged and increments ``state.skipped`` (reset to 0 by the next good step); ``step``
    advances either way.

    Args:
      graphdef, tx, bos_id, label_smoothing: the model's graph, the optimizer, BOS id (for
        shift_right) and label smoothing ε.
      param_layout: shardings of the parameters while the step computes
        (``Partitioner.compute_layout``, e.g. gathered over ``fsdp``); None: as they come.
      ema_decay: when ``state.ema`` is kept, it becomes ``ema_update(ema, new params,
        ema_decay)`` after a good step (a skipped step leaves it unchanged).
      lora: the model has LoRA adapters and ``state.opt_state`` covers only them: the
        gradient, its norm and clipping, and the update are those of the adapters; the
        other parameters are read, never differentiated nor changed.

    The returned function takes ``state``, int32 arrays ``batch`` ``[rows, max_len]`` (one
    batch) or ``[accum, rows, max_len]`` (``accum`` micro-batches, see
    ``seq2seq.data.batching``) and optionally ``horizon``, the schedule's horizon (an int32
    scalar given to ``tx.update`` as ``horizon=``, see ``scale_by_schedule``), and returns
    the new state and float32 metrics: sums ``loss``, ``nll``, ``correct``, ``tokens`` over
    all micro-batches, ``grad_norm`` (global L2 norm of the per-token gradient, before
    clipping), ``skipped`` (1.0 if this step was skipped).
    """

    def train_step(
        state: TrainState, batch: Batch, horizon: Any = None
    ) -> tuple[TrainState, Metrics]:
        if param_layout is not None:
            state = dataclasses.replace(
                state, params=jax.lax.with_sharding_constraint(state.params, param_layout)
            )
        batch = {k: v[None] if v.ndim == 2 else v for k, v in batch.items()}
        dropout_key = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
        trainable, frozen = split_trainable(state.params, lora)
        grads, sums = accumulate_gradients(
            trainable,
            batch,
            dropout_key,
            graphdef=graphdef,
            bos_id=bos_id,
            label_smoothing=label_smoothing,
            frozen=frozen,
        )
        grad_norm = optax.tree_utils.tree_norm(grads)
        ok = jnp.isfinite(sums["loss"]) & jnp.isfinite(grad_norm)
        extra = {} if horizon is None else {"horizon": horizon}
        updates, new_opt_state = tx.update(grads, state.opt_state, trainable, **extra)
        new_params = join_trainable(optax.apply_updates(trainable, updates), frozen)
        keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(ok, a, b), new, old)
        new_state = dataclasses.replace(
            state,
            step=state.step + 1,
            params=keep(new_params, state.params),
            opt_state=keep(new_opt_state, state.opt_state),
            skipped=jnp.where(ok, 0, state.skipped + 1),
            ema=None
            if state.ema is None
            else keep(ema_update(state.ema, new_params, ema_decay), state.ema),
        )
        metrics = dict(sums, grad_norm=grad_norm, skipped=(~ok).astype(jnp.float32))
        return new_state, metrics

    return train_step


def make_eval_step(
    graphdef: nnx.GraphDef, *, bos_id: int, label_smoothing: float, param_layout: Any = None
) -> Callable[[Any, Batch], Metrics]:
    """``eval_step(params, batch) → metrics``: teacher-forced loss sums on one ``[rows, len]``
    batch without dropout (``loss``, ``nll``, ``correct``, ``tokens``, float32 scalars).
    Arguments as for ``make_train_step``."""

    def eval_step(params: Any, batch: Batch) -> Metrics:
        if param_layout is not None:
            params = jax.lax.with_sharding_constraint(params, param_layout)
        return _forward(params, graphdef, batch, bos_id, label_smoothing, None)[1]

    return eval_step


def sharded_train_step(
    partitioner: Partitioner,
    shardings: TrainState,
    graphdef: nnx.GraphDef,
    tx: optax.GradientTransformation,
    *,
    bos_id: int,
    label_smoothing: float,
    row_axis: int = 0,
    ema_decay: float = 0.0,
    runtime_horizon: bool = False,
    lora: bool = False,
) -> Callable[..., tuple[TrainState, Metrics]]:
    """``make_train_step`` compiled over ``partitioner``'s mesh, as the training loop runs it.

    The state comes in and goes out with ``shardings`` (``partitioner.shardings`` of the
    abstract state: one executable for every step, the optimizer state sharded like the
    parameters) and is donated; its parameters compute gathered over ``fsdp``; the batch's
    rows (axis ``row_axis``: 1 for micro-batches ``[accum, rows, length]``) are split over
    ``data × fsdp``; the metrics come out replicated. ``ema_decay``, ``lora``: see
    ``make_train_step``.
    ``runtime_horizon``: the step takes a third argument, the schedule's horizon (a replicated
    int32 scalar; one executable for every value).
    """
    train_step = make_train_step(
        graphdef,
        tx,
        bos_id=bos_id,
        label_smoothing=label_smoothing,
        param_layout=partitioner.compute_layout(shardings.params),
        ema_decay=ema_decay,
        lora=lora,
    )
    return partitioner.jit(
        train_step,
        shardings,
        row_axis=row_axis,
        donate=True,
        out_shardings=(shardings, partitioner.replicated),
        scalars=1 if runtime_horizon else 0,
    )
