"""The Transformer encoder-decoder (Vaswani et al. 2017) in Flax NNX."""

from seq2seq.model.transformer import Transformer, build_model

__all__ = ["Transformer", "build_model"]
