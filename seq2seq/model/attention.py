"""Multi-head scaled dot-product attention and its masks (Vaswani et al. 2017, §3.2).

Conventions used throughout the model:

* ``segments``: int32 ``[batch, length]``; 0 marks padding, 1, 2, ... number the pairs packed
  into one row. An unpacked batch simply has segment 1 for every real token.
* masks are boolean, ``True`` = may attend, shaped ``[batch, 1, q_len, k_len]`` (broadcast over
  heads), as ``jax.nn.dot_product_attention`` expects, or kept unbuilt as a ``SegmentMask``
  (segment ids + causality), with the position bias kept as a ``PositionBias``: the
  ``chunked`` path builds every ``[q_block, k_block]`` block of both on the fly.

Three implementations, selected by ``model.attention``:

* ``dense``: the whole ``[q_len, k_len]`` score matrix (``jax.nn.dot_product_attention``); the
  reference, and the only path that returns or sows the attention weights.
* ``chunked``: blockwise attention with an online softmax (Rabe & Staats 2021, "Self-attention
  does not need O(n²) memory"; Dao et al. 2022, FlashAttention §3.1): queries in blocks of
  ``model.attention_q_block``, keys in blocks of ``model.attention_kv_block``, each block
  rematerialised in the backward pass (``jax.checkpoint``), so memory is O(n) in forward and
  backward. Same values as ``dense`` (float32, to rounding), including padding queries.
* ``cudnn``: ``jax.nn.dot_product_attention(implementation="cudnn")`` in bfloat16 (cuDNN flash
  attention, GPU only).

Incremental decoding (``cached_attention``) is the same for all three: one or a few queries
against the cache are O(slots) memory already.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import nnx

from seq2seq import kernels
from seq2seq.model.axes import logical
from seq2seq.model.lora import Projection
from seq2seq.model.positions import PositionBias, apply_rope
from seq2seq.model.precision import linear_dot_general

IMPLEMENTATIONS = ("dense", "chunked", "cudnn")


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
    return SegmentMask(segments, segments, causal=True).dense()


@dataclasses.dataclass(frozen=True)
class SegmentMask:
    """``segment_mask`` (and ``causal_segment_mask``) kept as its segment ids, unbuilt.

    Attributes:
      q_segments: int ``[batch, q_len]``; k_segments: int ``[batch, k_len]`` (0 = padding).
      causal: also key index ≤ query index (decoder self-attention, q_len == k_len).
    """

    q_segments: jax.Array
    k_segments: jax.Array
    causal: bool = False

    def block(self, q_segments, k_segments, q_index, k_index) -> jax.Array:
        """bool ``[batch, 1, qb, kb]`` from a block's segment ids ``[batch, qb]``/``[batch, kb]``
        and row indices int ``[qb]``/``[kb]``."""
        mask = segment_mask(q_segments, k_segments)
        if self.causal:
            mask = mask & (q_index[:, None] >= k_index[None, :])[None, None]
        return mask

    def dense(self) -> jax.Array:
        """The whole mask, bool ``[batch, 1, q_len, k_len]``."""
        q_index = jnp.arange(self.q_segments.shape[1])
        k_index = jnp.arange(self.k_segments.shape[1])
        return self.block(self.q_segments, self.k_segments, q_index, k_index)


MaskLike = jax.Array | SegmentMask | None
BiasLike = jax.Array | PositionBias | None


def _dense(x: MaskLike | BiasLike) -> jax.Array | None:
    """A ``SegmentMask``/``PositionBias`` built whole; arrays and None unchanged."""
    return x.dense() if isinstance(x, SegmentMask | PositionBias) else x


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


def _blocks(x: jax.Array, axis: int, block: int) -> jax.Array:
    """``x`` padded with zeros along ``axis`` to whole blocks, the block index moved first:
    ``[..., n, ...]`` → ``[ceil(n / block), ..., block, ...]``."""
    n = x.shape[axis]
    nblocks = -(-n // block)
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, nblocks * block - n)
    x = jnp.pad(x, pad)
    x = x.reshape(*x.shape[:axis], nblocks, block, *x.shape[axis + 1 :])
    return jnp.moveaxis(x, axis, 0)


def _padded(x: jax.Array, q_len: int, k_len: int) -> jax.Array:
    """A dense mask/bias ``[.., .., q or 1, k or 1]`` padded to ``[.., .., q_len, k_len]``."""
    pad_q = q_len - x.shape[2] if x.shape[2] != 1 else 0
    pad_k = k_len - x.shape[3] if x.shape[3] != 1 else 0
    return jnp.pad(x, ((0, 0), (0, 0), (0, pad_q), (0, pad_k)))


def _slice(x: jax.Array, q_start, qb: int, k_start, kb: int) -> jax.Array:
    """Block ``[q_start:+qb, k_start:+kb]`` of a padded dense mask/bias (broadcast dims kept)."""
    if x.shape[2] != 1:
        x = jax.lax.dynamic_slice_in_dim(x, q_start, qb, axis=2)
    if x.shape[3] != 1:
        x = jax.lax.dynamic_slice_in_dim(x, k_start, kb, axis=3)
    return x


def chunked_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    mask: MaskLike,
    *,
    bias: BiasLike = None,
    q_block: int = 256,
    kv_block: int = 256,
    dropout_rate: float = 0.0,
    dropout_rng: jax.Array | None = None,
) -> jax.Array:
    """``dot_product_attention`` blockwise with an online softmax, in O(q_len + k_len) memory.

    For each block of ``q_block`` queries, a ``lax.scan`` over blocks of ``kv_block`` keys
    keeps the running row maximum m, the running sum l of exp(s − m) and the running
    exp(s − m)·V, rescaling both by exp(m_old − m_new) when the maximum grows (Rabe & Staats
    2021, §3; Dao et al. 2022, Algorithm 1); the output is their ratio. Every block (query
    block and key block) is a ``jax.checkpoint``, so the backward pass recomputes its scores
    instead of storing them: no ``[q_len, k_len]`` array exists in forward or backward when
    ``mask`` is a ``SegmentMask`` and ``bias`` a ``PositionBias`` (dense mask/bias arrays are
    accepted too, sliced block by block, but they are O(n²) themselves).

    Lengths that are not whole blocks are padded internally; padded keys get weight 0 exactly
    (−inf), while masked real keys get the float32 minimum as in ``dense``, so a query with no
    allowed key (a padding query) averages the values of all k_len real keys, as ``dense``'s
    uniform weights do. Blocks are ``min(block, length)``, so short inputs are not padded up.
    Attention dropout draws its keep mask per block (``fold_in`` of the block indices): the
    same distribution as ``dense``'s, not the same draws.

    Args:
      query: ``[batch, q_len, heads, head_dim]``; key, value: ``[batch, k_len, heads,
        head_dim]`` (same dtype).
      mask: ``SegmentMask``, a bool array broadcastable to ``[batch, heads, q_len, k_len]``
        (True = attend), or None.
      bias: ``PositionBias``, a float32 array broadcastable to ``[batch, heads, q_len, k_len]``,
        or None.
      q_block / kv_block: block sizes (positive).
      dropout_rate / dropout_rng: attention-weight dropout (active when both are set).

    Returns:
      ``[batch, q_len, heads, head_dim]`` in the query dtype; scores and softmax in float32.
    """
    batch, q_len, heads, head_dim = query.shape
    k_len = key.shape[1]
    qb, kb = min(q_block, q_len), min(kv_block, k_len)
    nq, nk = -(-q_len // qb), -(-k_len // kb)
    f32 = jnp.float32
    scale = 1.0 / math.sqrt(head_dim)
    masked = jnp.finfo(f32).min  # as dense: a row with no allowed key ends up uniform
    use_dropout = dropout_rate > 0.0 and dropout_rng is not None

    q_blocks = _blocks(query, 1, qb)  # [nq, batch, qb, heads, head_dim]
    k_blocks, v_blocks = _blocks(key, 1, kb), _blocks(value, 1, kb)  # [nk, batch, kb, h, d]
    q_index, k_index = _blocks(jnp.arange(q_len), 0, qb), _blocks(jnp.arange(k_len), 0, kb)
    q_xs: dict[str, jax.Array] = {"q": q_blocks, "i": q_index, "n": jnp.arange(nq)}
    k_xs: dict[str, jax.Array] = {"k": k_blocks, "v": v_blocks, "j": k_index, "n": jnp.arange(nk)}
    if isinstance(mask, SegmentMask):
        q_xs["seg"] = _blocks(mask.q_segments, 1, qb)  # [nq, batch, qb]
        k_xs["seg"] = _blocks(mask.k_segments, 1, kb)
    elif mask is not None:
        mask = _padded(mask, nq * qb, nk * kb)
    if isinstance(bias, PositionBias):
        q_xs["pos"] = _blocks(bias.q_positions, 1, qb)  # [nq, b or 1, qb]
        k_xs["pos"] = _blocks(bias.k_positions, 1, kb)
    elif bias is not None:
        bias = _padded(bias, nq * qb, nk * kb)

    def kv_step(carry, kx, qx):
        m, total, acc = carry  # [batch, heads, qb] ×2, [batch, heads, qb, head_dim]; float32
        s = jnp.einsum("bqhd,bkhd->bhqk", qx["q"], kx["k"], preferred_element_type=f32)
        s = s * scale  # [batch, heads, qb, kb]
        if isinstance(bias, PositionBias):
            s = s + bias.fn(qx["pos"], kx["pos"])
        elif bias is not None:
            s = s + _slice(bias, qx["n"] * qb, qb, kx["n"] * kb, kb)
        if isinstance(mask, SegmentMask):
            s = jnp.where(mask.block(qx["seg"], kx["seg"], qx["i"], kx["j"]), s, masked)
        elif mask is not None:
            s = jnp.where(_slice(mask, qx["n"] * qb, qb, kx["n"] * kb, kb), s, masked)
        real = (kx["n"] * kb + jnp.arange(kb)) < k_len  # [kb]; False: internal padding
        s = jnp.where(real, s, -jnp.inf)
        m_new = jnp.maximum(m, s.max(axis=-1))
        correction = jnp.exp(m - m_new)
        p = jnp.exp(s - m_new[..., None])  # [batch, heads, qb, kb]
        total = total * correction + p.sum(axis=-1)
        if use_dropout:
            assert dropout_rng is not None
            rng = jax.random.fold_in(jax.random.fold_in(dropout_rng, qx["n"]), kx["n"])
            keep = jax.random.bernoulli(rng, 1.0 - dropout_rate, p.shape)
            p = jnp.where(keep, p / (1.0 - dropout_rate), 0.0)
        pv = jnp.einsum(
            "bhqk,bkhd->bhqd", p.astype(value.dtype), kx["v"], preferred_element_type=f32
        )
        return (m_new, total, acc * correction[..., None] + pv), None

    def q_step(qx):
        init = (
            jnp.full((batch, heads, qb), masked, f32),  # m: the masked score, never −inf
            jnp.zeros((batch, heads, qb), f32),
            jnp.zeros((batch, heads, qb, head_dim), f32),
        )
        step = jax.checkpoint(lambda carry, kx: kv_step(carry, kx, qx))
        (_, total, acc), _ = jax.lax.scan(step, init, k_xs)
        out = acc / total[..., None]  # total ≥ 1: the row maximum contributes exp(0)
        return out.transpose(0, 2, 1, 3).astype(query.dtype)  # [batch, qb, heads, head_dim]

    out = jax.lax.map(jax.checkpoint(q_step), q_xs)  # [nq, batch, qb, heads, head_dim]
    out = jnp.moveaxis(out, 0, 1).reshape(batch, nq * qb, heads, head_dim)
    return out[:, :q_len]


def dot_product_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    mask: MaskLike,
    *,
    bias: BiasLike = None,
    dropout_rate: float = 0.0,
    dropout_rng: jax.Array | None = None,
    return_weights: bool = False,
    implementation: str = "dense",
    q_block: int = 256,
    kv_block: int = 256,
) -> jax.Array | tuple[jax.Array, jax.Array]:
    """softmax(Q Kᵀ / √d_k + B) V per head (Vaswani et al. 2017, eq. 1; B: position bias).

    Uses ``jax.nn.dot_product_attention`` (its default ``implementation=None`` is XLA's fused
    attention on every backend in jax 0.10; ``"cudnn"`` would select cuDNN flash attention on
    GPU for bf16/fp16 inputs); an explicit path computes the same thing when attention-weight
    dropout is active or the weights are requested. Logits and softmax are float32 whatever the
    input dtype.

    ``implementation`` ``chunked`` hands over to ``chunked_attention`` unless the weights are
    requested (inspection, ``return_weights``/``sow_weights``): those need the whole matrix, so
    that call takes the dense path. ``cudnn`` runs ``jax.nn.dot_product_attention`` with
    ``implementation="cudnn"`` on bfloat16 inputs (GPU only; JAX raises elsewhere); with
    attention dropout or requested weights it takes the explicit dense path too.

    Args:
      query: ``[batch, q_len, heads, head_dim]``.
      key, value: ``[batch, k_len, heads, head_dim]`` (same dtype as ``query``).
      mask: bool, broadcastable to ``[batch, heads, q_len, k_len]``, or a ``SegmentMask``;
        True = attend. A query row with no allowed key (a padding query) gets uniform weights,
        never NaN.
      bias: float32, broadcastable to ``[batch, heads, q_len, k_len]``, or a
        ``PositionBias``, added to the scaled logits (relative-position or ALiBi bias); None
        for none.
      dropout_rate: dropout on the attention weights (needs ``dropout_rng``).
      return_weights: also return the float32 weights ``[batch, heads, q_len, k_len]``.
      implementation: ``dense``, ``chunked`` or ``cudnn`` (``model.attention``).
      q_block / kv_block: ``chunked`` block sizes.

    Returns:
      ``[batch, q_len, heads, head_dim]`` in the query dtype (and the weights if asked).

    Raises:
      ValueError: an unknown ``implementation``.
    """
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"unknown attention implementation {implementation!r}; "
            f"expected one of {', '.join(IMPLEMENTATIONS)}"
        )
    use_dropout = dropout_rate > 0.0 and dropout_rng is not None
    if implementation == "chunked" and not return_weights:
        return chunked_attention(
            query,
            key,
            value,
            mask,
            bias=bias,
            q_block=q_block,
            kv_block=kv_block,
            dropout_rate=dropout_rate,
            dropout_rng=dropout_rng,
        )
    dense_mask, dense_bias = _dense(mask), _dense(bias)
    if implementation == "cudnn" and not (use_dropout or return_weights):
        bf16 = jnp.bfloat16
        safe_mask, empty = _guard_empty_rows(dense_mask, query.shape[1], key.shape[1])
        out = jax.nn.dot_product_attention(
            query.astype(bf16),
            key.astype(bf16),
            value.astype(bf16),
            bias=None if dense_bias is None else dense_bias.astype(bf16),
            mask=safe_mask,
            implementation="cudnn",
        )
        if empty is not None:  # as dense: uniform weights, the mean of the values
            mean = jnp.mean(value.astype(jnp.float32), axis=1, keepdims=True).astype(bf16)
            out = jnp.where(empty, mean, out)
        return out.astype(query.dtype)
    if not (use_dropout or return_weights):
        return jax.nn.dot_product_attention(query, key, value, bias=dense_bias, mask=dense_mask)
    logits = jnp.einsum("bqhd,bkhd->bhqk", query, key, preferred_element_type=jnp.float32)
    weights = _attention_weights(logits, query.shape[-1], dense_mask, dense_bias)
    probs = weights
    if use_dropout:
        assert dropout_rng is not None  # use_dropout implies it
        keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, probs.shape)
        probs = jnp.where(keep, probs / (1.0 - dropout_rate), 0.0)
    out = jnp.einsum("bhqk,bkhd->bqhd", probs.astype(value.dtype), value)
    return (out, weights) if return_weights else out


def _guard_empty_rows(
    mask: jax.Array | None, q_len: int, k_len: int
) -> tuple[jax.Array | None, jax.Array | None]:
    """A mask under which no query row is fully masked, and where the rows were.

    Packed batches always hold padding queries whose every key is masked; cuDNN's flash
    attention divides by a softmax sum of zero there (NaN, which reaches the gradients even
    though the loss ignores those rows). Such rows may attend to every key instead; the caller
    replaces their output by the mean of the values, which is what ``dense`` gives them.

    Args:
      mask: bool, broadcastable to ``[batch, heads, q_len, k_len]``, or None (no mask).

    Returns:
      ``(safe_mask, empty)``: ``safe_mask`` with empty rows all True; ``empty`` bool
      ``[batch, q_len, heads or 1, 1]`` (True = the row had no key; the output's layout), or
      ``(mask, None)`` when there is no mask.
    """
    if mask is None:
        return None, None
    mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
    mask = jnp.broadcast_to(mask, (*mask.shape[:2], q_len, k_len))
    empty = ~jnp.any(mask, axis=-1, keepdims=True)  # [batch, heads or 1, q_len, 1]
    return mask | empty, jnp.swapaxes(empty, 1, 2)


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
      implementation: ``dense``, ``chunked`` or ``cudnn`` (``dot_product_attention``).
      q_block / kv_block: ``chunked`` block sizes.
      dtype: compute dtype (parameters stay float32).
      matmul_dtype: operand dtype of the four projections (``ModelConfig.matmul_dtype``).
      rngs: parameter initialisation keys.

    Inspection: ``nnx.view(model, only=MultiHeadAttention, sow_weights=True)`` makes every
    call store its float32 weights ``[batch, heads, q_len, k_len]`` as ``nnx.Intermediate``
    ``attention_weights`` (``Transformer.attention_weights`` does this for a whole batch).

    The weights need the whole matrix, so a call that sows or returns them takes the dense
    path whatever ``implementation`` says (inspection only; training never asks for them).

    Raises:
      ValueError: d_model is not divisible by num_heads; an unknown implementation or a block
        size < 1.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        *,
        dropout_rate: float = 0.0,
        rope_base: float = 10_000.0,
        implementation: str = "dense",
        q_block: int = 256,
        kv_block: int = 256,
        dtype=jnp.float32,
        matmul_dtype: str | None = None,
        rngs: nnx.Rngs,
    ):
        if d_model % num_heads:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
        if implementation not in IMPLEMENTATIONS:
            raise ValueError(
                f"unknown attention implementation {implementation!r}; "
                f"expected one of {', '.join(IMPLEMENTATIONS)}"
            )
        if q_block < 1 or kv_block < 1:
            raise ValueError(f"attention blocks must be >= 1, got {q_block} and {kv_block}")
        self.implementation = implementation
        self.q_block, self.kv_block = q_block, kv_block
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.dropout_rate = dropout_rate
        self.rope_base = rope_base
        self.sow_weights = False
        init = nnx.initializers.xavier_uniform()
        dot_general = linear_dot_general(matmul_dtype)

        def proj(axes):
            return Projection(
                d_model,
                d_model,
                dtype=dtype,
                rngs=rngs,
                dot_general=dot_general,
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
        mask: MaskLike,
        *,
        bias: BiasLike = None,
        rope_positions: jax.Array | None = None,
        deterministic: bool = True,
        rngs: nnx.Rngs | None = None,
        return_weights: bool = False,
    ):
        """Attend from queries ``x_q`` ``[batch, q_len, d_model]`` to projected keys/values.

        Args:
          key, value: ``[batch, k_len, heads, head_dim]`` from ``project_kv``.
          mask: bool, broadcastable to ``[batch, heads, q_len, k_len]``, or a ``SegmentMask``.
          bias: float32 position bias, broadcastable to ``[batch, heads, q_len, k_len]``, or a
            ``PositionBias``.
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
            implementation=self.implementation,
            q_block=self.q_block,
            kv_block=self.kv_block,
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
        mask: MaskLike,
        *,
        bias: BiasLike = None,
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
