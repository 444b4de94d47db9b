"""Encoder and decoder layers: attention, position-wise FFN, residuals and LayerNorm.

Norm placement (``norm``):
  * ``post`` (Vaswani et al. 2017, §5.4): ``x = LayerNorm(x + Dropout(Sublayer(x)))``.
  * ``pre`` (Wang et al. 2019; Xiong et al. 2020): ``x = x + Dropout(Sublayer(LayerNorm(x)))``,
    with a final LayerNorm after the stack (in ``transformer.py``).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from seq2seq.model.axes import logical

from seq2seq.model.attention import MultiHeadAttention

ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "relu": jax.nn.relu,
    "gelu": jax.nn.gelu,
}


def layer_norm(d_model: int, rngs: nnx.Rngs) -> nnx.LayerNorm:
    """LayerNorm (Ba et al. 2016) over the last axis; statistics in float32 (eps 1e-6)."""
    return nnx.LayerNorm(d_model, epsilon=1e-6, dtype=jnp.float32, rngs=rngs,
                         scale_init=logical(nnx.initializers.ones, ("embed",)),
                         bias_init=logical(nnx.initializers.zeros, ("embed",)))


class FeedForward(nnx.Module):
    """Position-wise FFN: W2 · act(W1 x + b1) + b2 (Vaswani et al. 2017, eq. 2).

    Input and output ``[batch, length, d_model]``; hidden ``[batch, length, d_ff]``.
    Dropout is applied to the hidden activation at ``activation_dropout_rate``.

    Raises:
      ValueError: unknown activation name.
    """

    def __init__(self, d_model: int, d_ff: int, *, activation: str = "relu",
                 activation_dropout_rate: float = 0.0, dtype=jnp.float32, rngs: nnx.Rngs):
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; choose from {sorted(ACTIVATIONS)}")
        self.activation = ACTIVATIONS[activation]
        init = nnx.initializers.xavier_uniform()
        self.wi = nnx.Linear(d_model, d_ff, dtype=dtype, rngs=rngs,
                             kernel_init=logical(init, ("embed", "mlp")),
                             bias_init=logical(nnx.initializers.zeros, ("mlp",)))
        self.wo = nnx.Linear(d_ff, d_model, dtype=dtype, rngs=rngs,
                             kernel_init=logical(init, ("mlp", "embed")),
                             bias_init=logical(nnx.initializers.zeros, ("embed",)))
        self.dropout = nnx.Dropout(activation_dropout_rate)

    def __call__(self, x: jax.Array, *, deterministic: bool = True,
                 rngs: nnx.Rngs | None = None) -> jax.Array:
        h = self.activation(self.wi(x))
        h = self.dropout(h, deterministic=deterministic, rngs=rngs)
        return self.wo(h)


class _Residual(nnx.Module):
    """One residual sublayer with its LayerNorm and dropout, pre- or post-norm."""

    def __init__(self, d_model: int, norm: str, dropout_rate: float, rngs: nnx.Rngs):
        if norm not in ("pre", "post"):
            raise ValueError(f"norm must be 'pre' or 'post', got {norm!r}")
        self.pre = norm == "pre"
        self.norm = layer_norm(d_model, rngs)
        self.dropout = nnx.Dropout(dropout_rate)

    def __call__(self, x: jax.Array, sublayer: Callable[[jax.Array], jax.Array], *,
                 deterministic: bool, rngs: nnx.Rngs | None) -> jax.Array:
        if self.pre:
            y = sublayer(self.norm(x).astype(x.dtype))
            return x + self.dropout(y, deterministic=deterministic, rngs=rngs)
        y = self.dropout(sublayer(x), deterministic=deterministic, rngs=rngs)
        return self.norm(x + y).astype(x.dtype)


class EncoderLayer(nnx.Module):
    """Self-attention then FFN, each wrapped in a residual + LayerNorm (§3.1).

    ``__call__``: x ``[batch, src_len, d_model]``, mask ``[batch, 1, src_len, src_len]`` →
    ``[batch, src_len, d_model]``.
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int, *, norm: str, dropout_rate: float,
                 attention_dropout_rate: float, activation: str, dtype, rngs: nnx.Rngs):
        self.self_attention = MultiHeadAttention(d_model, num_heads, dtype=dtype, rngs=rngs,
                                                 dropout_rate=attention_dropout_rate)
        self.ffn = FeedForward(d_model, d_ff, activation=activation, dtype=dtype, rngs=rngs)
        self.attention_block = _Residual(d_model, norm, dropout_rate, rngs)
        self.ffn_block = _Residual(d_model, norm, dropout_rate, rngs)

    def __call__(self, x, mask, *, deterministic: bool = True, rngs: nnx.Rngs | None = None):
        kw = dict(deterministic=deterministic, rngs=rngs)
        x = self.attention_block(x, lambda h: self.self_attention(h, h, mask, **kw), **kw)
        return self.ffn_block(x, lambda h: self.ffn(h, **kw), **kw)


