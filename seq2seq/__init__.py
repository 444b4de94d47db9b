"""seq2seq: Transformer neural machine translation in JAX / Flax NNX."""

__version__ = "0.1.0"
