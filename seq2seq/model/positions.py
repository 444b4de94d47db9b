"""Position signals: five schemes, selected by ``model.positions``.

Two kinds of signal, each applied where it acts:

* added to the embeddings: ``sinusoidal`` (Vaswani et al. 2017, §3.5) and ``learned`` absolute
  (Gehring et al. 2017);
* inside self-attention: ``relative`` (a learned bias per head on bucketed distances, T5,
  Raffel et al. 2020, §2.1), ``alibi`` (a fixed linear distance penalty per head, Press et al.
  2022) as a bias on the logits, and ``rope`` (rotation of queries and keys, Su et al. 2021) on
  the projected queries/keys.

Positions are always per segment (they restart at 0 in every pair packed into a row), so
a pair sees the same signal packed or alone. Cross-attention gets no position term in any scheme
(source and target positions are not comparable; T5 does the same). ``Positions`` bundles what
one stack needs, so the model reads the same for every scheme.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from seq2seq.model.axes import logical


def sinusoidal_embedding(
    positions: jax.Array,
    d_model: int,
    max_timescale: float = 10_000.0,
    layout: str = "interleaved",
) -> jax.Array:
    """Sinusoidal position encodings, computed on the fly for any position.

    PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model))
    (Vaswani et al. 2017, §3.5). ``interleaved``: sines fill the even feature indices and
    cosines the odd ones, exactly as in the formula; ``halves``: the d/2 sines, then the d/2
    cosines of the same frequencies (Marian's table, as Hugging Face's
    ``MarianSinusoidalPositionalEmbedding`` builds it). No table is stored, so there is no
    maximum length.

    Args:
      positions: int ``[...]`` positions (per-segment when packed).
      d_model: feature size; must be even.
      layout: ``interleaved`` or ``halves``.

    Returns:
      float32 ``[..., d_model]``.

    Raises:
      ValueError: d_model is odd.
    """
    if d_model % 2:
        raise ValueError(f"sinusoidal positions need an even d_model, got {d_model}")
    two_i = jnp.arange(0, d_model, 2, dtype=jnp.float32)
    inv_freq = 1.0 / (max_timescale ** (two_i / d_model))
    angles = positions.astype(jnp.float32)[..., None] * inv_freq
    if layout == "halves":
        return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)
    if layout != "interleaved":
        raise ValueError(f"unknown sinusoidal layout {layout!r}; expected interleaved or halves")
    # interleave: [..., d/2, 2] -> [..., d] puts sin at 2i and cos at 2i+1
    return jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1).reshape(*positions.shape, d_model)


def apply_rope(x: jax.Array, positions: jax.Array, base: float = 10_000.0) -> jax.Array:
    """Rotary position embedding of queries or keys (Su et al. 2021, RoFormer, eq. 34).

    Feature pair (k, k + head_dim/2) of the vector at position m is rotated by the angle
    m·θ_k with θ_k = base^(-2k/head_dim). The paper pairs adjacent features (2k, 2k+1); pairing
    the two halves is the same rotation up to a fixed permutation of features, which the Q/K
    projections absorb, and avoids an interleave. Because rotations compose,
    ⟨R_m q, R_n k⟩ = ⟨q, R_(n-m) k⟩: the score depends on the positions only through n − m.

    Args:
      x: ``[batch, length, heads, head_dim]`` (any float dtype); head_dim must be even.
      positions: int ``[batch, length]`` (per segment) or ``[1, length]``.
      base: frequency base θ.

    Returns:
      The rotated ``x``, same shape and dtype (the rotation is computed in float32).

    Raises:
      ValueError: head_dim is odd.
    """
    head_dim = x.shape[-1]
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head dimension, got {head_dim}")
    half = head_dim // 2
    inv_freq = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = positions.astype(jnp.float32)[:, :, None, None] * inv_freq  # [b, l, 1, half]
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def relative_position_bucket(
    relative_position: jax.Array,
    *,
    bidirectional: bool,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> jax.Array:
    """T5's bucket of a relative position ``key_pos − query_pos`` (Raffel et al. 2020, §2.1).

    Half of the buckets (of each direction, when bidirectional) hold the exact distances
    0 .. n/2 − 1; the rest cover distances up to ``max_distance`` logarithmically, and every
    longer distance shares the last bucket, so any length is valid. Causal (``bidirectional``
    False): keys after the query all map to bucket 0 (the causal mask hides them anyway).
    Bidirectional: keys after the query use buckets n/2 .. n − 1.

    Args:
      relative_position: int ``[...]``, key position minus query position.
      bidirectional: encoder (True) or causal decoder self-attention (False).
      num_buckets: total buckets n (even when bidirectional).
      max_distance: distances ≥ this share the last bucket.

    Returns:
      int32 ``[...]`` buckets in [0, num_buckets).
    """
    n = -relative_position  # > 0: the key lies before the query
    bucket = jnp.zeros_like(n)
    if bidirectional:
        num_buckets //= 2
        bucket = jnp.where(n < 0, num_buckets, 0)
        n = jnp.abs(n)
    else:
        n = jnp.maximum(n, 0)
    max_exact = num_buckets // 2
    log_ratio = jnp.log(jnp.maximum(n, 1).astype(jnp.float32) / max_exact) / math.log(
        max_distance / max_exact
    )
    large = max_exact + (log_ratio * (num_buckets - max_exact)).astype(jnp.int32)
    large = jnp.minimum(large, num_buckets - 1)
    return (bucket + jnp.where(n < max_exact, n, large)).astype(jnp.int32)


def alibi_slopes(num_heads: int) -> np.ndarray:
    """ALiBi head slopes m_h (Press et al. 2022, §3).

    For h a power of two: the geometric sequence 2^(-8/h), 2^(-16/h), ..., 2^(-8). Otherwise
    (the authors' recipe): the slopes of the largest power of two p < h, then every other slope
    of 2p, until there are h.

    Returns:
      float32 ``[num_heads]`` (a NumPy constant).
    """

    def power_of_two(n):
        return [2.0 ** (-8.0 * (k + 1) / n) for k in range(n)]

    p = 2 ** int(math.floor(math.log2(num_heads)))
    slopes = power_of_two(p) + power_of_two(2 * p)[0::2][: num_heads - p]
    return np.asarray(slopes, np.float32)


def alibi_bias(q_positions: jax.Array, k_positions: jax.Array, num_heads: int) -> jax.Array:
    """ALiBi attention bias −m_h·|i − j| (Press et al. 2022, §3, Fig. 3).

    The paper's causal bias is −m_h·(i − j) for keys j ≤ i; |i − j| is the same there and
    extends it symmetrically to the bidirectional encoder. No parameters, no length limit.

    Args:
      q_positions: int ``[b, q_len]``; k_positions: int ``[b, k_len]`` (b may be 1).

    Returns:
      float32 ``[b, num_heads, q_len, k_len]``.
    """
    distance = jnp.abs(q_positions[:, :, None] - k_positions[:, None, :]).astype(jnp.float32)
    return -jnp.asarray(alibi_slopes(num_heads))[None, :, None, None] * distance[:, None]


class RelativePositionBias(nnx.Module):
    """T5 relative-position bias: one learned scalar per (head, bucket) (Raffel et al. 2020).

    One table per stack, shared by all its layers (as in T5).

    Args:
      num_heads: heads h.
      num_buckets / max_distance: see ``relative_position_bucket``.
      bidirectional: encoder (True) or causal decoder (False).
      rngs: initialisation keys (table ~ N(0, 0.1²): heads start close to content-only
        attention).

    ``__call__(q_positions [b, q_len], k_positions [b, k_len])`` → float32
    ``[b, heads, q_len, k_len]``.
    """

    def __init__(
        self,
        num_heads: int,
        num_buckets: int,
        max_distance: int,
        *,
        bidirectional: bool,
        rngs: nnx.Rngs,
    ):
        if bidirectional and num_buckets % 2:
            raise ValueError(
                f"bidirectional relative positions need an even number of buckets, "
                f"got {num_buckets}"
            )
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.bidirectional = bidirectional
        init = logical(nnx.initializers.normal(stddev=0.1), ("heads", "relpos_buckets"))
        self.table = nnx.Param(init(rngs.params(), (num_heads, num_buckets), jnp.float32))

    def __call__(self, q_positions: jax.Array, k_positions: jax.Array) -> jax.Array:
        return self.bias_fn()(q_positions, k_positions)

    def bias_fn(self) -> Callable[[jax.Array, jax.Array], jax.Array]:
        """``__call__`` as a pure function of the positions over the table's current value, for
        attention that builds its bias block by block (``PositionBias``)."""
        table = self.table[...]  # [heads, buckets]
        bidirectional, num_buckets = self.bidirectional, self.num_buckets
        max_distance = self.max_distance

        def fn(q_positions: jax.Array, k_positions: jax.Array) -> jax.Array:
            buckets = relative_position_bucket(
                k_positions[:, None, :] - q_positions[:, :, None],
                bidirectional=bidirectional,
                num_buckets=num_buckets,
                max_distance=max_distance,
            )
            return jnp.moveaxis(table[:, buckets], 0, 1)  # [h, b, q, k] -> [b, h, q, k]

        return fn


@dataclasses.dataclass(frozen=True)
class PositionBias:
    """A position bias kept as its positions and a function of them, so that attention can
    build any ``[q_block, k_block]`` block on the fly (``model.attention=chunked``) instead of
    the whole ``[q_len, k_len]`` matrix.

    Attributes:
      fn: ``(q_positions [b, q], k_positions [b, k])`` → float32 ``[b, heads, q, k]``.
      q_positions: int ``[b or 1, q_len]``; k_positions: int ``[b or 1, k_len]``.
    """

    fn: Callable[[jax.Array, jax.Array], jax.Array]
    q_positions: jax.Array
    k_positions: jax.Array

    def dense(self) -> jax.Array:
        """The whole bias, float32 ``[b, heads, q_len, k_len]``."""
        return self.fn(self.q_positions, self.k_positions)


class Positions(nnx.Module):
    """The position signal of one stack (the encoder, or the decoder's self-attention).

    Args:
      kind: ``sinusoidal``, ``learned``, ``relative``, ``rope``, ``alibi`` or ``none``.
      d_model / num_heads: model shape.
      causal: decoder stack (relative buckets are one-directional).
      max_len: table size for ``learned``.
      relpos_buckets / relpos_max_distance: for ``relative``.
      sinusoidal_layout: ``interleaved`` or ``halves`` (``sinusoidal_embedding``).
      rngs: initialisation keys.

    Raises:
      ValueError: unknown kind.
    """

    def __init__(
        self,
        kind: str,
        d_model: int,
        num_heads: int,
        *,
        causal: bool,
        max_len: int = 512,
        relpos_buckets: int = 32,
        relpos_max_distance: int = 128,
        sinusoidal_layout: str = "interleaved",
        rngs: nnx.Rngs,
    ):
        if kind not in ("sinusoidal", "learned", "relative", "rope", "alibi", "none"):
            raise ValueError(f"unknown position scheme {kind!r}")
        self.kind, self.d_model, self.num_heads = kind, d_model, num_heads
        self.max_len = max_len
        self.sinusoidal_layout = sinusoidal_layout
        if kind == "learned":
            # small init, as BERT (Devlin et al. 2019) does for its learned position table
            init = logical(nnx.initializers.normal(stddev=0.02), ("positions", "embed"))
            self.table = nnx.Param(init(rngs.params(), (max_len, d_model), jnp.float32))
        if kind == "relative":
            self.relative = RelativePositionBias(
                num_heads, relpos_buckets, relpos_max_distance, bidirectional=not causal, rngs=rngs
            )

    def check_length(self, length: int) -> None:
        """Raise ValueError if ``length`` positions exceed the ``learned`` table (others: no
        limit)."""
        if self.kind == "learned" and length > self.max_len:
            raise ValueError(
                f"input length {length} exceeds the learned position table of "
                f"{self.max_len} positions (model.max_len); use a shorter input, a "
                f"larger model.max_len, or a scheme without a table "
                f"(sinusoidal, rope, alibi, relative)"
            )

    def add(self, x: jax.Array, positions: jax.Array) -> jax.Array:
        """Embeddings ``x`` ``[b, l, d_model]`` plus the absolute signal at int ``positions``
        ``[b, l]``.

        Identity for the schemes that act inside attention. ``learned`` indexes its table, so
        positions must be < ``max_len`` (``check_length`` guards the static lengths).
        """
        if self.kind == "sinusoidal":
            table = sinusoidal_embedding(positions, self.d_model, layout=self.sinusoidal_layout)
            return x + table.astype(x.dtype)
        if self.kind == "learned":
            return x + jnp.take(self.table[...], positions, axis=0).astype(x.dtype)
        return x

    def bias(self, q_positions: jax.Array, k_positions: jax.Array) -> jax.Array | None:
        """Self-attention bias for ``relative``/``alibi`` (else None).

        Args:
          q_positions: int ``[b, q_len]``; k_positions: int ``[b, k_len]`` (b may be 1).

        Returns:
          float32 ``[b, heads, q_len, k_len]`` or None.
        """
        lazy = self.lazy_bias(q_positions, k_positions)
        return None if lazy is None else lazy.dense()

    def lazy_bias(self, q_positions: jax.Array, k_positions: jax.Array) -> PositionBias | None:
        """``bias`` as a ``PositionBias`` (nothing of size ``q_len × k_len`` is built), or None."""
        if self.kind == "relative":
            return PositionBias(self.relative.bias_fn(), q_positions, k_positions)
        if self.kind == "alibi":
            fn = functools.partial(alibi_bias, num_heads=self.num_heads)
            return PositionBias(fn, q_positions, k_positions)
        return None

    def rope(self, positions: jax.Array) -> jax.Array | None:
        """The positions that rotate queries/keys (``rope`` only, else None; see ``apply_rope``)."""
        return positions if self.kind == "rope" else None
