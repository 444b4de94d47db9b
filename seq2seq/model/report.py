"""Parameter counts per component, read from the model's own parameters (nothing allocated).

Counting rules (so the numbers can be checked against the paper, Vaswani et al. 2017, Table 3):

* ``weights`` are matrices and tables (projection kernels, embeddings, position tables,
  relative-bias tables) and the LayerNorm scales; ``biases`` are the additive vectors of the
  projections and the LayerNorm offsets. ``total`` = weights + biases.
* One layer's attention is 4·d_model² weights (Q, K, V, output) + 4·d_model biases; its FFN
  2·d_model·d_ff weights + d_ff + d_model biases (gated FFNs: 3·d_model·d_ff + 2·d_ff +
  d_model); each LayerNorm d_model scales + d_model offsets.
* A shared (tied) matrix is counted once: ``share_embeddings: all`` has one vocab×d_model
  embedding, ``target`` two, ``none`` two plus a d_model×vocab output matrix (no bias).
* ``model.logits_bias``: its vocab-sized vector counts as biases of ``embeddings``.
"""

from __future__ import annotations

from dataclasses import dataclass

from flax import nnx

from seq2seq.config import ModelConfig

COMPONENTS = (
    "embeddings",
    "encoder attention",
    "encoder FFN",
    "decoder self-attention",
    "cross-attention",
    "decoder FFN",
    "norms",
    "positions",
)


@dataclass(frozen=True)
class Count:
    """Parameters of one component: ``weights`` and ``biases`` (see the module docstring)."""

    weights: int = 0
    biases: int = 0

    @property
    def total(self) -> int:
        """weights + biases."""
        return self.weights + self.biases


def abstract_model(config: ModelConfig) -> nnx.Module:
    """The Transformer of ``config`` with ``jax.ShapeDtypeStruct`` leaves (``nnx.eval_shape``).

    Raises:
      ValueError: as ``Transformer`` (e.g. vocab_size not set).
    """
    from seq2seq.model.transformer import build_model

    return nnx.eval_shape(lambda: build_model(config))


def component_of(path: tuple) -> str:
    """The report component of a parameter path such as
    ``('encoder_layers', 0, 'ffn', 'wi', 'kernel')``.

    Raises:
      ValueError: a path no component claims (the report would otherwise be silently wrong).
    """
    names = [str(p) for p in path]
    if any(n == "norm" or n.endswith("_norm") for n in names):
        return "norms"
    head = names[0]
    if head in ("embed", "target_embed", "output", "logits_bias"):
        return "embeddings"
    if head in ("encoder_positions", "decoder_positions"):
        return "positions"
    part = names[2] if len(names) > 2 else ""
    table = {
        ("encoder_layers", "self_attention"): "encoder attention",
        ("encoder_layers", "ffn"): "encoder FFN",
        ("decoder_layers", "self_attention"): "decoder self-attention",
        ("decoder_layers", "cross_attention"): "cross-attention",
        ("decoder_layers", "ffn"): "decoder FFN",
    }
    if (head, part) in table:
        return table[(head, part)]
    raise ValueError(f"parameter {'/'.join(names)} belongs to no report component")


def parameter_counts(model: nnx.Module) -> dict[str, Count]:
    """Parameters of ``model`` (real or abstract) per component, in ``COMPONENTS`` order.

    A leaf named ``bias`` (or ``logits_bias``) counts as biases, everything else as weights.

    Raises:
      ValueError: a parameter belongs to no component.
    """
    sums = {name: [0, 0] for name in COMPONENTS}
    for path, variable in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        size = 1
        for dim in variable.get_value().shape:
            size *= dim
        sums[component_of(path)][path[-1] in ("bias", "logits_bias")] += size
    return {name: Count(w, b) for name, (w, b) in sums.items()}


def format_report(config: ModelConfig, counts: dict[str, Count]) -> str:
    """A table of ``counts`` (from ``parameter_counts``) with per-layer weights, for the console."""
    per_layer = {
        "encoder attention": config.num_encoder_layers,
        "encoder FFN": config.num_encoder_layers,
        "decoder self-attention": config.num_decoder_layers,
        "cross-attention": config.num_decoder_layers,
        "decoder FFN": config.num_decoder_layers,
    }
    lines = [
        f"d_model {config.d_model}, d_ff {config.d_ff}, heads {config.num_heads}, layers "
        f"{config.num_encoder_layers}+{config.num_decoder_layers}, vocab {config.vocab_size}, "
        f"norm {config.norm}, positions {config.positions}, activation {config.activation}, "
        f"share_embeddings {config.share_embeddings}",
        f"{'component':<24}{'layers':>7}{'weights/layer':>15}{'weights':>14}{'biases':>11}"
        f"{'total':>14}",
    ]
    for name in COMPONENTS:
        c = counts[name]
        n = per_layer.get(name)
        layer_cols = f"{n:>7}{c.weights // n:>15,}" if n else f"{'':>7}{'':>15}"
        lines.append(f"{name:<24}{layer_cols}{c.weights:>14,}{c.biases:>11,}{c.total:>14,}")
    w = sum(c.weights for c in counts.values())
    b = sum(c.biases for c in counts.values())
    lines.append(
        f"{'total':<24}{'':>7}{'':>15}{w:>14,}{b:>11,}{w + b:>14,}  ({(w + b) / 1e6:.1f}M)"
    )
    lines.append(
        "weights: matrices, tables and LayerNorm scales; biases: projection biases and "
        "LayerNorm offsets; tied matrices counted once"
    )
    return "\n".join(lines)
