"""A CTranslate2 converter for this toolkit's Transformer (``seq2seq-export --to ctranslate2``).

It fills CTranslate2's own ``TransformerSpec`` (``ctranslate2.specs``) from the flat parameter
names of ``seq2seq.export.flat_params`` through the library's ``Converter`` base class, so the
output is whatever the installed CTranslate2 writes and validates. The mapping:

* CTranslate2's ``Linear`` weights are ``[out, in]``; ``nnx.Linear`` kernels are ``[in, out]``
  (transposed here). Self-attention's Q, K, V are one fused ``[3·d, d]`` projection, the
  cross-attention's K, V one ``[2·d, d]`` projection.
* Each ``_Residual``'s LayerNorm is the ``layer_norm`` of the sublayer it wraps (CTranslate2
  applies it before the sublayer when ``pre_norm``, after the residual add otherwise); the
  pre-norm stacks' final norms are the encoder's and decoder's ``layer_norm``. ε
  (``model.norm_epsilon``) goes into the model config.
* Gated FFNs: ``linear_0`` is the activated projection (``wi_gate``), ``linear_0_noact`` the
  linear one (``wi``). ``gelu`` (``jax.nn.gelu``, the tanh approximation) is
  ``Activation.GELUTanh``; ``gelu_erf`` is ``Activation.GELU``, which CTranslate2 computes as
  0.5·x·(1 + erf(x/√2)) (``src/cpu/kernels.cc``, ``gelu_func``).
* Embeddings are scaled by √d_model in both unless ``model.scale_embeddings`` is false
  (CTranslate2's ``scale_embeddings``). The output projection is the tied target embedding,
  or ``output.kernel`` transposed; its bias is ``logits_bias`` under ``model.logits_bias``.
  ``swish`` is ``Activation.SWISH``.
* Positions: ``sinusoidal`` (in ``model.sinusoidal_layout``; CTranslate2's built-in table
  is the ``halves`` one) and ``learned`` are written as explicit tables, ``none`` as a zero table;
  ``relative`` is CTranslate2's T5 ``relative_attention_bias`` (same buckets, one table per
  stack shared by its layers, added after the 1/√d_k scaling, which CTranslate2 keeps);
  ``rope`` is CTranslate2's rotary embedding over the whole head with the half-split pairing
  (``rotary_interleave=False``). ``alibi`` has no encoder-decoder counterpart in CTranslate2.

Importing this module needs the ``ctranslate2`` package (the ``export`` extra).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import jax.numpy as jnp
import numpy as np
from ctranslate2.converters import Converter
from ctranslate2.specs import common_spec, transformer_spec

from seq2seq.config import ModelConfig
from seq2seq.model.positions import sinusoidal_embedding

ACTIVATIONS = {
    "relu": common_spec.Activation.RELU,
    "gelu": common_spec.Activation.GELUTanh,
    "gelu_erf": common_spec.Activation.GELU,
    "swish": common_spec.Activation.SWISH,
    "swiglu": common_spec.Activation.SWISH,
    "geglu": common_spec.Activation.GELUTanh,
}
# Rows of the position table written for the schemes without a learned one (sinusoidal, none):
# CTranslate2 reads positions past the table as an error, and 2048 exceeds any default limit.
POSITION_TABLE_ROWS = 2048


class Seq2seqConverter(Converter):
    """``ctranslate2.converters.Converter`` for one trained model.

    Args:
      config: the run's ``ModelConfig`` (``vocab_size`` filled in).
      params: float32 arrays by flat name (``seq2seq.export.flat_params``).
      source_vocabulary / target_vocabulary: the SentencePiece pieces in id order.
      special: the pieces of the ``unk``, ``bos`` and ``eos`` ids.

    ``convert(output_dir, quantization=..., force=...)`` (inherited) writes ``model.bin``,
    ``config.json`` and the vocabularies.

    Raises (from ``convert``):
      ValueError: ``model.positions=alibi`` (``seq2seq.export.check_ctranslate2`` says why).
    """

    def __init__(
        self,
        config: ModelConfig,
        params: Mapping[str, np.ndarray],
        source_vocabulary: Sequence[str],
        target_vocabulary: Sequence[str],
        special: Mapping[str, str],
    ):
        self.config, self.params = config, params
        self.source_vocabulary, self.target_vocabulary = source_vocabulary, target_vocabulary
        self.special = special

    def _load(self):
        m = self.config
        if m.positions == "alibi":
            raise ValueError("model.positions=alibi has no CTranslate2 encoder-decoder form")
        rope = m.positions == "rope"
        relative = m.positions == "relative"
        shape = dict(
            pre_norm=m.norm == "pre",
            activation=ACTIVATIONS[m.activation],
            ffn_glu=m.activation in ("swiglu", "geglu"),
            relative_attention_bias=relative,
        )
        rotary = (
            dict(rotary_dim=0, rotary_interleave=False, rotary_base=m.rope_base) if rope else {}
        )
        encoder = transformer_spec.TransformerEncoderSpec(
            m.num_encoder_layers, m.num_heads, **shape, **rotary
        )
        decoder = transformer_spec.TransformerDecoderSpec(
            m.num_decoder_layers, m.num_heads, **shape, **rotary
        )
        if rope:  # the encoder spec keeps an absolute table next to its rotary attention
            del encoder.position_encodings
        spec = transformer_spec.TransformerSpec(encoder, decoder)
        self._set_encoder(spec.encoder)
        self._set_decoder(spec.decoder)
        spec.config.unk_token = self.special["unk"]
        spec.config.bos_token = self.special["bos"]
        spec.config.eos_token = self.special["eos"]
        spec.config.decoder_start_token = self.special["bos"]
        spec.config.add_source_eos = True  # our sources end with EOS (Tokenizer.encode)
        spec.config.layer_norm_epsilon = m.norm_epsilon
        spec.register_source_vocabulary(list(self.source_vocabulary))
        spec.register_target_vocabulary(list(self.target_vocabulary))
        return spec

    # -- pieces -----------------------------------------------------------------------------
    def _p(self, name: str) -> np.ndarray:
        return np.array(self.params[name], np.float32)  # a writable copy (quantization)

    def _linear(self, spec, *names: str) -> None:
        """One CTranslate2 linear from one or more of our ``nnx.Linear`` (fused along out)."""
        spec.weight = np.concatenate([self._p(f"{n}.kernel").T for n in names], axis=0)
        spec.bias = np.concatenate([self._p(f"{n}.bias") for n in names], axis=0)

    def _norm(self, spec, name: str) -> None:
        spec.gamma, spec.beta = self._p(f"{name}.scale"), self._p(f"{name}.bias")

    def _ffn(self, spec, prefix: str) -> None:
        self._norm(spec.layer_norm, f"{prefix}.ffn_block.norm")
        gated = self.config.activation in ("swiglu", "geglu")
        self._linear(spec.linear_0, f"{prefix}.ffn.wi_gate" if gated else f"{prefix}.ffn.wi")
        if gated:
            self._linear(spec.linear_0_noact, f"{prefix}.ffn.wi")
        self._linear(spec.linear_1, f"{prefix}.ffn.wo")

    def _self_attention(self, spec, prefix: str, norm: str, stack: str) -> None:
        self._norm(spec.layer_norm, norm)
        a = f"{prefix}.self_attention"
        self._linear(spec.linear[0], f"{a}.query", f"{a}.key", f"{a}.value")
        self._linear(spec.linear[1], f"{a}.out")
        if self.config.positions == "relative":
            spec.relative_attention_bias = self._p(f"{stack}.relative.table").T  # [buckets, h]
            spec.relative_attention_max_distance = np.dtype("int32").type(
                self.config.relpos_max_distance
            )

    def _positions(self, spec, stack: str) -> None:
        kind, d = self.config.positions, self.config.d_model
        if kind == "learned":
            spec.position_encodings.encodings = self._p(f"{stack}.table")
        elif kind == "sinusoidal":
            rows = jnp.arange(max(POSITION_TABLE_ROWS, self.config.max_len))
            layout = self.config.sinusoidal_layout
            spec.position_encodings.encodings = np.asarray(
                sinusoidal_embedding(rows, d, layout=layout)
            )
        elif kind == "none":
            spec.position_encodings.encodings = np.zeros((POSITION_TABLE_ROWS, d), np.float32)

    def _set_encoder(self, spec) -> None:
        spec.embeddings[0].weight = self._p("embed.embedding")
        spec.scale_embeddings = self.config.scale_embeddings
        self._positions(spec, "encoder_positions")
        if self.config.norm == "pre":
            self._norm(spec.layer_norm, "encoder_norm")
        for i, layer in enumerate(spec.layer):
            prefix = f"encoder_layers.{i}"
            self._self_attention(
                layer.self_attention, prefix, f"{prefix}.attention_block.norm", "encoder_positions"
            )
            self._ffn(layer.ffn, prefix)

    def _set_decoder(self, spec) -> None:
        sharing = self.config.share_embeddings
        table = "embed.embedding" if sharing == "all" else "target_embed.embedding"
        spec.embeddings.weight = self._p(table)
        spec.projection.weight = self._p("output.kernel").T if sharing == "none" else self._p(table)
        if self.config.logits_bias:
            spec.projection.bias = self._p("logits_bias")
        spec.scale_embeddings = self.config.scale_embeddings
        self._positions(spec, "decoder_positions")
        if self.config.norm == "pre":
            self._norm(spec.layer_norm, "decoder_norm")
        for i, layer in enumerate(spec.layer):
            prefix = f"decoder_layers.{i}"
            self._self_attention(
                layer.self_attention, prefix, f"{prefix}.self_block.norm", "decoder_positions"
            )
            self._norm(layer.attention.layer_norm, f"{prefix}.cross_block.norm")
            a = f"{prefix}.cross_attention"
            self._linear(layer.attention.linear[0], f"{a}.query")
            self._linear(layer.attention.linear[1], f"{a}.key", f"{a}.value")
            self._linear(layer.attention.linear[2], f"{a}.out")
            self._ffn(layer.ffn, prefix)
