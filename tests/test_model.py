"""Model invariants: shapes, shift_right, masking, packing, KV-cache equivalence."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import BOS, EOS, packed_batch, random_pairs, tiny_config, unpacked_batch

from seq2seq.decoding import decode_beams, init_beams, reorder_beams
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


SCHEMES = ["sinusoidal", "learned", "relative", "rope", "alibi", "none"]
NORMS = ["pre", "post"]
_MODELS = {}


def scheme_model(positions, norm, **changes):
    """A tiny model per (scheme, norm), built once per session (building is the slow part)."""
    key = (positions, norm, tuple(sorted(changes.items())))
    if key not in _MODELS:
        _MODELS[key] = build_model(
            tiny_config(positions=positions, norm=norm, max_len=32, **changes), seed=2
        )
    return _MODELS[key]


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("positions", SCHEMES)
def test_padding_in_source_changes_nothing(positions, norm, rng):
    model = scheme_model(positions, norm)
    src, tgt = random_pairs(2, rng)
    batch = unpacked_batch(src, tgt, 12)
    base = model(batch, bos_id=BOS)
    noisy = dict(batch)
    pad_positions = batch["src_segments"] == 0
    assert bool(pad_positions.any())
    noisy["src"] = jnp.where(pad_positions, 17, batch["src"])  # garbage where padding is
    out = model(noisy, bos_id=BOS)
    real = np.asarray(batch["tgt_segments"] > 0)
    np.testing.assert_allclose(np.asarray(out)[real], np.asarray(base)[real], atol=1e-5)


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("positions", SCHEMES)
def test_future_target_token_does_not_change_earlier_positions(positions, norm, rng):
    model = scheme_model(positions, norm)
    src, tgt = random_pairs(1, rng, lo=6, hi=7)
    batch = unpacked_batch(src, tgt, 10)
    base = np.asarray(model(batch, bos_id=BOS))
    changed = dict(batch)
    t = 4  # output position whose target changes; decoder input t+1 changes
    changed["tgt"] = batch["tgt"].at[0, t].set((int(batch["tgt"][0, t]) + 1) % 36 + 4)
    out = np.asarray(model(changed, bos_id=BOS))
    np.testing.assert_allclose(out[0, : t + 1], base[0, : t + 1], atol=1e-5)
    assert np.abs(out[0, t + 1] - base[0, t + 1]).max() > 1e-4  # and the next one does change


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("positions", SCHEMES)
def test_packed_rows_equal_separate_rows(positions, norm, rng):
    model = scheme_model(positions, norm)
    src, tgt = random_pairs(6, rng)
    packed, rows = packed_batch(src, tgt, 32, 2)
    assert any(len(r) > 1 for r in rows)
    logits_packed = np.asarray(model(packed, bos_id=BOS))
    single = np.asarray(model(unpacked_batch(src, tgt, 12), bos_id=BOS))
    for r, members in enumerate(rows):
        pos = 0
        for i in members:
            n = len(tgt[i])
            np.testing.assert_allclose(logits_packed[r, pos : pos + n], single[i, :n], atol=1e-4)
            pos += n


def cached_logits(model, batch, length, beam_size=1):
    """Logits of every decoder position computed one step at a time with the KV cache."""
    encoded = model.encode(batch["src"], batch["src_segments"], batch["src_positions"])
    cache = init_beams(model, encoded, batch["src_segments"], beam_size, length)
    tgt_in = shift_right(batch["tgt"], batch["tgt_segments"], BOS)
    tgt_in = tgt_in.reshape(-1, beam_size, tgt_in.shape[1])  # [batch, beam, length]
    out = []
    for i in range(length):
        logits, cache = decode_beams(model, tgt_in[:, :, i], jnp.int32(i), cache)
        out.append(np.asarray(logits).reshape(-1, logits.shape[-1]))
    return np.stack(out, axis=1)


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("positions", SCHEMES)
def test_cached_decoding_equals_full_forward(positions, norm, rng):
    model = scheme_model(positions, norm)
    src, tgt = random_pairs(3, rng)
    batch = unpacked_batch(src, tgt, 10)
    full = np.asarray(model(batch, bos_id=BOS))
    steps = cached_logits(model, batch, 10)
    real = np.asarray(batch["tgt_segments"] > 0)
    np.testing.assert_allclose(steps[real], full[real], atol=1e-5)


def test_cached_decoding_with_beams_equals_full_forward(rng):
    # beams folded into the batch; relative bias and RoPE broadcast over batch·beam
    for positions in ("relative", "rope"):
        model = scheme_model(positions, "pre")
        src, tgt = random_pairs(2, rng, hi=6)
        batch = unpacked_batch(src, tgt, 6)
        full = np.asarray(model(batch, bos_id=BOS))
        beam = {k: jnp.repeat(v, 3, axis=0) if k.startswith("tgt") else v for k, v in batch.items()}
        steps = cached_logits(model, beam, 6, beam_size=3).reshape(2, 3, 6, -1)
        real = np.asarray(batch["tgt_segments"] > 0)
        for b in range(3):
            np.testing.assert_allclose(steps[:, b][real], full[real], atol=1e-5)


@pytest.mark.parametrize("positions", ["sinusoidal", "relative", "rope"])
def test_reordered_hypotheses_read_their_ancestors_cache(positions, rng):
    # Beam search reorders hypotheses by gathering only the ancestry table: after the reorder,
    # hypothesis j continues parents[j]'s prefix, and its next logits must equal a full forward
    # pass over that prefix followed by its own tokens (hypotheses copied twice included).
    model = scheme_model(positions, "pre")
    beam, before, length = 3, 3, 6
    src, _ = random_pairs(2, rng)
    _, tgt = random_pairs(2 * beam, rng, lo=length, hi=length + 1)
    tgt = np.stack(tgt)[:, :length].reshape(2, beam, length)
    parents = np.array([[2, 0, 0], [1, 1, 2]])
    joined = np.concatenate(
        [np.take_along_axis(tgt, parents[:, :, None], 1)[:, :, :before], tgt[:, :, before:]], axis=2
    )

    def inputs(t):  # decoder inputs [2, beam, length]: BOS, then the targets shifted right
        return np.concatenate([np.full((2, beam, 1), BOS), t[:, :, :-1]], axis=2)

    sources = unpacked_batch(src, src, 12)
    encoded = model.encode(sources["src"], sources["src_segments"], sources["src_positions"])
    cache = init_beams(model, encoded, sources["src_segments"], beam, length)
    steps = []
    for i in range(length):
        if i == before:
            cache = reorder_beams(cache, jnp.asarray(parents, jnp.int32))
        tokens = inputs(tgt if i < before else joined)[:, :, i]
        logits, cache = decode_beams(model, jnp.asarray(tokens, jnp.int32), jnp.int32(i), cache)
        steps.append(np.asarray(logits))
    steps = np.stack(steps, axis=2)  # [2, beam, length, vocab]

    rows = [s for s in src for _ in range(beam)]
    full = np.asarray(
        model(unpacked_batch(rows, list(joined.reshape(2 * beam, length)), 12), bos_id=BOS)
    )[:, :length].reshape(2, beam, length, -1)
    np.testing.assert_allclose(steps[:, :, before:], full[:, :, before:], atol=1e-5)
    assert np.abs(steps[:, 1, before:] - steps[:, 2, before:]).max() > 1e-3  # not all equal


@pytest.mark.parametrize("positions", ["sinusoidal", "relative", "rope", "alibi"])
def test_schemes_without_a_table_run_past_the_training_length(positions, rng):
    # model.max_len=4 would be the table size of a learned scheme; these have no table, so
    # rows of 20 tokens (positions up to 19) work, and the cache still matches teacher forcing
    model = build_model(tiny_config(positions=positions, max_len=4), seed=3)
    src, tgt = random_pairs(2, rng, lo=14, hi=19)
    batch = unpacked_batch(src, tgt, 20)
    full = np.asarray(model(batch, bos_id=BOS))
    assert np.isfinite(full).all()
    real = np.asarray(batch["tgt_segments"] > 0)
    np.testing.assert_allclose(cached_logits(model, batch, 20)[real], full[real], atol=1e-5)


def test_learned_positions_name_the_length_and_the_table_size(rng):
    model = build_model(tiny_config(positions="learned", max_len=8), seed=0)
    src, tgt = random_pairs(2, rng)
    batch = unpacked_batch(src, tgt, 12)
    with pytest.raises(
        ValueError,
        match=r"input length 12 exceeds the learned position table "
        r"of 8 positions \(model.max_len\)",
    ):
        model(batch, bos_id=BOS)
    encoded = model.encode(
        batch["src"][:, :8], batch["src_segments"][:, :8], batch["src_positions"][:, :8]
    )
    with pytest.raises(ValueError, match="input length 9 exceeds .* of 8 positions"):
        model.init_cache(encoded, batch["src_segments"][:, :8], max_len=9, slots=9)


# -- norm placement against the formulas, in plain jax.numpy ---------------------------------


def _ref_layer_norm(x, p):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + 1e-6) * p["scale"] + p["bias"]


def _ref_attention(xq, xkv, mask, p, heads):
    def proj(x, name):  # [len, d] -> [heads, len, head_dim]
        y = x @ p[name]["kernel"] + p[name]["bias"]
        return y.reshape(y.shape[0], heads, -1).transpose(1, 0, 2)

    q, k, v = proj(xq, "query"), proj(xkv, "key"), proj(xkv, "value")
    scores = q @ k.transpose(0, 2, 1) / jnp.sqrt(q.shape[-1])  # softmax(QKᵀ/√d_k)V, eq. 1
    scores = jnp.where(mask, scores, -1e30)
    weights = jnp.exp(scores - scores.max(-1, keepdims=True))
    weights = weights / weights.sum(-1, keepdims=True)
    out = (weights @ v).transpose(1, 0, 2).reshape(xq.shape[0], -1)
    return out @ p["out"]["kernel"] + p["out"]["bias"]


def _ref_ffn(x, p):  # eq. 2
    return (
        jnp.maximum(0.0, x @ p["wi"]["kernel"] + p["wi"]["bias"]) @ p["wo"]["kernel"]
        + p["wo"]["bias"]
    )


def _ref_pe(length, d):  # §3.5
    pos = np.arange(length)[:, None]
    i = np.arange(d // 2)[None, :]
    pe = np.zeros((length, d), np.float32)
    pe[:, 0::2] = np.sin(pos / 10000 ** (2 * i / d))
    pe[:, 1::2] = np.cos(pos / 10000 ** (2 * i / d))
    return pe


def _ref_forward(p, src, tgt_in, norm, heads):
    """The 1-layer Transformer from the paper: post = LN(x + Sub(x)); pre = x + Sub(LN(x))."""
    d = p["embed"]["embedding"].shape[1]

    def block(x, sub, norm_params):
        if norm == "post":
            return _ref_layer_norm(x + sub(x), norm_params)
        return x + sub(_ref_layer_norm(x, norm_params))

    emb = p["embed"]["embedding"]
    enc = emb[src] * np.sqrt(d) + _ref_pe(len(src), d)
    e = p["encoder_layers"][0]
    every = jnp.ones((len(src), len(src)), bool)
    enc = block(
        enc,
        lambda h: _ref_attention(h, h, every, e["self_attention"], heads),
        e["attention_block"]["norm"],
    )
    enc = block(enc, lambda h: _ref_ffn(h, e["ffn"]), e["ffn_block"]["norm"])
    if norm == "pre":
        enc = _ref_layer_norm(enc, p["encoder_norm"])

    x = emb[tgt_in] * np.sqrt(d) + _ref_pe(len(tgt_in), d)
    dl = p["decoder_layers"][0]
    causal = jnp.tril(jnp.ones((len(tgt_in), len(tgt_in)), bool))
    cross = jnp.ones((len(tgt_in), len(src)), bool)
    x = block(
        x,
        lambda h: _ref_attention(h, h, causal, dl["self_attention"], heads),
        dl["self_block"]["norm"],
    )
    x = block(
        x,
        lambda h: _ref_attention(h, enc, cross, dl["cross_attention"], heads),
        dl["cross_block"]["norm"],
    )
    x = block(x, lambda h: _ref_ffn(h, dl["ffn"]), dl["ffn_block"]["norm"])
    if norm == "pre":
        x = _ref_layer_norm(x, p["decoder_norm"])
    return x @ emb.T  # tied output projection (§3.4)


@pytest.mark.parametrize("norm", NORMS)
def test_norm_placement_matches_the_formulas(norm):
    from flax import nnx

    model = build_model(tiny_config(norm=norm, num_encoder_layers=1, num_decoder_layers=1), seed=4)
    # fixed, non-trivial weights everywhere (LayerNorm scales/offsets and biases included)
    state = nnx.state(model, nnx.Param)
    leaves, treedef = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.key(7), len(leaves))
    leaves = [0.3 * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)]
    nnx.update(model, jax.tree.unflatten(treedef, leaves))
    p = nnx.to_pure_dict(nnx.state(model, nnx.Param))

    src = np.array([5, 9, 12, 7, 30, EOS], np.int32)
    tgt = np.array([11, 6, 25, EOS], np.int32)
    batch = unpacked_batch([src], [tgt], 6)
    got = np.asarray(model(batch, bos_id=BOS))[0, :4]
    tgt_in = np.array([BOS, 11, 6, 25], np.int32)
    want = np.asarray(_ref_forward(p, src, tgt_in, norm, heads=4))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert np.abs(want).max() > 1.0  # a real comparison, not of two near-zero arrays


# -- symmetry: without positions the encoder is permutation-equivariant -----------------------


@pytest.mark.parametrize("positions", SCHEMES)
def test_permuting_the_source_permutes_the_encoder_output_only_without_positions(positions):
    model = scheme_model(positions, "pre")
    src = jnp.asarray([[5, 9, 12, 7, 30, 14, 21, EOS]], jnp.int32)
    seg = jnp.ones_like(src)
    pos = jnp.arange(8, dtype=jnp.int32)[None]
    perm = np.random.default_rng(3).permutation(8)
    out = np.asarray(model.encode(src, seg, pos))[0]
    out_perm = np.asarray(model.encode(src[:, perm], seg, pos))[0]
    if positions == "none":
        np.testing.assert_allclose(out_perm, out[perm], atol=1e-5)
    else:
        assert np.abs(out_perm - out[perm]).max() > 1e-2


# -- attention-weight inspection ------------------------------------------------------------


@pytest.mark.parametrize("positions", ["sinusoidal", "relative", "alibi", "rope"])
def test_attention_weights_are_the_softmax_the_model_uses(positions, rng):
    model = scheme_model(positions, "pre")
    src, tgt = random_pairs(3, rng)
    batch = unpacked_batch(src, tgt, 10)
    got = model.attention_weights(batch, bos_id=BOS)
    # the explicit path (with its bias/RoPE) gives the same logits as the fused one
    np.testing.assert_allclose(got["logits"], model(batch, bos_id=BOS), atol=1e-5)
    assert got["encoder"].shape == (2, 3, 4, 10, 10) and got["cross"].shape == (2, 3, 4, 10, 10)
    src_real = np.asarray(batch["src_segments"] > 0)
    tgt_real = np.asarray(batch["tgt_segments"] > 0)
    for name in ("encoder", "decoder", "cross"):
        w = np.asarray(got[name])
        assert w.dtype == np.float32
        np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)
    keys_real = {"encoder": src_real, "cross": src_real, "decoder": tgt_real}
    for name, real in keys_real.items():
        w = np.asarray(got[name])
        q_real = src_real if name == "encoder" else tgt_real
        for b in range(3):  # real queries put no weight on padding keys
            assert np.abs(w[:, b][:, :, q_real[b]][..., ~real[b]]).max(initial=0.0) == 0.0
    future = np.triu(np.ones((10, 10), bool), k=1)[None] & tgt_real[:, :, None]  # [b, q, k]
    assert np.abs(np.asarray(got["decoder"]) * future[None, :, None]).max() == 0.0  # causal
    # the model itself is unchanged: nothing sown, fast path again
    from flax import nnx

    assert not jax.tree.leaves(nnx.state(model, nnx.Intermediate))
    assert not model.encoder_layers[0].self_attention.sow_weights


def test_shared_embedding_is_the_output_projection(model):
    from flax import nnx

    params = nnx.state(model, nnx.Param)
    assert "target_embed" not in params  # one matrix for source, target and output
    x = jnp.linspace(-1.0, 1.0, 32)[None]
    # pre-norm applies the final LayerNorm (scale 1, bias 0 at init) before the projection
    normed = (x - x.mean()) / jnp.sqrt(x.var() + 1e-6)
    np.testing.assert_allclose(model.logits(x), normed @ model.embed.embedding[...].T, atol=1e-4)