class DecoderLayer(nnx.Module):
    """Causal self-attention, cross-attention to the encoder, FFN; each residual (§3.1).

    ``__call__`` (teacher forcing): x ``[batch, tgt_len, d_model]``, cross keys/values
    ``[batch, src_len, heads, head_dim]`` → ``[batch, tgt_len, d_model]``.
    ``decode_step`` (one new position, KV cache): x ``[batch·beam, 1, d_model]``.
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int, *, norm: str, dropout_rate: float,
                 attention_dropout_rate: float, activation: str, dtype, rngs: nnx.Rngs):
        self.self_attention = MultiHeadAttention(d_model, num_heads, dtype=dtype, rngs=rngs,
                                                 dropout_rate=attention_dropout_rate)
        self.cross_attention = MultiHeadAttention(d_model, num_heads, dtype=dtype, rngs=rngs,
                                                  dropout_rate=attention_dropout_rate)
        self.ffn = FeedForward(d_model, d_ff, activation=activation, dtype=dtype, rngs=rngs)
        self.self_block = _Residual(d_model, norm, dropout_rate, rngs)
        self.cross_block = _Residual(d_model, norm, dropout_rate, rngs)
        self.ffn_block = _Residual(d_model, norm, dropout_rate, rngs)

    def __call__(self, x, self_mask, cross_kv, cross_mask, *, deterministic: bool = True,
                 rngs: nnx.Rngs | None = None):
        kw = dict(deterministic=deterministic, rngs=rngs)
        x = self.self_block(x, lambda h: self.self_attention(h, h, self_mask, **kw), **kw)
        x = self.cross_block(x, lambda h: self.cross_attention.attend(h, *cross_kv, cross_mask, **kw),
                             **kw)
        return self.ffn_block(x, lambda h: self.ffn(h, **kw), **kw)

    def decode_step(self, x, cache: dict[str, jax.Array], index: jax.Array, cross_kv, cross_mask,
                    beam_size: int):
        """One decoding position with a KV cache (inference only, no dropout).

        Args:
          x: ``[batch·beam, 1, d_model]``, the embedded token at position ``index``.
          cache: ``{"key", "value"}``, each ``[batch·beam, max_len, heads, head_dim]``.
          index: int scalar, the position being written.
          cross_kv: encoder keys/values ``[batch, src_len, heads, head_dim]``, shared by the
            beams of a sentence (the beams act as ``beam`` query positions).
          cross_mask: bool ``[batch, 1, 1, src_len]``.
          beam_size: beams per sentence.

        Returns:
          ``([batch·beam, 1, d_model], updated cache)``.
        """
        attn = self.self_attention
        new_cache = {}

        def self_attend(h):
            k, v = attn.project_kv(h)
            new_cache["key"] = jax.lax.dynamic_update_slice_in_dim(cache["key"], k, index, axis=1)
            new_cache["value"] = jax.lax.dynamic_update_slice_in_dim(cache["value"], v, index, axis=1)
            max_len = cache["key"].shape[1]
            mask = (jnp.arange(max_len) <= index)[None, None, None, :]
            return attn.attend(h, new_cache["key"], new_cache["value"], mask)

        def cross_attend(h):
            # [batch·beam, 1, d] -> [batch, beam, d]: beams become query positions.
            hb = h.reshape(-1, beam_size, h.shape[-1])
            out = self.cross_attention.attend(hb, *cross_kv, cross_mask)
            return out.reshape(h.shape)

        kw = dict(deterministic=True, rngs=None)
        x = self.self_block(x, self_attend, **kw)
        x = self.cross_block(x, cross_attend, **kw)
        x = self.ffn_block(x, self.ffn, **kw)
        return x, new_cache
