"""Model invariants: shapes, shift_right, masking, packing, KV-cache equivalence."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import BOS, EOS, packed_batch, random_pairs, tiny_config, unpacked_batch
from seq2seq.model import build_model
from seq2seq.model.positions import sinusoidal_embedding
from seq2seq.model.transformer import shift_right


def test_shapes_and_dtypes(model, rng):
    src, tgt = random_pairs(3, rng)
    batch = unpacked_batch(src, tgt, 12)
    logits = model(batch, bos_id=BOS)
    assert logits.shape == (3, 12, 40) and logits.dtype == jnp.float32
    encoded = model.encode(batch["src"], batch["src_segments"], batch["src_positions"])
    assert encoded.shape == (3, 12, 32)


def test_shift_right_restarts_every_segment_with_bos():
    tgt = jnp.array([[5, 6, EOS, 7, EOS, 0], [8, 9, 10, EOS, 0, 0]])
    seg = jnp.array([[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 0, 0]])
    out = shift_right(tgt, seg, BOS)
    np.testing.assert_array_equal(out, [[BOS, 5, 6, BOS, 7, 0], [BOS, 8, 9, 10, 0, 0]])


def test_sinusoidal_table_matches_formula():
    d = 16
    pe = np.asarray(sinusoidal_embedding(jnp.arange(50), d))
    pos = np.arange(50)[:, None]
    i = np.arange(d // 2)[None, :]
    np.testing.assert_allclose(pe[:, 0::2], np.sin(pos / 10000 ** (2 * i / d)), atol=1e-5)
    np.testing.assert_allclose(pe[:, 1::2], np.cos(pos / 10000 ** (2 * i / d)), atol=1e-5)


def test_padding_in_source_changes_nothing(model, rng):
    src, tgt = random_pairs(2, rng)
    batch = unpacked_batch(src, tgt, 12)
    base = model(batch, bos_id=BOS)
    noisy = dict(batch)
    pad_positions = batch["src_segments"] == 0
    noisy["src"] = jnp.where(pad_positions, 17, batch["src"])  # garbage where padding is
    out = model(noisy, bos_id=BOS)
    real = np.asarray(batch["tgt_segments"] > 0)
    np.testing.assert_allclose(np.asarray(out)[real], np.asarray(base)[real], atol=1e-5)


def test_future_target_token_does_not_change_earlier_positions(model, rng):
    src, tgt = random_pairs(1, rng, lo=6, hi=7)
    batch = unpacked_batch(src, tgt, 10)
    base = np.asarray(model(batch, bos_id=BOS))
    changed = dict(batch)
    t = 4  # output position whose target changes; decoder input t+1 changes
    changed["tgt"] = batch["tgt"].at[0, t].set((int(batch["tgt"][0, t]) + 1) % 36 + 4)
    out = np.asarray(model(changed, bos_id=BOS))
    np.testing.assert_allclose(out[0, : t + 1], base[0, : t + 1], atol=1e-5)
    assert np.abs(out[0, t + 1] - base[0, t + 1]).max() > 1e-4  # and the next one does change


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_packed_rows_equal_separate_rows(norm, rng):
    model = build_model(tiny_config(norm=norm), seed=1)
    src, tgt = random_pairs(6, rng)
    packed, rows = packed_batch(src, tgt, 32, 2)
    assert any(len(r) > 1 for r in rows)
    logits_packed = np.asarray(model(packed, bos_id=BOS))
    single = np.asarray(model(unpacked_batch(src, tgt, 12), bos_id=BOS))
    for r, members in enumerate(rows):
        pos = 0
        for i in members:
            n = len(tgt[i])
            np.testing.assert_allclose(logits_packed[r, pos:pos + n], single[i, :n], atol=1e-4)
            pos += n


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_cached_decoding_equals_full_forward(norm, rng):
    model = build_model(tiny_config(norm=norm), seed=2)
    src, tgt = random_pairs(3, rng)
    batch = unpacked_batch(src, tgt, 10)
    full = np.asarray(model(batch, bos_id=BOS))
    encoded = model.encode(batch["src"], batch["src_segments"], batch["src_positions"])
    cache = model.init_cache(encoded, batch["src_segments"], 1, 10)
    tgt_in = shift_right(batch["tgt"], batch["tgt_segments"], BOS)
    step = jax.jit(lambda tok, i, c: model.decode_step(tok, i, c, 1))
    for i in range(10):
        logits, cache = step(tgt_in[:, i], jnp.int32(i), cache)
        real = np.asarray(batch["tgt_segments"][:, i] > 0)
        np.testing.assert_allclose(np.asarray(logits)[real], full[real, i], atol=1e-5)


def test_shared_embedding_is_the_output_projection(model):
    from flax import nnx

    params = nnx.state(model, nnx.Param)
    assert "target_embed" not in params  # one matrix for source, target and output
    x = jnp.linspace(-1.0, 1.0, 32)[None]
    # pre-norm applies the final LayerNorm (scale 1, bias 0 at init) before the projection
    normed = (x - x.mean()) / jnp.sqrt(x.var() + 1e-6)
    np.testing.assert_allclose(model.logits(x), normed @ model.embed.embedding[...].T, atol=1e-4)
