"""The Transformer encoder-decoder (Vaswani et al. 2017, §3) in Flax NNX.

Inputs are int32 token ids ``[batch, length]`` with segment ids (0 = padding; packed rows hold
several segments) and per-segment positions. Embeddings are scaled by √d_model (§3.4; unless
``model.scale_embeddings`` is false); the
position signal (``model.positions``, see ``positions.py``) is added to them or acts inside
self-attention. The embedding matrices are shared as ``model.share_embeddings`` says (§3.4).
Logits are returned in float32.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx, struct

from seq2seq.config import ModelConfig
from seq2seq.model.attention import MultiHeadAttention, SegmentMask
from seq2seq.model.axes import logical
from seq2seq.model.layers import DecoderLayer, EncoderLayer, layer_norm
from seq2seq.model.positions import Positions
from seq2seq.model.precision import matmul, operand_dtype


def shift_right(targets: jax.Array, segments: jax.Array, bos_id: int, pad_id: int = 0) -> jax.Array:
    """Teacher-forcing decoder input: each segment's tokens moved one step right, BOS first.

    Every segment of a packed row starts with BOS (not the previous segment's last token), and
    padding stays padding.

    Args:
      targets: int ``[batch, length]`` target ids (each segment ends with EOS).
      segments: int ``[batch, length]`` segment ids, 0 = padding.
      bos_id / pad_id: ids from the tokenizer.

    Returns:
      int ``[batch, length]`` decoder inputs.
    """
    prev_tokens = jnp.pad(targets, ((0, 0), (1, 0)), constant_values=pad_id)[:, :-1]
    prev_segments = jnp.pad(segments, ((0, 0), (1, 0)))[:, :-1]
    starts = segments != prev_segments
    shifted = jnp.where(starts, bos_id, prev_tokens)
    return jnp.where(segments > 0, shifted, pad_id).astype(targets.dtype)


@struct.dataclass
class DecoderCache:
    """What incremental decoding keeps between steps (``Transformer.init_cache``/``decode_step``).

    Each batch row has ``slots`` self-attention slots. The model writes a step's keys and values
    where ``decode_step``'s caller says and every query reads the slots its mask allows: which
    hypothesis owns which slot is the caller's business (``seq2seq.decoding``). Keys and values
    are head-major, the layout ``cached_attention`` reads without a transposed copy. L is the
    number of decoder layers; arrays are in the compute dtype unless noted.

    Attributes:
      self_key: L arrays ``[batch, heads, head_dim, slots]``, self-attention keys (rotated
        already under RoPE); unwritten slots hold zeros.
      self_value: L arrays ``[batch, heads, slots, head_dim]``.
      slot_positions: int32 ``[slots]``, the decoder position each slot was written at (for
        relative/ALiBi biases; 0 where nothing was written).
      cross_key: L arrays ``[batch, heads, head_dim, src_len]``, the encoder output's keys.
      cross_value: L arrays ``[batch, heads, src_len, head_dim]``.
      cross_mask: bool ``[batch, 1, 1, src_len]``, True at real source tokens.
    """

    self_key: tuple[jax.Array, ...]
    self_value: tuple[jax.Array, ...]
    slot_positions: jax.Array
    cross_key: tuple[jax.Array, ...]
    cross_value: tuple[jax.Array, ...]
    cross_mask: jax.Array


class Transformer(nnx.Module):
    """Encoder-decoder Transformer (Vaswani et al. 2017, Fig. 1).

    Parameters (all float32, with logical axis names): ``embed`` [vocab, d_model] (source; also
    target and output projection when ``share_embeddings`` is ``all``), ``target_embed``
    (``target``/``none``; the output projection too under ``target``), ``output``
    [d_model, vocab] without bias (``none``), ``encoder_positions``/``decoder_positions`` (a
    learned table or relative-bias table when the scheme has one), the layers, for
    pre-norm ``encoder_norm``/``decoder_norm``, and ``logits_bias`` [vocab] under
    ``model.logits_bias``.

    Args:
      config: ``ModelConfig``; ``vocab_size`` must be set (> 0); ``src_vocab_size`` (if not 0)
        sizes the source embedding, which then cannot be shared.
      rngs: initialisation keys (``params``).

    Raises:
      ValueError: vocab_size is not set, src_vocab_size differs from it with shared
        embeddings, or the shape settings are inconsistent.
    """

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        if config.vocab_size <= 0:
            raise ValueError("model.vocab_size must be set (it is filled from the tokenizer)")
        self.config = config
        dtype = jnp.dtype(config.dtype)
        self.dtype = dtype
        # operands of the logits' product (None: as they are in the compute dtype)
        self.matmul_dtype = operand_dtype(config.matmul_dtype)
        d, vocab = config.d_model, config.vocab_size
        # N(0, d^-1/2) so that embeddings × √d have unit scale (tensor2tensor practice).
        embed_init = logical(nnx.initializers.normal(stddev=d**-0.5), ("vocab", "embed"))
        src_vocab = config.src_vocab_size or vocab
        if config.share_embeddings == "all" and src_vocab != vocab:
            raise ValueError(
                f"model.src_vocab_size={src_vocab} differs from model.vocab_size="
                f"{vocab}: set model.share_embeddings to 'target' or 'none'"
            )
        self.embed = nnx.Embed(src_vocab, d, dtype=dtype, embedding_init=embed_init, rngs=rngs)
        if config.share_embeddings != "all":
            self.target_embed = nnx.Embed(
                vocab, d, dtype=dtype, embedding_init=embed_init, rngs=rngs
            )
        if config.share_embeddings == "none":
            self.output = nnx.Linear(
                d,
                vocab,
                use_bias=False,
                dtype=dtype,
                rngs=rngs,
                kernel_init=logical(nnx.initializers.xavier_uniform(), ("embed", "vocab")),
            )
        self.encoder_positions = Positions(
            config.positions,
            d,
            config.num_heads,
            causal=False,
            max_len=config.max_len,
            relpos_buckets=config.relpos_buckets,
            relpos_max_distance=config.relpos_max_distance,
            sinusoidal_layout=config.sinusoidal_layout,
            rngs=rngs,
        )
        self.decoder_positions = Positions(
            config.positions,
            d,
            config.num_heads,
            causal=True,
            max_len=config.max_len,
            relpos_buckets=config.relpos_buckets,
            relpos_max_distance=config.relpos_max_distance,
            sinusoidal_layout=config.sinusoidal_layout,
            rngs=rngs,
        )
        self.encoder_layers = nnx.List(
            [EncoderLayer(config, dtype=dtype, rngs=rngs) for _ in range(config.num_encoder_layers)]
        )
        self.decoder_layers = nnx.List(
            [DecoderLayer(config, dtype=dtype, rngs=rngs) for _ in range(config.num_decoder_layers)]
        )
        if config.norm == "pre":
            self.encoder_norm = layer_norm(d, rngs, config.norm_epsilon)
            self.decoder_norm = layer_norm(d, rngs, config.norm_epsilon)
        if config.logits_bias:
            bias_init = logical(nnx.initializers.zeros, ("vocab",))
            self.logits_bias = nnx.Param(bias_init(rngs.params(), (vocab,), jnp.float32))
        self.dropout = nnx.Dropout(config.residual_dropout)

    # -- embeddings -------------------------------------------------------------------------
    def _target_embedding(self) -> nnx.Embed:
        return self.embed if self.config.share_embeddings == "all" else self.target_embed

    def _embed(
        self,
        table: nnx.Embed,
        positions: Positions,
        tokens,
        token_positions,
        *,
        deterministic,
        rngs,
    ):
        x = table(tokens)
        if self.config.scale_embeddings:
            x = x * jnp.sqrt(self.config.d_model).astype(self.dtype)
        x = positions.add(x, token_positions)
        return self.dropout(x, deterministic=deterministic, rngs=rngs)

    def logits(self, x: jax.Array) -> jax.Array:
        """Output projection ``[..., d_model]`` → float32 ``[..., vocab]``.

        The final decoder LayerNorm (pre-norm) is applied here, then the (tied) target
        embedding transposed, or the separate ``output`` matrix under ``share_embeddings: none``,
        multiplied in the compute dtype and accumulated in float32; plus ``logits_bias``
        (float32 ``[vocab]``) under ``model.logits_bias``.
        """
        if self.config.norm == "pre":
            x = self.decoder_norm(x)  # float32 statistics; cast to the compute dtype below
        # float32 accumulation and a float32 result whatever the compute dtype (precision.py)
        x = x.astype(self.dtype)
        if self.config.share_embeddings == "none":
            kernel = self.output.kernel[...].astype(self.dtype)
            logits = matmul(x, kernel, out_dtype=jnp.float32, operand_dtype=self.matmul_dtype)
        else:
            table = self._target_embedding().embedding[...].astype(self.dtype)
            logits = matmul(
                x, table, w_transposed=True, out_dtype=jnp.float32, operand_dtype=self.matmul_dtype
            )
        if self.config.logits_bias:
            logits = logits + self.logits_bias[...]
        return logits

    # -- masks and biases -------------------------------------------------------------------
    def _mask(self, mask: SegmentMask) -> SegmentMask | jax.Array:
        """Built once per stack for ``dense``/``cudnn``; ``chunked`` builds it block by block."""
        return mask if self.config.attention == "chunked" else mask.dense()

    def _bias(self, pos: Positions, q_positions: jax.Array, k_positions: jax.Array):
        """The stack's position bias: a ``PositionBias`` for ``chunked``, else built (or None)."""
        lazy = pos.lazy_bias(q_positions, k_positions)
        if lazy is None or self.config.attention == "chunked":
            return lazy
        return lazy.dense()

    # -- encoder ----------------------------------------------------------------------------
    def encode(
        self,
        src: jax.Array,
        src_segments: jax.Array,
        src_positions: jax.Array,
        *,
        deterministic: bool = True,
        rngs: nnx.Rngs | None = None,
    ) -> jax.Array:
        """Encoder stack.

        Args:
          src, src_segments, src_positions: int32 ``[batch, src_len]``.

        Returns:
          ``[batch, src_len, d_model]`` in the compute dtype.

        Raises:
          ValueError: ``learned`` positions and src_len > ``model.max_len``.
        """
        pos = self.encoder_positions
        pos.check_length(src.shape[1])
        x = self._embed(self.embed, pos, src, src_positions, deterministic=deterministic, rngs=rngs)
        mask = self._mask(SegmentMask(src_segments, src_segments))
        bias = self._bias(pos, src_positions, src_positions)
        rope = pos.rope(src_positions)
        for layer in self.encoder_layers:
            x = layer(
                x, mask, bias=bias, rope_positions=rope, deterministic=deterministic, rngs=rngs
            )
        if self.config.norm == "pre":
            x = self.encoder_norm(x).astype(self.dtype)
        return x

    # -- decoder (teacher forcing) ----------------------------------------------------------
    def decode(
        self,
        tgt_in: jax.Array,
        tgt_segments: jax.Array,
        tgt_positions: jax.Array,
        encoded: jax.Array,
        src_segments: jax.Array,
        *,
        deterministic: bool = True,
        rngs: nnx.Rngs | None = None,
    ) -> jax.Array:
        """Decoder stack over a whole (shifted) target sequence.

        Args:
          tgt_in: int32 ``[batch, tgt_len]`` decoder inputs (``shift_right`` of the targets).
          tgt_segments, tgt_positions: int32 ``[batch, tgt_len]``.
          encoded: ``[batch, src_len, d_model]`` encoder output.
          src_segments: int32 ``[batch, src_len]``.

        Returns:
          float32 logits ``[batch, tgt_len, vocab]``.

        Raises:
          ValueError: ``learned`` positions and tgt_len > ``model.max_len``.
        """
        pos = self.decoder_positions
        pos.check_length(tgt_in.shape[1])
        x = self._embed(
            self._target_embedding(),
            pos,
            tgt_in,
            tgt_positions,
            deterministic=deterministic,
            rngs=rngs,
        )
        self_mask = self._mask(SegmentMask(tgt_segments, tgt_segments, causal=True))
        cross_mask = self._mask(SegmentMask(tgt_segments, src_segments))
        bias = self._bias(pos, tgt_positions, tgt_positions)
        rope = pos.rope(tgt_positions)
        for layer in self.decoder_layers:
            cross_kv = layer.cross_attention.project_kv(encoded)
            x = layer(
                x,
                self_mask,
                cross_kv,
                cross_mask,
                bias=bias,
                rope_positions=rope,
                deterministic=deterministic,
                rngs=rngs,
            )
        return self.logits(x)

    def __call__(
        self,
        batch: dict[str, jax.Array],
        *,
        bos_id: int,
        deterministic: bool = True,
        rngs: nnx.Rngs | None = None,
    ) -> jax.Array:
        """Teacher-forced logits for a batch.

        Args:
          batch: int32 arrays ``src``, ``src_segments``, ``src_positions`` ``[batch, src_len]``
            and ``tgt``, ``tgt_segments``, ``tgt_positions`` ``[batch, tgt_len]`` (``tgt`` are
            the output tokens, each segment ending in EOS).
          bos_id: id that starts every target segment.
          deterministic: no dropout when True; else ``rngs`` must provide ``dropout`` keys.

        Returns:
          float32 ``[batch, tgt_len, vocab]``.

        Raises:
          ValueError: ``learned`` positions and a side longer than ``model.max_len``.
        """
        encoded = self.encode(
            batch["src"],
            batch["src_segments"],
            batch["src_positions"],
            deterministic=deterministic,
            rngs=rngs,
        )
        tgt_in = shift_right(batch["tgt"], batch["tgt_segments"], bos_id)
        return self.decode(
            tgt_in,
            batch["tgt_segments"],
            batch["tgt_positions"],
            encoded,
            batch["src_segments"],
            deterministic=deterministic,
            rngs=rngs,
        )

    def attention_weights(
        self, batch: dict[str, jax.Array], *, bos_id: int
    ) -> dict[str, jax.Array]:
        """Attention weights of a teacher-forced batch, for inspection (no dropout).

        Runs ``__call__`` on a view of the model whose attention modules take the explicit
        path and sow their weights (``nnx.view`` + ``nnx.capture``); the model itself is left
        unchanged. Works eagerly or inside ``nnx.jit``.

        Args:
          batch, bos_id: as ``__call__``.

        Returns:
          float32 arrays, each row a softmax over keys (masked keys get 0):
          ``encoder`` ``[enc_layers, batch, heads, src_len, src_len]``,
          ``decoder`` ``[dec_layers, batch, heads, tgt_len, tgt_len]`` (self-attention),
          ``cross`` ``[dec_layers, batch, heads, tgt_len, src_len]``, and
          ``logits`` float32 ``[batch, tgt_len, vocab]`` (equal to ``__call__``'s).
        """
        view = nnx.view(self, only=MultiHeadAttention, sow_weights=True)
        logits, sown = nnx.capture(view, nnx.Intermediate)(batch, bos_id=bos_id)

        def stack(layers, name):
            return jnp.stack(
                [
                    sown[layers][i][name]["attention_weights"][0]
                    for i in range(len(getattr(self, layers)))
                ]
            )

        return {
            "encoder": stack("encoder_layers", "self_attention"),
            "decoder": stack("decoder_layers", "self_attention"),
            "cross": stack("decoder_layers", "cross_attention"),
            "logits": logits,
        }

    # -- incremental decoding ---------------------------------------------------------------
    def init_cache(
        self, encoded: jax.Array, src_segments: jax.Array, *, max_len: int, slots: int
    ) -> DecoderCache:
        """An empty self-attention cache of ``slots`` slots per row, and the cross-attention
        keys/values of ``encoded`` (computed once here, not at every step).

        Args:
          encoded: ``[batch, src_len, d_model]`` encoder output.
          src_segments: int32 ``[batch, src_len]``.
          max_len: decoder positions that will be decoded.
          slots: self-attention slots per row (e.g. ``max_len`` for one hypothesis per row).

        Returns:
          a ``DecoderCache`` with ``batch`` rows.

        Raises:
          ValueError: ``learned`` positions and max_len > ``model.max_len``.
        """
        self.decoder_positions.check_length(max_len)
        batch = encoded.shape[0]
        heads = self.config.num_heads
        head_dim = self.config.d_model // heads
        n = len(self.decoder_layers)
        cross = [layer.cross_attention.project_kv_cache(encoded) for layer in self.decoder_layers]
        return DecoderCache(
            self_key=tuple(
                jnp.zeros((batch, heads, head_dim, slots), self.dtype) for _ in range(n)
            ),
            self_value=tuple(
                jnp.zeros((batch, heads, slots, head_dim), self.dtype) for _ in range(n)
            ),
            slot_positions=jnp.zeros((slots,), jnp.int32),
            cross_key=tuple(k for k, _ in cross),
            cross_value=tuple(v for _, v in cross),
            cross_mask=(src_segments > 0)[:, None, None, :],
        )

    def decode_step(
        self,
        tokens: jax.Array,
        position: jax.Array,
        cache: DecoderCache,
        *,
        write: jax.Array,
        mask: jax.Array,
    ) -> tuple[jax.Array, DecoderCache]:
        """Logits for the next token after ``tokens``, all at decoder position ``position``.

        The ``q`` queries of a row write their keys and values into slots ``write .. write+q-1``
        of that row and attend to the slots ``mask`` allows (their own new slot among them).
        RoPE keys are rotated before they are cached; relative/ALiBi biases use ``position``
        against each slot's ``slot_positions``.

        Args:
          tokens: int32 ``[batch, q]``, the tokens at ``position`` (BOS at 0).
          position: int32 scalar decoder position.
          cache: from ``init_cache`` or a previous step.
          write: int32 scalar, the slot of query 0; ``write + q`` ≤ slots.
          mask: bool ``[batch, q, slots]``, True where a query attends.

        Returns:
          float32 logits ``[batch, q, vocab]`` and the updated cache.
        """
        pos = self.decoder_positions
        q = tokens.shape[1]
        slot_positions = jax.lax.dynamic_update_slice_in_dim(
            cache.slot_positions, jnp.full((q,), position, jnp.int32), write, axis=0
        )
        query_pos = jnp.reshape(position, (1, 1)).astype(jnp.int32)
        x = self._embed(
            self._target_embedding(), pos, tokens, query_pos, deterministic=True, rngs=None
        )
        bias = pos.bias(query_pos, slot_positions[None])  # [1, heads, 1, slots] or None
        rope = pos.rope(query_pos)
        keys, values = [], []
        layers = zip(
            self.decoder_layers,
            cache.self_key,
            cache.self_value,
            cache.cross_key,
            cache.cross_value,
        )
        for layer, key, value, cross_key, cross_value in layers:
            x, key, value = layer.decode_step(
                x,
                key,
                value,
                write,
                mask[:, None],
                (cross_key, cross_value),
                cache.cross_mask,
                bias=bias,
                rope_positions=rope,
            )
            keys.append(key)
            values.append(value)
        return self.logits(x), dataclasses.replace(
            cache, self_key=tuple(keys), self_value=tuple(values), slot_positions=slot_positions
        )


def build_model(config: ModelConfig, seed: int = 0) -> Transformer:
    """A freshly initialised Transformer from ``config`` and an integer seed.

    Under ``nnx.eval_shape(lambda: build_model(config))`` nothing is allocated (for parameter
    counts and presets).
    """
    return Transformer(config, rngs=nnx.Rngs(params=seed))
