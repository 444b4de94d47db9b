"""Encoder and decoder layers: attention, position-wise FFN, residuals and LayerNorm.

Norm placement (``norm``):
  * ``post`` (Vaswani et al. 2017, §3.1 and §5.4): ``x = LayerNorm(x + Dropout(Sublayer(x)))``.
  * ``pre`` (Wang et al. 2019; Xiong et al. 2020): ``x = x + Dropout(Sublayer(LayerNorm(x)))``,
    with a final LayerNorm after the stack (in ``transformer.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from seq2seq.config import ModelConfig
from seq2seq.model.attention import MultiHeadAttention
from seq2seq.model.axes import logical
from seq2seq.model.lora import Projection
from seq2seq.model.precision import linear_dot_general

ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "relu": jax.nn.relu,
    "gelu": jax.nn.gelu,  # tanh approximation (Hendrycks & Gimpel 2016, §2)
    "gelu_erf": functools.partial(jax.nn.gelu, approximate=False),  # exact: x·Φ(x), with erf
    "swish": jax.nn.silu,  # x·sigmoid(x) (Ramachandran et al. 2017), Marian's ``swish``
    # gated (Shazeer 2020, "GLU Variants Improve Transformer", eqs. 5-6): act(xW) ⊙ xV
    "swiglu": jax.nn.silu,
    "geglu": jax.nn.gelu,
}
GATED = ("swiglu", "geglu")


def layer_norm(d_model: int, rngs: nnx.Rngs, epsilon: float = 1e-6) -> nnx.LayerNorm:
    """LayerNorm (Ba et al. 2016) over the last axis; statistics in float32 (``epsilon``:
    ``model.norm_epsilon``).

    Output is float32; callers cast back to the compute dtype.
    """
    return nnx.LayerNorm(
        d_model,
        epsilon=epsilon,
        dtype=jnp.float32,
        rngs=rngs,
        scale_init=logical(nnx.initializers.ones, ("embed",)),
        bias_init=logical(nnx.initializers.zeros, ("embed",)),
    )


class FeedForward(nnx.Module):
    """Position-wise FFN (Vaswani et al. 2017, eq. 2), optionally gated (Shazeer 2020).

    * ``relu``/``gelu``/``gelu_erf``/``swish``: ``wo(act(wi(x)))`` = W2 · act(W1 x + b1) + b2;
      weights 2·d_model·d_ff.
    * ``swiglu``/``geglu``: ``wo(act(wi_gate(x)) ⊙ wi(x))`` with act = Swish/GELU (Shazeer
      2020, eqs. 5-6); weights 3·d_model·d_ff. Shazeer drops the biases; they are kept here,
      like everywhere else in this model (d_ff per input projection, d_model for ``wo``).

    Input and output ``[batch, length, d_model]``; hidden ``[batch, length, d_ff]``.
    Dropout is applied to the hidden activation at ``activation_dropout_rate``.

    Raises:
      ValueError: unknown activation name.
    """

    def __init__(
        self,
        d_model: int,
        d_ff: int,
        *,
        activation: str = "relu",
        activation_dropout_rate: float = 0.0,
        dtype=jnp.float32,
        matmul_dtype: str | None = None,
        rngs: nnx.Rngs,
    ):
        if activation not in ACTIVATIONS:
            raise ValueError(
                f"unknown activation {activation!r}; choose from {sorted(ACTIVATIONS)}"
            )
        self.activation = ACTIVATIONS[activation]
        init = nnx.initializers.xavier_uniform()
        dot_general = linear_dot_general(matmul_dtype)

        def inner():
            return Projection(
                d_model,
                d_ff,
                dtype=dtype,
                rngs=rngs,
                dot_general=dot_general,
                kernel_init=logical(init, ("embed", "mlp")),
                bias_init=logical(nnx.initializers.zeros, ("mlp",)),
            )

        self.wi = inner()
        self.wi_gate = inner() if activation in GATED else None
        self.wo = Projection(
            d_ff,
            d_model,
            dtype=dtype,
            rngs=rngs,
            dot_general=dot_general,
            kernel_init=logical(init, ("mlp", "embed")),
            bias_init=logical(nnx.initializers.zeros, ("embed",)),
        )
        self.dropout = nnx.Dropout(activation_dropout_rate)

    def __call__(
        self, x: jax.Array, *, deterministic: bool = True, rngs: nnx.Rngs | None = None
    ) -> jax.Array:
        if self.wi_gate is None:
            h = self.activation(self.wi(x))
        else:
            h = self.activation(self.wi_gate(x)) * self.wi(x)
        h = self.dropout(h, deterministic=deterministic, rngs=rngs)
        return self.wo(h)


class _Residual(nnx.Module):
    """One residual sublayer with its LayerNorm and dropout, pre- or post-norm."""

    def __init__(
        self,
        d_model: int,
        norm: str,
        dropout_rate: float,
        rngs: nnx.Rngs,
        epsilon: float = 1e-6,
    ):
        if norm not in ("pre", "post"):
            raise ValueError(f"norm must be 'pre' or 'post', got {norm!r}")
        self.pre = norm == "pre"
        self.norm = layer_norm(d_model, rngs, epsilon)
        self.dropout = nnx.Dropout(dropout_rate)

    def __call__(
        self,
        x: jax.Array,
        sublayer: Callable[[jax.Array], jax.Array],
        *,
        deterministic: bool,
        rngs: nnx.Rngs | None,
    ) -> jax.Array:
        if self.pre:
            y = sublayer(self.norm(x).astype(x.dtype))
            return x + self.dropout(y, deterministic=deterministic, rngs=rngs)
        y = self.dropout(sublayer(x), deterministic=deterministic, rngs=rngs)
        return self.norm(x + y).astype(x.dtype)


def _attention(config: ModelConfig, dtype, rngs: nnx.Rngs) -> MultiHeadAttention:
    return MultiHeadAttention(
        config.d_model,
        config.num_heads,
        dtype=dtype,
        matmul_dtype=config.matmul_dtype,
        rngs=rngs,
        dropout_rate=config.attention_dropout_rate,
        rope_base=config.rope_base,
        implementation=config.attention,
        q_block=config.attention_q_block,
        kv_block=config.attention_kv_block,
    )


def _residual(config: ModelConfig, rngs: nnx.Rngs) -> _Residual:
    return _Residual(
        config.d_model, config.norm, config.residual_dropout, rngs, config.norm_epsilon
    )


def _ffn(config: ModelConfig, dtype, rngs: nnx.Rngs) -> FeedForward:
    return FeedForward(
        config.d_model,
        config.d_ff,
        activation=config.activation,
        activation_dropout_rate=config.activation_dropout_rate,
        dtype=dtype,
        matmul_dtype=config.matmul_dtype,
        rngs=rngs,
    )


class EncoderLayer(nnx.Module):
    """Self-attention then FFN, each wrapped in a residual + LayerNorm (§3.1).

    Args:
      config: model shape, norm placement, activation and dropout rates.
      dtype: compute dtype (parameters float32).
      rngs: initialisation keys.

    ``__call__``: x ``[batch, src_len, d_model]``, mask ``[batch, 1, src_len, src_len]``,
    optional position ``bias`` (float32 ``[batch, heads, src_len, src_len]``) and
    ``rope_positions`` (int ``[batch, src_len]``) → ``[batch, src_len, d_model]``.
    """

    def __init__(self, config: ModelConfig, *, dtype, rngs: nnx.Rngs):
        self.self_attention = _attention(config, dtype, rngs)
        self.ffn = _ffn(config, dtype, rngs)
        self.attention_block = _residual(config, rngs)
        self.ffn_block = _residual(config, rngs)

    def __call__(
        self,
        x,
        mask,
        *,
        bias=None,
        rope_positions=None,
        deterministic: bool = True,
        rngs: nnx.Rngs | None = None,
    ):
        x = self.attention_block(
            x,
            lambda h: self.self_attention(
                h,
                h,
                mask,
                bias=bias,
                rope_positions=rope_positions,
                deterministic=deterministic,
                rngs=rngs,
            ),
            deterministic=deterministic,
            rngs=rngs,
        )
        return self.ffn_block(
            x,
            lambda h: self.ffn(h, deterministic=deterministic, rngs=rngs),
            deterministic=deterministic,
            rngs=rngs,
        )


class DecoderLayer(nnx.Module):
    """Causal self-attention, cross-attention to the encoder, FFN; each residual (§3.1).

    Args: as ``EncoderLayer``.

    ``__call__`` (teacher forcing): x ``[batch, tgt_len, d_model]``, cross keys/values
    ``[batch, src_len, heads, head_dim]``, optional self-attention ``bias``/``rope_positions``
    → ``[batch, tgt_len, d_model]``. Cross-attention has no position term.
    ``decode_step`` (one new position, KV cache): x ``[batch, q, d_model]``, q queries per row
    at the same position.
    """

    def __init__(self, config: ModelConfig, *, dtype, rngs: nnx.Rngs):
        self.self_attention = _attention(config, dtype, rngs)
        self.cross_attention = _attention(config, dtype, rngs)
        self.ffn = _ffn(config, dtype, rngs)
        self.self_block = _residual(config, rngs)
        self.cross_block = _residual(config, rngs)
        self.ffn_block = _residual(config, rngs)

    def __call__(
        self,
        x,
        self_mask,
        cross_kv,
        cross_mask,
        *,
        bias=None,
        rope_positions=None,
        deterministic: bool = True,
        rngs: nnx.Rngs | None = None,
    ):
        cross_key, cross_value = cross_kv
        x = self.self_block(
            x,
            lambda h: self.self_attention(
                h,
                h,
                self_mask,
                bias=bias,
                rope_positions=rope_positions,
                deterministic=deterministic,
                rngs=rngs,
            ),
            deterministic=deterministic,
            rngs=rngs,
        )
        x = self.cross_block(
            x,
            lambda h: self.cross_attention.attend(
                h, cross_key, cross_value, cross_mask, deterministic=deterministic, rngs=rngs
            ),
            deterministic=deterministic,
            rngs=rngs,
        )
        return self.ffn_block(
            x,
            lambda h: self.ffn(h, deterministic=deterministic, rngs=rngs),
            deterministic=deterministic,
            rngs=rngs,
        )

    def decode_step(
        self,
        x,
        key_cache,
        value_cache,
        write,
        self_mask,
        cross_kv,
        cross_mask,
        *,
        bias=None,
        rope_positions=None,
    ):
        """One decoding position with a KV cache (inference only, no dropout).

        The ``q`` queries of a row write their self-attention keys/values into slots
        ``write .. write+q-1`` and attend to the slots ``self_mask`` allows; which slots those
        are is the caller's choice (``Transformer.decode_step``).

        Args:
          x: ``[batch, q, d_model]``, the embedded tokens at the current position.
          key_cache: ``[batch, heads, head_dim, slots]``; value_cache: ``[batch, heads, slots,
            head_dim]`` (head-major, see ``cached_attention``); keys are stored already rotated
            when RoPE is used.
          write: int scalar, the slot of query 0.
          self_mask: bool ``[batch, 1, q, slots]``: the slots each query reads.
          cross_kv: encoder keys ``[batch, heads, head_dim, src_len]`` and values
            ``[batch, heads, src_len, head_dim]`` (``project_kv_cache``), read by all ``q``
            queries of a row.
          cross_mask: bool ``[batch, 1, 1, src_len]``.
          bias: float32 ``[1, heads, 1, slots]``: position bias of the current position against
            every slot (relative/ALiBi), or None.
          rope_positions: int ``[1, 1]`` holding the current position (RoPE), or None.

        Returns:
          ``[batch, q, d_model]`` and the updated key and value caches.
        """
        attn = self.self_attention
        new = {}

        def self_attend(h):
            k, v = attn.project_kv(h, rope_positions)  # [batch, q, heads, head_dim]
            new["key"] = jax.lax.dynamic_update_slice_in_dim(
                key_cache, k.transpose(0, 2, 3, 1), write, axis=3
            )
            new["value"] = jax.lax.dynamic_update_slice_in_dim(
                value_cache, v.transpose(0, 2, 1, 3), write, axis=2
            )
            return attn.attend_cache(
                h, new["key"], new["value"], self_mask, bias=bias, rope_positions=rope_positions
            )

        def cross_attend(h):
            return self.cross_attention.attend_cache(h, *cross_kv, cross_mask)

        kw = dict(deterministic=True, rngs=None)
        x = self.self_block(x, self_attend, **kw)
        x = self.cross_block(x, cross_attend, **kw)
        x = self.ffn_block(x, self.ffn, **kw)
        return x, new["key"], new["value"]
