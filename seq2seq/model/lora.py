"""Low-rank adaptation of the projections (LoRA; Hu et al. 2021, "LoRA: Low-Rank Adaptation of
Large Language Models").

A target projection ``y = x·W + b`` (``W`` ``[in, out]``, frozen) becomes
``y = x·W + b + (α / r)·(x·A)·B`` with ``A`` ``[in, r]`` and ``B`` ``[r, out]`` trained (Hu et
al., eq. 3 and §4.1, written for our ``[in, out]`` kernels; ``W`` frozen). ``A`` and ``B`` are
Flax NNX's ``nnx.LoRA`` (``nnx.LoRAParam`` variables, a subclass of ``nnx.Param``): ``A``
He-uniform, ``B`` zeros, so an adapted model starts as the model it adapts. ``merge_lora``
folds ``W ← W + (α / r)·A·B`` and drops the adapters: the result is the plain model, with the
parameter tree of a model that never had them.

Every projection of the model is a ``Projection`` (an ``nnx.Linear`` with an optional
adapter), so adding or merging adapters changes no path of the base parameters
(``encoder_layers.0.self_attention.query.kernel`` stays; its adapter is
``...query.lora.lora_a`` / ``lora_b``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

# The projections an adapter may target: the attention's four (every self- and cross-
# attention) and the FFN's (``wi_gate`` exists with the gated activations only).
ATTENTION = ("query", "key", "value", "out")
FFN = ("wi", "wi_gate", "wo")
GROUPS = {"attention": ATTENTION, "ffn": FFN}
TARGETS = (*GROUPS, *ATTENTION, *FFN)  # the values of ``train.lora_targets``


def expand_targets(targets: Iterable[str]) -> tuple[str, ...]:
    """Projection names of ``targets`` (``attention`` / ``ffn`` stand for their projections),
    in ``ATTENTION + FFN`` order.

    Raises:
      ValueError: an unknown name.
    """
    names: set[str] = set()
    for t in targets:
        if t not in TARGETS:
            raise ValueError(f"unknown LoRA target {t!r}; choose from {', '.join(TARGETS)}")
        names.update(GROUPS.get(t, (t,)))
    return tuple(n for n in (*ATTENTION, *FFN) if n in names)


class Projection(nnx.Linear):
    """``nnx.Linear`` with an optional low-rank adapter ``lora`` (an ``nnx.LoRA`` without a
    base module) scaled by ``lora_scale`` = α / r: ``x·W + b + lora_scale·(x·A)·B``.

    Without an adapter (``lora`` None, how every model is built) it is ``nnx.Linear``, with the
    same parameters.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.lora: nnx.LoRA | None = nnx.data(None)  # a child module when set
        self.lora_scale = 1.0

    def __call__(self, x: jax.Array, out_sharding: Any = None) -> jax.Array:
        y = super().__call__(x, out_sharding=out_sharding)
        if self.lora is None:
            return y
        return y + (self.lora_scale * self.lora(x)).astype(y.dtype)


def _projections(model: nnx.Module) -> Iterator[tuple[tuple, Projection]]:
    for path, module in nnx.iter_modules(model):
        if isinstance(module, Projection):
            yield path, module


def add_lora(
    model: nnx.Module, *, rank: int, alpha: float, targets: Iterable[str], seed: int | jax.Array
) -> nnx.Module:
    """Give every ``Projection`` of ``model`` named in ``targets`` (``expand_targets``) a
    rank-``rank`` adapter scaled by ``alpha / rank``; returns ``model`` (changed in place).

    ``A`` and ``B`` carry the logical axes of the kernel's input and output dimension
    (``A`` ``(in_axis, None)``, ``B`` ``(None, out_axis)``), so the mesh places them like
    the kernel they adapt. Their keys come from ``seed`` (an int or a PRNG key:
    ``nnx.Rngs(params=seed)``), drawn in the model's module order.

    Raises:
      ValueError: ``rank`` < 1, an unknown target, or a target the model does not have (e.g.
        ``wi_gate`` without a gated activation).
    """
    if rank < 1:
        raise ValueError(f"LoRA rank must be >= 1, got {rank}")
    names = expand_targets(targets)
    rngs = nnx.Rngs(params=seed)
    found: set[str] = set()
    for path, proj in _projections(model):
        name = str(path[-1])
        if name not in names:
            continue
        found.add(name)
        axes = proj.kernel.get_metadata().get("out_sharding") or (None, None)
        meta = dict(eager_sharding=False)
        proj.lora = nnx.data(
            nnx.LoRA(
                proj.in_features,
                rank,
                proj.out_features,
                dtype=proj.dtype,
                rngs=rngs,
                a_metadata=dict(meta, out_sharding=(axes[0], None)),
                b_metadata=dict(meta, out_sharding=(None, axes[1])),
            )
        )
        proj.lora_scale = float(alpha) / rank
    explicit = [t for t in targets if t not in GROUPS]
    missing = [t for t in explicit if t not in found]
    if missing or not found:
        raise ValueError(
            f"the model has no projection named {', '.join(missing or names)} "
            "(wi_gate exists with the gated activations swiglu/geglu only)"
        )
    return model


def has_lora(model: nnx.Module) -> bool:
    """Whether any projection of ``model`` has an adapter."""
    return any(p.lora is not None for _, p in _projections(model))


def merge_lora(model: nnx.Module) -> nnx.Module:
    """Fold every adapter into its kernel, ``W ← W + (α / r)·A·B`` (float32, highest matmul
    precision), and drop it; returns ``model`` (changed in place), now a plain model."""
    for _, proj in _projections(model):
        if proj.lora is None:
            continue
        a = proj.lora.lora_a[...].astype(jnp.float32)
        b = proj.lora.lora_b[...].astype(jnp.float32)
        delta = proj.lora_scale * jnp.matmul(a, b, precision=jax.lax.Precision.HIGHEST)
        kernel = proj.kernel[...]
        proj.kernel.set_value((kernel.astype(jnp.float32) + delta).astype(kernel.dtype))
        proj.lora = nnx.data(None)
        proj.lora_scale = 1.0
    return model


def merged(graphdef: nnx.GraphDef, params: Any) -> tuple[nnx.GraphDef, Any]:
    """``(graphdef, params)`` of a model with adapters as the plain model's (``merge_lora``);
    a model without adapters comes back as it is. Pure (``params`` is not changed): may run
    under ``jax.jit``."""
    model = nnx.merge(graphdef, params, copy=True)
    if not has_lora(model):
        return graphdef, params
    return nnx.split(merge_lora(model), nnx.Param)
