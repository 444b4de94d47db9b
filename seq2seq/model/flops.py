"""Model FLOPs of a training step, counted from the architecture (for MFU).

The count follows the "6·N per token" convention (Kaplan et al. 2020, §2.1; Chowdhery et al.
2022, App. B): a matrix multiply of an ``[m, k]`` activation by a ``[k, n]`` weight costs
``2·m·k·n`` FLOPs forward (one multiply and one add per MAC) and twice that backward (the
gradients of the activation and of the weight), so training costs 6 FLOPs per weight per row.
Attention adds its two activation-by-activation products, Q·Kᵀ and P·V, also ×3 for training.
Only matrix multiplies are counted: embedding gathers, biases, LayerNorm, softmax, dropout, the
loss and the optimizer update are left out (XLA's cost analysis counts them, so its figure is a
few per cent higher; ``benchmarks/benchmark.py`` reports both and their ratio).

With ``d`` = d_model, ``f`` = d_ff, ``V`` = target vocabulary, ``Le``/``Ld`` = encoder/decoder
layers, ``S``/``T`` = source/target row length and ``B`` rows, forward multiply-accumulates are

* per source token: ``Le·(4d² + 2df)`` (Q, K, V, O projections and the FFN), plus
  ``Ld·2d²`` (the cross-attention K and V projections of the encoder output, one per decoder
  layer), plus ``Le·2Sd`` (encoder self-attention Q·Kᵀ and P·V over the whole row);
* per target token: ``Ld·(4d² + 2d² + 2df)`` (self-attention Q, K, V, O; cross-attention Q, O;
  FFN), plus ``Ld·(2Td + 2Sd)`` (decoder self- and cross-attention products), plus ``dV``
  (the output projection, tied to the embedding or not);

and the step costs ``6 · (B·S · per_source + B·T · per_target)`` FLOPs. Attention is counted
over the full row (``S`` or ``T`` keys per query), because the dense kernels compute every
score and then mask: causal and packing masks save no FLOPs. Padding positions are counted
too, for the same reason; divide by real tokens for "useful" FLOPs.
"""

from __future__ import annotations

from seq2seq.config import ModelConfig

#: Training FLOPs per forward multiply-accumulate: 2 (multiply + add) × 3 (forward + backward).
TRAIN_FLOPS_PER_MAC = 6


def forward_macs_per_token(config: ModelConfig, src_len: int, tgt_len: int) -> dict[str, float]:
    """Forward multiply-accumulates per source and per target token, by component.

    Args:
      config: model shape (``d_model``, ``d_ff``, layers, ``vocab_size`` > 0).
      src_len / tgt_len: row lengths S and T (keys per query in attention).

    Returns:
      ``encoder_matmul``, ``encoder_attention``, ``cross_kv`` (per source token) and
      ``decoder_matmul``, ``decoder_self_attention``, ``decoder_cross_attention``,
      ``output_projection`` (per target token), in MACs.

    Raises:
      ValueError: ``vocab_size`` is not set.
    """
    if config.vocab_size <= 0:
        raise ValueError("model.vocab_size must be set to count the output projection")
    d, f = config.d_model, config.d_ff
    le, ld = config.num_encoder_layers, config.num_decoder_layers
    return {
        "encoder_matmul": le * (4 * d * d + 2 * d * f),
        "encoder_attention": le * 2 * src_len * d,
        "cross_kv": ld * 2 * d * d,
        "decoder_matmul": ld * (6 * d * d + 2 * d * f),
        "decoder_self_attention": ld * 2 * tgt_len * d,
        "decoder_cross_attention": ld * 2 * src_len * d,
        "output_projection": d * config.vocab_size,
    }


_SOURCE_SIDE = ("encoder_matmul", "encoder_attention", "cross_kv")


def train_flops_breakdown(
    config: ModelConfig, batch: int, src_len: int, tgt_len: int
) -> dict[str, float]:
    """Training FLOPs of one step on ``[batch, src_len]`` sources and ``[batch, tgt_len]`` targets.

    Returns:
      Each component of ``forward_macs_per_token`` as FLOPs per step (×6, × the tokens of its
      side), plus ``per_source_token`` and ``per_target_token`` (FLOPs per position of each
      side) and ``total`` (FLOPs per step). The formula is in the module docstring.
    """
    macs = forward_macs_per_token(config, src_len, tgt_len)
    out: dict[str, float] = {}
    for name, m in macs.items():
        tokens = batch * (src_len if name in _SOURCE_SIDE else tgt_len)
        out[name] = float(TRAIN_FLOPS_PER_MAC * m * tokens)
    out["per_source_token"] = float(TRAIN_FLOPS_PER_MAC * sum(macs[k] for k in _SOURCE_SIDE))
    out["per_target_token"] = float(
        TRAIN_FLOPS_PER_MAC * sum(v for k, v in macs.items() if k not in _SOURCE_SIDE)
    )
    out["total"] = (
        batch * src_len * out["per_source_token"] + batch * tgt_len * out["per_target_token"]
    )
    return out


def train_flops_per_step(config: ModelConfig, batch: int, src_len: int, tgt_len: int) -> float:
    """Model FLOPs of one training step (``train_flops_breakdown(...)["total"]``)."""
    return train_flops_breakdown(config, batch, src_len, tgt_len)["total"]


def matmul_params(config: ModelConfig) -> dict[str, int]:
    """Weights that take part in matrix multiplies: ``encoder``, ``decoder``, ``output``.

    ``decoder`` includes the cross-attention K/V projections (applied to source tokens).
    Embedding tables used only through gathers are not counted, except as the output
    projection. Biases and LayerNorm parameters are not counted.
    """
    d, f = config.d_model, config.d_ff
    return {
        "encoder": config.num_encoder_layers * (4 * d * d + 2 * d * f),
        "decoder": config.num_decoder_layers * (8 * d * d + 2 * d * f),
        "output": d * config.vocab_size,
    }
