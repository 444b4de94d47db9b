"""Data: parallel-corpus sources (``sources``), tokenizer, batching and packing."""
