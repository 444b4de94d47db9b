"""Logical axis names on parameters (mapped to mesh axes by the rules in ``seq2seq.sharding``).

Parameters carry names such as ``("embed", "mlp")`` instead of mesh axes, so the model never
depends on a mesh; placement is decided in one table elsewhere (t5x/MaxText style).
Names: ``vocab``, ``embed`` (d_model), ``heads`` (heads × head_dim in the projections; the
number of heads in the relative-position bias table), ``mlp`` (d_ff), ``positions`` (rows of a
learned absolute position table, ``model.max_len``), ``relpos_buckets`` (T5 relative-position
buckets). Position tables are small; replicating them is the natural rule.
"""

from __future__ import annotations

from flax import nnx


def logical(init, axes: tuple[str, ...]):
    """Wrap an initializer so its parameter records ``axes`` as its (logical) sharding names.

    Eager sharding is off: the names are metadata until the sharding rules resolve them.
    """
    return nnx.with_partitioning(init, axes, eager_sharding=False)
