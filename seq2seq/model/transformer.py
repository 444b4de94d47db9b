"""The Transformer encoder-decoder (Vaswani et al. 2017, §3) in Flax NNX.

Inputs are int32 token ids ``[batch, length]`` with segment ids (0 = padding; packed rows hold
several segments) and per-segment positions. Embeddings are scaled by √d_model and summed with
sinusoidal positions (§3.4, §3.5). One embedding matrix can serve source, target and the output
projection (§3.4, "share_embeddings"). Logits are returned in float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from seq2seq.config import ModelConfig
from seq2seq.model.axes import logical
from seq2seq.model.attention import causal_segment_mask, segment_mask
from seq2seq.model.layers import DecoderLayer, EncoderLayer, layer_norm
from seq2seq.model.positions import sinusoidal_embedding

Cache = dict[str, object]


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


class Transformer(nnx.Module):
    """Encoder-decoder Transformer (Vaswani et al. 2017, Fig. 1).

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
        d = config.d_model
        # N(0, d^-1/2) so that embeddings × √d have unit scale (tensor2tensor practice).
        embed_init = logical(nnx.initializers.normal(stddev=d ** -0.5), ("vocab", "embed"))
        src_vocab = config.src_vocab_size or config.vocab_size
        if config.share_embeddings and src_vocab != config.vocab_size:
            raise ValueError(f"model.src_vocab_size={src_vocab} differs from model.vocab_size="
                             f"{config.vocab_size}: set model.share_embeddings=false")
        self.embed = nnx.Embed(src_vocab, d, dtype=dtype, embedding_init=embed_init, rngs=rngs)
        if not config.share_embeddings:
            self.target_embed = nnx.Embed(config.vocab_size, d, dtype=dtype,
                                          embedding_init=embed_init, rngs=rngs)
        layer_kw = dict(norm=config.norm, dropout_rate=config.dropout_rate,
                        attention_dropout_rate=config.attention_dropout_rate,
                        activation=config.activation, dtype=dtype, rngs=rngs)
        self.encoder_layers = nnx.List([
            EncoderLayer(d, config.num_heads, config.d_ff, **layer_kw)
            for _ in range(config.num_encoder_layers)])
        self.decoder_layers = nnx.List([
            DecoderLayer(d, config.num_heads, config.d_ff, **layer_kw)
            for _ in range(config.num_decoder_layers)])
        if config.norm == "pre":
            self.encoder_norm = layer_norm(d, rngs)
            self.decoder_norm = layer_norm(d, rngs)
        self.dropout = nnx.Dropout(config.dropout_rate)

    # -- embeddings -------------------------------------------------------------------------
    def _target_embedding(self) -> nnx.Embed:
        return self.embed if self.config.share_embeddings else self.target_embed

    def _embed(self, table: nnx.Embed, tokens, positions, *, deterministic, rngs):
        x = table(tokens) * jnp.sqrt(self.config.d_model).astype(self.dtype)
        x = x + sinusoidal_embedding(positions, self.config.d_model).astype(self.dtype)
        return self.dropout(x, deterministic=deterministic, rngs=rngs)

    def logits(self, x: jax.Array) -> jax.Array:
        """Output projection with the (shared) target embedding: ``[..., d_model]`` → float32 ``[..., vocab]``."""
        if self.config.norm == "pre":
            x = self.decoder_norm(x).astype(self.dtype)
        return self._target_embedding().attend(x).astype(jnp.float32)

    # -- encoder ----------------------------------------------------------------------------
    def encode(self, src: jax.Array, src_segments: jax.Array, src_positions: jax.Array, *,
               deterministic: bool = True, rngs: nnx.Rngs | None = None) -> jax.Array:
        """Encoder stack.

        Args:
          src, src_segments, src_positions: int32 ``[batch, src_len]``.

        Returns:
          ``[batch, src_len, d_model]`` in the compute dtype.
        """
        x = self._embed(self.embed, src, src_positions, deterministic=deterministic, rngs=rngs)
        mask = segment_mask(src_segments, src_segments)
        for layer in self.encoder_layers:
            x = layer(x, mask, deterministic=deterministic, rngs=rngs)
        if self.config.norm == "pre":
            x = self.encoder_norm(x).astype(self.dtype)
        return x

    # -- decoder (teacher forcing) ----------------------------------------------------------
    def decode(self, tgt_in: jax.Array, tgt_segments: jax.Array, tgt_positions: jax.Array,
               encoded: jax.Array, src_segments: jax.Array, *, deterministic: bool = True,
               rngs: nnx.Rngs | None = None) -> jax.Array:
        """Decoder stack over a whole (shifted) target sequence.

        Args:
          tgt_in: int32 ``[batch, tgt_len]`` decoder inputs (``shift_right`` of the targets).
          tgt_segments, tgt_positions: int32 ``[batch, tgt_len]``.
          encoded: ``[batch, src_len, d_model]`` encoder output.
          src_segments: int32 ``[batch, src_len]``.

        Returns:
          float32 logits ``[batch, tgt_len, vocab]``.
        """
        x = self._embed(self._target_embedding(), tgt_in, tgt_positions,
                        deterministic=deterministic, rngs=rngs)
        self_mask = causal_segment_mask(tgt_segments)
        cross_mask = segment_mask(tgt_segments, src_segments)
        for layer in self.decoder_layers:
            cross_kv = layer.cross_attention.project_kv(encoded)
            x = layer(x, self_mask, cross_kv, cross_mask, deterministic=deterministic, rngs=rngs)
        return self.logits(x)

    def __call__(self, batch: dict[str, jax.Array], *, bos_id: int, deterministic: bool = True,
                 rngs: nnx.Rngs | None = None) -> jax.Array:
        """Teacher-forced logits for a batch.

        Args:
          batch: int32 arrays ``src``, ``src_segments``, ``src_positions`` ``[batch, src_len]``
            and ``tgt``, ``tgt_segments``, ``tgt_positions`` ``[batch, tgt_len]`` (``tgt`` are
            the output tokens, each segment ending in EOS).
          bos_id: id that starts every target segment.

        Returns:
          float32 ``[batch, tgt_len, vocab]``.
        """
        encoded = self.encode(batch["src"], batch["src_segments"], batch["src_positions"],
                              deterministic=deterministic, rngs=rngs)
        tgt_in = shift_right(batch["tgt"], batch["tgt_segments"], bos_id)
        return self.decode(tgt_in, batch["tgt_segments"], batch["tgt_positions"], encoded,
                           batch["src_segments"], deterministic=deterministic, rngs=rngs)

    # -- incremental decoding ---------------------------------------------------------------
    def init_cache(self, encoded: jax.Array, src_segments: jax.Array, beam_size: int,
                   max_len: int) -> Cache:
        """Decoding cache: empty self-attention keys/values and the cross-attention ones.

        Cross-attention keys/values are computed once per sentence (not per beam).

        Args:
          encoded: ``[batch, src_len, d_model]``.
          src_segments: int32 ``[batch, src_len]``.
          beam_size: beams per sentence.
          max_len: decoder positions to reserve.

        Returns:
          ``{"layers": [{"key", "value"} of [batch·beam, max_len, heads, head_dim]],
          "cross": [(key, value) of [batch, src_len, heads, head_dim]],
          "cross_mask": bool [batch, 1, 1, src_len]}``.
        """
        batch = encoded.shape[0]
        heads = self.config.num_heads
        head_dim = self.config.d_model // heads
        shape = (batch * beam_size, max_len, heads, head_dim)
        layers = [{"key": jnp.zeros(shape, self.dtype), "value": jnp.zeros(shape, self.dtype)}
                  for _ in self.decoder_layers]
        cross = [layer.cross_attention.project_kv(encoded) for layer in self.decoder_layers]
        return {"layers": layers, "cross": cross, "cross_mask": (src_segments > 0)[:, None, None, :]}

    def decode_step(self, tokens: jax.Array, index: jax.Array, cache: Cache,
                    beam_size: int) -> tuple[jax.Array, Cache]:
        """Logits for the next token given the token at position ``index``.

        Args:
          tokens: int32 ``[batch·beam]`` tokens at position ``index`` (BOS at 0).
          index: int32 scalar position.
          cache: from ``init_cache`` or a previous step.
          beam_size: beams per sentence.

        Returns:
          float32 logits ``[batch·beam, vocab]`` and the updated cache.
        """
        positions = jnp.full((tokens.shape[0], 1), index, jnp.int32)
        x = self._embed(self._target_embedding(), tokens[:, None], positions, deterministic=True,
                        rngs=None)
        new_layers = []
        for layer, layer_cache, cross_kv in zip(self.decoder_layers, cache["layers"], cache["cross"]):
            x, layer_cache = layer.decode_step(x, layer_cache, index, cross_kv, cache["cross_mask"],
                                               beam_size)
            new_layers.append(layer_cache)
        return self.logits(x[:, 0]), {**cache, "layers": new_layers}


def build_model(config: ModelConfig, seed: int = 0) -> Transformer:
    """A freshly initialised Transformer from ``config`` and an integer seed."""
    return Transformer(config, rngs=nnx.Rngs(params=seed))
