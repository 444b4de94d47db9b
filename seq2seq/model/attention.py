"""Multi-head scaled dot-product attention and its masks (Vaswani et al. 2017, §3.2).

Conventions used throughout the model:

* ``segments``: int32 ``[batch, length]``; 0 marks padding, 1, 2, ... number the pairs packed
  into one row. An unpacked batch simply has segment 1 for every real token.
* masks are boolean, ``True`` = may attend, shaped ``[batch, 1, q_len, k_len]`` (broadcast over
  heads), as ``jax.nn.dot_product_attention`` expects.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from seq2seq import kernels
from seq2seq.model.axes import logical
from seq2seq.model.positions import apply_rope
from seq2seq.model.precision import dot_general_f32_accumulate


def segment_mask(q_segments: jax.Array, k_segments: jax.Array) -> jax.Array:
    """Padding + packing mask: a query attends only to real keys of its own segment.

    Args:
      q_segments: int ``[batch, q_len]``, 0 = padding.
      k_segments: int ``[batch, k_len]``, 0 = padding.

    Returns:
      bool ``[batch, 1, q_len, k_len]``.
    """
    same = q_segments[:, :, None] == k_segments[:, None, :]
    return (same & (k_segments[:, None, :] > 0))[:, None]


def causal_segment_mask(segments: jax.Array) -> jax.Array:
    """Decoder self-attention mask: own segment, real keys, and key position ≤ query position.

    Packed segments are contiguous, so the row index order is the order within each segment.

    Args:
      segments: int ``[batch, length]``.

    Returns:
      bool ``[batch, 1, length, length]``.
    """
    length = segments.shape[1]
    causal = jnp.arange(length)[:, None] >= jnp.arange(length)[None, :]
    return segment_mask(segments, segments) & causal[None, None]


def _attention_weights(
    logits: jax.Array, depth: int, mask: jax.Array | None, bias: jax.Array | None
) -> jax.Array:
    """float32 softmax over keys of Q Kᵀ logits ``[batch, heads, q_len, k_len]``: scaled by
    1/√depth, plus ``bias``, masked keys at the float32 minimum (eq. 1)."""
    logits = logits / jnp.sqrt(jnp.float32(depth))
    if bias is not None:
        logits = logits + bias
    if mask is not None:
        logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
    return jax.nn.softmax(logits, axis=-1)


def dot_product_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    mask: jax.Array | None,
    *,
    bias: jax.Array | None = None,
    dropout_rate: float = 0.0,
    dropout_rng: jax.Array | None = None,
    return_weights: bool = False,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """softmax(Q Kᵀ / √d_k + B) V per head (Vaswani et al. 2017, eq. 1; B: position bias).

    Uses ``jax.nn.dot_product_attention`` (its default ``implementation=None`` is XLA's fused
    attention on every backend in jax 0.10; ``"cudnn"`` would select cuDNN flash attention on
    GPU for bf16/fp16 inputs); an explicit path computes the same thing when attention-weight
    dropout is active or the weights are requested. Logits and softmax are float32 whatever the
    input dtype.

    Args:
      query: ``[batch, q_len, heads, head_dim]``.
      key, value: ``[batch, k_len, heads, head_dim]`` (same dtype as ``query``).
      mask: bool, broadcastable to ``[batch, heads, q_len, k_len]``; True = attend. A query row
        with no allowed key (a padding query) gets uniform weights, never NaN.
      bias: float32, broadcastable to ``[batch, heads, q_len, k_len]``, added to the scaled
        logits (relative-position or ALiBi bias); None for none.
      dropout_rate: dropout on the attention weights (needs ``dropout_rng``).
      return_weights: also return the float32 weights ``[batch, heads, q_len, k_len]``.

    Returns:
      ``[batch, q_len, heads, head_dim]`` in the query dtype (and the weights if asked).
    """
    use_dropout = dropout_rate > 0.0 and dropout_rng is not None
    if not (use_dropout or return_weights):
        return jax.nn.dot_product_attention(query, key, value, bias=bias, mask=mask)
    logits = jnp.einsum("bqhd,bkhd->bhqk", query, key, preferred_element_type=jnp.float32)
    weights = _attention_weights(logits, query.shape[-1], mask, bias)
    probs = weights
    if use_dropout:
        assert dropout_rng is not None  # use_dropout implies it
        keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, probs.shape)
        probs = jnp.where(keep, probs / (1.0 - dropout_rate), 0.0)
    out = jnp.einsum("bhqk,bkhd->bqhd", probs.astype(value.dtype), value)
    return (out, weights) if return_weights else out


def cached_attention(
    query: jax.Array,
    key_cache: jax.Array,
    value_cache: jax.Array,
    mask: jax.Array,
    *,
    bias: jax.Array | None = None,
) -> jax.Array:
    """softmax(Q Kᵀ / √d_k + B) V against a KV cache in the layout the matmuls want (eq. 1).

    The cache is kept head-major so that neither product needs a transposed copy of it at every
    decoding step: keys as ``[batch, heads, head_dim, slots]`` (the right operand of Q Kᵀ,
    contracted on ``head_dim``) and values as ``[batch, heads, slots, head_dim]`` (the right
    operand of P V, contracted on ``slots``). Used for the decoder's self-attention cache
    (``Transformer.decode_step``; which slots a query reads is the caller's ``mask``) and for
    the cross-attention keys/values of the source (slots = source positions).

    Args:
      query: ``[batch, q_len, heads, head_dim]``.
      key_cache: ``[batch, heads, head_dim, slots]``, same dtype as ``query``.
      value_cache: ``[batch, heads, slots, head_dim]``.
      mask: bool, broadcastable to ``[batch, heads, q_len, slots]``; True = attend. A query
        with no allowed slot gets uniform weights (never NaN).
      bias: float32, broadcastable to ``[batch, heads, q_len, slots]``, or None.

    Returns:
      ``[batch, q_len, heads, head_dim]`` in the query dtype; logits and softmax in float32.
    """
    f32 = jnp.float32
    if query.shape[1] == 1 or not kernels.cpu():  # batched matrix products (einsum)
        logits = jnp.einsum("bqhd,bhdk->bhqk", query, key_cache, preferred_element_type=f32)
        probs = _attention_weights(logits, query.shape[-1], mask, bias).astype(value_cache.dtype)
        out = jnp.einsum("bhqk,bhkd->bqhd", probs, value_cache, preferred_element_type=f32)
        return out.astype(query.dtype)
    # Several queries per row (the beams of a sentence), XLA:CPU kernel (seq2seq.kernels): both
    # products are memory-bound, and XLA:CPU runs batched dots of many tiny matrices much slower
    # than this fused broadcast multiply and float32 sum. (One query per row stays an einsum:
    # matrix-vector products, which it runs well and where this form is pathologically slow.)
    q = query.astype(f32).transpose(0, 2, 1, 3)  # [batch, heads, q_len, head_dim]
    logits = jnp.sum(q[..., None] * key_cache.astype(f32)[:, :, None], axis=3)
    probs = _attention_weights(logits, query.shape[-1], mask, bias)
    out = jnp.sum(probs[..., None] * value_cache.astype(f32)[:, :, None], axis=3)
    return out.transpose(0, 2, 1, 3).astype(query.dtype)


class MultiHeadAttention(nnx.Module):
    """Multi-head attention with separate Q, K, V and output projections (§3.2.2).

    Projections ``d_model → d_model`` with biases: 4·d_model² weights + 4·d_model biases.

    Args:
      d_model: model width; must be divisible by ``num_heads``.
      num_heads: number of heads h; head_dim = d_model / h.
      dropout_rate: attention-weight dropout.
      rope_base: θ of the rotary embedding, used when ``rope_positions`` are passed.
      dtype: compute dtype (parameters stay float32).
      rngs: parameter initialisation keys.

    Inspection: ``nnx.view(model, only=MultiHeadAttention, sow_weights=True)`` makes every
    call store its float32 weights ``[batch, heads, q_len, k_len]`` as ``nnx.Intermediate``
    ``attention_weights`` (``Transformer.attention_weights`` does this for a whole batch).

    Raises:
      ValueError: d_model is not divisible by num_heads.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        *,
        dropout_rate: float = 0.0,
        rope_base: float = 10_000.0,
        dtype=jnp.float32,
        rngs: nnx.Rngs,
    ):
        if d_model % num_heads:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.dropout_rate = dropout_rate
        self.rope_base = rope_base
        self.sow_weights = False
        init = nnx.initializers.xavier_uniform()

        def proj(axes):
            return nnx.Linear(
                d_model,
                d_model,
                dtype=dtype,
                rngs=rngs,
                dot_general=dot_general_f32_accumulate,
                kernel_init=logical(init, axes),
                bias_init=logical(nnx.initializers.zeros, axes[1:]),
            )

        self.query = proj(("embed", "heads"))
        self.key = proj(("embed", "heads"))
        self.value = proj(("embed", "heads"))
        self.out = proj(("heads", "embed"))

    def set_view(self, sow_weights: bool | None = None):
        """For ``nnx.view``: ``sow_weights=True`` records the attention weights of every call."""
        if sow_weights is not None:
            self.sow_weights = sow_weights

    def _split(self, x: jax.Array) -> jax.Array:
        return x.reshape(*x.shape[:-1], self.num_heads, self.head_dim)

    def project_kv(
        self, x: jax.Array, rope_positions: jax.Array | None = None
    ) -> tuple[jax.Array, jax.Array]:
        """Keys and values ``[batch, k_len, heads, head_dim]`` of ``x`` ``[batch, k_len, d_model]``.

        With int ``rope_positions`` ``[batch or 1, k_len]`` the keys are rotated (RoPE), so a
        cache holds them ready to use.
        """
        key = self._split(self.key(x))
        if rope_positions is not None:
            key = apply_rope(key, rope_positions, self.rope_base)
        return key, self._split(self.value(x))

    def project_kv_cache(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Keys ``[batch, heads, head_dim, k_len]`` and values ``[batch, heads, k_len, head_dim]``
        of ``x`` ``[batch, k_len, d_model]``: ``project_kv`` in the head-major cache layout of
        ``cached_attention`` (cross-attention keys/values for decoding, computed once)."""
        key, value = self.project_kv(x)
        return key.transpose(0, 2, 3, 1), value.transpose(0, 2, 1, 3)

    def _queries(self, x_q: jax.Array, rope_positions: jax.Array | None) -> jax.Array:
        q = self._split(self.query(x_q))
        if rope_positions is not None:
            q = apply_rope(q, rope_positions, self.rope_base)
        return q

    def attend(
        self,
        x_q: jax.Array,
        key: jax.Array,
        value: jax.Array,
        mask: jax.Array | None,
        *,
        bias: jax.Array | None = None,
        rope_positions: jax.Array | None = None,
        deterministic: bool = True,
        rngs: nnx.Rngs | None = None,
        return_weights: bool = False,
    ):
        """Attend from queries ``x_q`` ``[batch, q_len, d_model]`` to projected keys/values.

        Args:
          key, value: ``[batch, k_len, heads, head_dim]`` from ``project_kv``.
          mask: bool, broadcastable to ``[batch, heads, q_len, k_len]``.
          bias: float32 position bias, broadcastable to ``[batch, heads, q_len, k_len]``.
          rope_positions: int ``[batch or 1, q_len]``: rotate the queries (RoPE).

        Returns ``[batch, q_len, d_model]`` (and float32 weights ``[batch, heads, q_len, k_len]``).
        """
        q = self._queries(x_q, rope_positions)
        dropout_rng = None
        if not deterministic and self.dropout_rate > 0.0 and rngs is not None:
            dropout_rng = rngs.dropout()
        want_weights = return_weights or self.sow_weights
        res = dot_product_attention(
            q,
            key,
            value,
            mask,
            bias=bias,
            dropout_rate=self.dropout_rate,
            dropout_rng=dropout_rng,
            return_weights=want_weights,
        )
        out, weights = res if isinstance(res, tuple) else (res, None)  # a tuple iff want_weights
        if self.sow_weights:
            self.sow(nnx.Intermediate, "attention_weights", weights)
        out = self.out(out.reshape(*out.shape[:-2], -1))
        return (out, weights) if return_weights else out

    def attend_cache(
        self,
        x_q: jax.Array,
        key_cache: jax.Array,
        value_cache: jax.Array,
        mask: jax.Array,
        *,
        bias: jax.Array | None = None,
        rope_positions: jax.Array | None = None,
    ) -> jax.Array:
        """``attend`` for incremental decoding, against a head-major KV cache (no dropout).

        Args:
          x_q: ``[batch, q_len, d_model]``.
          key_cache: ``[batch, heads, head_dim, slots]``; value_cache:
            ``[batch, heads, slots, head_dim]`` (see ``cached_attention``).
          mask, bias: as ``cached_attention``.
          rope_positions: int ``[batch or 1, q_len or 1]``: rotate the queries (RoPE).

        Returns ``[batch, q_len, d_model]``.
        """
        q = self._queries(x_q, rope_positions)
        out = cached_attention(q, key_cache, value_cache, mask, bias=bias)
        return self.out(out.reshape(*out.shape[:-2], -1))

    def __call__(
        self,
        x_q: jax.Array,
        x_kv: jax.Array,
        mask: jax.Array | None,
        *,
        bias: jax.Array | None = None,
        rope_positions: jax.Array | None = None,
        deterministic: bool = True,
        rngs: nnx.Rngs | None = None,
    ) -> jax.Array:
        """Full attention from ``x_q`` ``[batch, q_len, d_model]`` to ``x_kv``
        ``[batch, k_len, d_model]``.

        ``bias`` and ``rope_positions`` as in ``attend`` (RoPE needs q_len == k_len:
        self-attention).
        """
        key, value = self.project_kv(x_kv, rope_positions)
        return self.attend(
            x_q,
            key,
            value,
            mask,
            bias=bias,
            rope_positions=rope_positions,
            deterministic=deterministic,
            rngs=rngs,
        )
