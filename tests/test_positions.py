"""Position schemes: the formulas and the relative-position properties the papers claim."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from seq2seq.model.positions import (
    RelativePositionBias,
    alibi_bias,
    alibi_slopes,
    apply_rope,
    relative_position_bucket,
    sinusoidal_embedding,
)


def _is_toeplitz(m: np.ndarray, atol: float) -> bool:
    """m[..., i, j] depends only on i − j: every diagonal is constant."""
    return np.allclose(m[..., 1:, 1:], m[..., :-1, :-1], atol=atol)


# -- sinusoidal (Vaswani et al. 2017, §3.5) --------------------------------------------------


def test_sinusoidal_shift_is_a_fixed_rotation_per_frequency_pair():
    # §3.5: "for any fixed offset k, PE(pos+k) can be represented as a linear function of
    # PE(pos)". Per frequency ω_i the pair (sin, cos) at pos+k is the pair at pos rotated by kω_i.
    d, k = 16, 7
    pe = np.asarray(sinusoidal_embedding(jnp.arange(200), d), np.float64)
    omega = 1.0 / 10000 ** (np.arange(0, d, 2) / d)
    m = np.zeros((d, d))
    for i, w in enumerate(omega):
        c, s = np.cos(k * w), np.sin(k * w)
        # sin(a+b) = sin a cos b + cos a sin b ; cos(a+b) = cos a cos b − sin a sin b
        m[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = [[c, s], [-s, c]]
    np.testing.assert_allclose(pe[:-k] @ m.T, pe[k:], atol=2e-5)
    # the map is the same for every pos: fitted by least squares from positions 0..499, each
    # pair's 2×2 map is this rotation and predicts positions 500..999 as well
    pe = np.asarray(sinusoidal_embedding(jnp.arange(1000 + k), d), np.float64)
    for i in range(d // 2):
        pair = pe[:, 2 * i : 2 * i + 2]
        fitted, *_ = np.linalg.lstsq(pair[:500], pair[k : 500 + k], rcond=None)
        np.testing.assert_allclose(fitted.T, m[2 * i : 2 * i + 2, 2 * i : 2 * i + 2], atol=1e-3)
        np.testing.assert_allclose(pair[500:1000] @ fitted, pair[500 + k :], atol=1e-3)
    # and it is orthogonal (a rotation: the norm of PE is the same at every position)
    np.testing.assert_allclose(m @ m.T, np.eye(d), atol=1e-12)


def test_sinusoidal_rejects_odd_width():
    with pytest.raises(ValueError, match="even d_model"):
        sinusoidal_embedding(jnp.arange(3), 7)


# -- RoPE (Su et al. 2021) --------------------------------------------------------------------


def test_rope_score_depends_only_on_the_offset():
    kq, kk = jax.random.split(jax.random.key(0))
    q = jax.random.normal(kq, (1, 1, 2, 8))  # [batch, len, heads, head_dim]
    k = jax.random.normal(kk, (1, 1, 2, 8))
    n = 24
    # positions far past any training length included: no table, no limit
    for start in (0, 5000):
        pos = jnp.arange(start, start + n, dtype=jnp.int32)[None]
        rq = apply_rope(jnp.broadcast_to(q, (1, n, 2, 8)), pos)
        rk = apply_rope(jnp.broadcast_to(k, (1, n, 2, 8)), pos)
        scores = np.asarray(jnp.einsum("bqhd,bkhd->bhqk", rq, rk))  # ⟨R_i q, R_j k⟩
        assert _is_toeplitz(scores, atol=2e-4)  # shift i and j together: same score
        assert np.ptp(scores[0, 0, 0]) > 0.1  # but it does depend on i − j
        if start == 0:
            first = scores
    np.testing.assert_allclose(scores, first, atol=2e-3)  # and not on the absolute position
    # a rotation: norms are kept; position 0 is the identity
    np.testing.assert_allclose(
        jnp.linalg.norm(rq, axis=-1),
        jnp.linalg.norm(jnp.broadcast_to(q, rq.shape), axis=-1),
        rtol=1e-5,
    )
    np.testing.assert_allclose(apply_rope(q, jnp.zeros((1, 1), jnp.int32)), q, atol=1e-7)


def test_rope_matches_the_rotation_formula():
    # pair (m, m + d/2) of the vector at position p is rotated by p·θ_m, θ_m = 10000^(−2m/d)
    x = jnp.arange(1.0, 9.0).reshape(1, 1, 1, 8)
    p = 3
    out = np.asarray(apply_rope(x, jnp.full((1, 1), p, jnp.int32)))[0, 0, 0]
    v = np.arange(1.0, 9.0)
    theta = 10000.0 ** (-np.arange(4) / 4)
    want = np.concatenate(
        [
            v[:4] * np.cos(p * theta) - v[4:] * np.sin(p * theta),
            v[4:] * np.cos(p * theta) + v[:4] * np.sin(p * theta),
        ]
    )
    np.testing.assert_allclose(out, want, rtol=1e-5)


# -- ALiBi (Press et al. 2022) ----------------------------------------------------------------


def test_alibi_slopes_follow_the_paper():
    np.testing.assert_allclose(alibi_slopes(8), [2.0**-k for k in range(1, 9)])
    # not a power of two (6): slopes of 4 heads, then every other slope of 8 heads
    np.testing.assert_allclose(
        alibi_slopes(6), [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3]
    )


def test_alibi_bias_depends_only_on_the_offset():
    for start in (0, 10_000):
        pos = jnp.arange(start, start + 12, dtype=jnp.int32)[None]
        bias = np.asarray(alibi_bias(pos, pos, 4))
        assert bias.shape == (1, 4, 12, 12)
        assert _is_toeplitz(bias, atol=0)
        i, j = np.meshgrid(np.arange(12), np.arange(12), indexing="ij")
        np.testing.assert_allclose(bias[0], -alibi_slopes(4)[:, None, None] * np.abs(i - j))


# -- T5 relative bias (Raffel et al. 2020) ----------------------------------------------------


def test_relative_buckets_match_t5():
    rel = jnp.array([0, -1, -7, -8, -16, -127, -128, -1000, 1, 7, 16, 1000])  # key − query
    got = relative_position_bucket(rel, bidirectional=True, num_buckets=32, max_distance=128)
    # exact below 8; log-spaced 8..15 up to distance 128; keys after the query use 16..31
    np.testing.assert_array_equal(got, [0, 1, 7, 8, 10, 15, 15, 15, 17, 23, 26, 31])
    got = relative_position_bucket(rel, bidirectional=False, num_buckets=32, max_distance=128)
    # causal: exact below 16, log-spaced 16..31; keys after the query (masked anyway) are 0
    np.testing.assert_array_equal(got, [0, 1, 7, 8, 16, 31, 31, 31, 0, 0, 0, 0])


@pytest.mark.parametrize("bidirectional", [True, False])
def test_relative_bias_depends_only_on_the_offset(bidirectional):
    module = RelativePositionBias(3, 8, 20, bidirectional=bidirectional, rngs=nnx.Rngs(0))
    for start in (0, 777):
        pos = jnp.arange(start, start + 30, dtype=jnp.int32)[None]
        bias = np.asarray(module(pos, pos))
        assert bias.shape == (1, 3, 30, 30)
        assert _is_toeplitz(bias, atol=0)
        if start == 0:
            first = bias
    np.testing.assert_array_equal(bias, first)
    # each entry is the table value of its bucket, per head
    table = np.asarray(module.table[...])
    buckets = np.asarray(
        relative_position_bucket(
            jnp.arange(30)[None, :] - jnp.arange(30)[:, None],
            bidirectional=bidirectional,
            num_buckets=8,
            max_distance=20,
        )
    )
    np.testing.assert_array_equal(first[0], table[:, buckets])
    assert np.ptp(first[0, 0][np.tril_indices(30)]) > 0  # distinct distances, distinct biases
