"""Position signals (Vaswani et al. 2017, §3.5)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def sinusoidal_embedding(positions: jax.Array, d_model: int, max_timescale: float = 10_000.0) -> jax.Array:
    """Sinusoidal position encodings, computed on the fly for any position.

    PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model))
    (Vaswani et al. 2017, §3.5). Sines fill the even feature indices and cosines the odd ones,
    exactly as in the formula. No table is stored, so there is no maximum length.

    Args:
      positions: int ``[...]`` positions (per-segment when packed).
      d_model: feature size; must be even.

    Returns:
      float32 ``[..., d_model]``.

    Raises:
      ValueError: d_model is odd.
    """
    if d_model % 2:
        raise ValueError(f"sinusoidal positions need an even d_model, got {d_model}")
    two_i = jnp.arange(0, d_model, 2, dtype=jnp.float32)
    inv_freq = 1.0 / (max_timescale ** (two_i / d_model))
    angles = positions.astype(jnp.float32)[..., None] * inv_freq
    # interleave: [..., d/2, 2] -> [..., d] puts sin at 2i and cos at 2i+1
    return jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1).reshape(*positions.shape, d_model)
