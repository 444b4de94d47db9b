"""Training: the pure train/eval steps, checkpoints and the training loop."""
