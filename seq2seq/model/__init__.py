"""The Transformer encoder-decoder (Vaswani et al. 2017) in Flax NNX."""

from seq2seq.model.transformer import DecoderCache, Transformer, build_model

__all__ = ["DecoderCache", "Transformer", "build_model"]
