"""``model.attention``: ``chunked`` equals ``dense`` (values and gradients, every mask and bias,
lengths on and off the block), in a trained model too, in O(n) memory; ``cudnn`` is refused
off GPU with a named error."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import BOS, packed_batch, random_pairs, tiny_config
from flax import nnx

from seq2seq.config import ConfigError
from seq2seq.model import build_model
from seq2seq.model.attention import SegmentMask, dot_product_attention
from seq2seq.model.positions import PositionBias, RelativePositionBias, alibi_bias
from seq2seq.training.step import create_train_state, make_train_step

BLOCK = 4
HEADS, HEAD_DIM = 2, 4
# shorter than a block, one block, one block + 1 (cross: keys 2·q_len + 1, several blocks)
LENGTHS = [3, BLOCK, BLOCK + 1]
# every mask and every bias in the quick tests; the rest of the product is marked slow
QUICK = {("padding", "relative"), ("causal", "alibi"), ("cross", "none"), ("packed", "relative")}
GRID = [
    pytest.param(m, b, marks=() if (m, b) in QUICK else pytest.mark.slow)
    for m in ("padding", "causal", "cross", "packed")
    for b in ("none", "relative", "alibi")
]


def _segments(length: int, kind: str) -> np.ndarray:
    """int ``[2, length]``: row 0 ends in 2 padding tokens (one real token at least), row 1 is
    packed (segments of 3 tokens) or all real."""
    real = max(1, length - 2)
    row0 = np.r_[np.ones(real), np.zeros(length - real)]
    row1 = np.arange(length) // 3 + 1 if kind == "packed" else np.ones(length)
    return np.stack([row0, row1]).astype(np.int32)


def _positions(segments: np.ndarray) -> np.ndarray:
    """Per-segment positions (restarting at 0 in each segment), as the data pipeline makes."""
    out = np.zeros_like(segments)
    for b, row in enumerate(segments):
        for i in range(1, len(row)):
            out[b, i] = out[b, i - 1] + 1 if row[i] == row[i - 1] else 0
    return out


def _case(q_len: int, mask_kind: str):
    """Segment mask and positions of one grid point (cross: keys 2·q_len + 1 long)."""
    k_len = 2 * q_len + 1 if mask_kind == "cross" else q_len
    q_seg = _segments(q_len, mask_kind)
    k_seg = _segments(k_len, mask_kind) if mask_kind == "cross" else q_seg
    mask = SegmentMask(jnp.asarray(q_seg), jnp.asarray(k_seg), causal=mask_kind == "causal")
    return k_len, mask, jnp.asarray(_positions(q_seg)), jnp.asarray(_positions(k_seg))


_RELATIVE = {}


def _relative(bidirectional: bool):
    if bidirectional not in _RELATIVE:
        module = RelativePositionBias(
            HEADS, 8, 16, bidirectional=bidirectional, rngs=nnx.Rngs(params=3)
        )
        module.table[...] = module.table[...] * 10  # large enough that a wrong bias shows
        _RELATIVE[bidirectional] = nnx.split(module)
    return _RELATIVE[bidirectional]


@pytest.mark.parametrize("mask_kind, bias_kind", GRID)
def test_chunked_equals_dense_values_and_gradients(mask_kind, bias_kind):
    rng = np.random.default_rng(0)
    graphdef, table_state = _relative(bidirectional=mask_kind != "causal")
    cases = [_case(q_len, mask_kind) for q_len in LENGTHS]
    inputs = [
        tuple(
            jnp.asarray(rng.normal(size=(2, n, HEADS, HEAD_DIM)), jnp.float32)
            for n in (q_len, k_len, k_len, q_len)  # q, k, v and the output cotangent
        )
        for q_len, (k_len, *_) in zip(LENGTHS, cases)
    ]

    def loss(q, k, v, state, cotangent, case, implementation):
        _, mask, q_pos, k_pos = case
        bias = None
        if bias_kind == "relative":
            bias = PositionBias(nnx.merge(graphdef, state).bias_fn(), q_pos, k_pos)
        elif bias_kind == "alibi":
            bias = PositionBias(functools.partial(alibi_bias, num_heads=HEADS), q_pos, k_pos)
        out = dot_product_attention(
            q, k, v, mask, bias=bias, implementation=implementation, q_block=BLOCK, kv_block=BLOCK
        )
        return jnp.sum(out * cotangent), out

    grad = jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True)

    @jax.jit  # one compilation for the whole grid of this mask and bias
    def both(inputs, state):
        return [
            [grad(q, k, v, state, ct, case, impl) for impl in ("dense", "chunked")]
            for (q, k, v, ct), case in zip(inputs, cases)
        ]

    for q_len, (k_len, *_), (dense, chunked) in zip(LENGTHS, cases, both(inputs, table_state)):
        where = f"{mask_kind}/{bias_kind} q_len={q_len} k_len={k_len}"
        (_, dense_out), dense_grads = dense
        (_, chunked_out), chunked_grads = chunked
        np.testing.assert_allclose(chunked_out, dense_out, atol=1e-5, rtol=1e-5, err_msg=where)
        leaves_dense, leaves_chunked = jax.tree.leaves(dense_grads), jax.tree.leaves(chunked_grads)
        assert len(leaves_dense) == 4  # dq, dk, dv and the relative table's
        for a, b in zip(leaves_chunked, leaves_dense):
            np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5, err_msg=where)
        if bias_kind == "relative":  # the bias parameters do get a gradient
            assert float(jnp.abs(leaves_dense[3]).max()) > 1e-3


def test_fully_masked_query_rows_average_the_real_keys_as_dense_does():
    """A padding query (no allowed key) gets dense's uniform weights over the k_len real keys;
    the keys chunked adds to fill its last block must not be among them."""
    rng = np.random.default_rng(1)
    q = jnp.asarray(rng.normal(size=(1, 5, 1, 4)), jnp.float32)
    kv = jnp.asarray(rng.normal(size=(1, 5, 1, 4)), jnp.float32)
    segments = jnp.asarray([[1, 1, 1, 0, 0]])
    mask = SegmentMask(segments, segments)
    for impl in ("dense", "chunked"):
        out = dot_product_attention(q, kv, kv, mask, implementation=impl, q_block=4, kv_block=4)
        np.testing.assert_allclose(out[0, 3:, 0], np.tile(kv[0, :, 0].mean(0), (2, 1)), atol=1e-6)


def test_chunked_attention_dropout_keeps_the_expectation():
    """Per-block keep masks: the output averaged over many dropout keys tends to the
    no-dropout output (dropout scales kept weights by 1/(1 − rate))."""
    rng = np.random.default_rng(2)
    q, k, v = (jnp.asarray(rng.normal(size=(1, 6, 1, 4)), jnp.float32) for _ in range(3))

    def one(key):
        return dot_product_attention(
            q, k, v, None, implementation="chunked", q_block=4, kv_block=4, dropout_rate=0.5,
            dropout_rng=key,
        )  # fmt: skip

    outs = jax.jit(jax.vmap(one))(jax.random.split(jax.random.key(0), 4000))
    plain = dot_product_attention(q, k, v, None)
    assert float(jnp.abs(outs[0] - plain).max()) > 0.05  # dropout does act
    np.testing.assert_allclose(outs.mean(0), plain, atol=0.05)


def _train(attention: str, positions: str, steps: int = 3):
    config = tiny_config(
        positions=positions,
        attention=attention,
        attention_q_block=4,
        attention_kv_block=4,
        num_encoder_layers=1,
        num_decoder_layers=1,
    )
    model = build_model(config, seed=1)
    tx = optax.sgd(0.3)  # Adam's g/√v would amplify rounding in near-zero gradients
    graphdef, state = create_train_state(model, tx, 0)
    step = jax.jit(make_train_step(graphdef, tx, bos_id=BOS, label_smoothing=0.1))
    batch, _ = packed_batch(*random_pairs(12, np.random.default_rng(5)), 14, 12)
    losses = []
    for _ in range(steps):
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"] / metrics["tokens"]))
    return losses, state.params


def test_a_model_trained_with_chunked_attention_follows_dense():
    """Packed rows of 14 tokens (blocks of 4: a remainder), padding, causal and cross
    attention, and the relative bias with its learned table (the matrix chain
    ``alibi-chunked`` runs ALiBi and RoPE through seq2seq-train)."""
    dense_losses, dense_params = _train("dense", "relative")
    chunked_losses, chunked_params = _train("chunked", "relative")
    assert dense_losses[-1] < dense_losses[0]  # it does train
    np.testing.assert_allclose(chunked_losses, dense_losses, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(chunked_params), jax.tree.leaves(dense_params)):
        np.testing.assert_allclose(a, b, atol=1e-5)


def _temp_bytes(implementation: str, n: int) -> int:
    """Compiled temp memory of forward + backward of one causal ALiBi attention, length n."""

    def loss(q, k, v, segments):
        pos = jnp.arange(n)[None]
        bias = PositionBias(functools.partial(alibi_bias, num_heads=2), pos, pos)
        mask = SegmentMask(segments, segments, causal=True)
        out = dot_product_attention(
            q, k, v, mask, bias=bias, implementation=implementation, q_block=128, kv_block=128
        )
        return out.sum()

    x = jax.ShapeDtypeStruct((1, n, 2, 16), jnp.float32)
    segments = jax.ShapeDtypeStruct((1, n), jnp.int32)
    compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(x, x, x, segments).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def test_chunked_memory_grows_linearly_dense_quadratically():
    dense = [_temp_bytes("dense", n) for n in (512, 2048)]
    chunked = [_temp_bytes("chunked", n) for n in (512, 2048)]
    assert dense[1] / dense[0] > 8  # 4× the length: n² gives 16×
    assert chunked[1] / chunked[0] < 4.4  # n gives 4× (plus a constant)
    assert dense[1] > 2048**2 * 4  # at least one float32 n × n matrix
    assert chunked[1] < dense[1] / 20


def test_cudnn_is_refused_off_gpu_with_a_named_error(tmp_path, capsys):
    from seq2seq import cli
    from seq2seq.resolve import resolve

    if jax.default_backend() == "gpu":
        pytest.skip("a GPU backend runs cudnn")
    with pytest.raises(ConfigError, match=r"model.attention=cudnn.*GPU.*cpu"):
        resolve(None, [f"workdir={tmp_path}", "data.max_tokens=2048", "model.attention=cudnn"])
    # the real command: exit 2, one line naming the key and the reason, nothing written
    assert cli.train_main([f"workdir={tmp_path / 'run'}", "model.attention=cudnn"]) == 2
    err = capsys.readouterr().err
    assert "model.attention=cudnn needs a GPU backend" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.attention=flash", r"model.attention must be one of dense, chunked, cudnn"),
        ("model.attention_q_block=0", r"model.attention_q_block must be ≥ 1, got 0"),
        ("model.attention_kv_block=-2", r"model.attention_kv_block must be ≥ 1, got -2"),
    ],
)
def test_bad_attention_settings_name_the_key(tmp_path, override, message):
    from seq2seq.resolve import resolve

    with pytest.raises(ConfigError, match=message):
        resolve(None, [f"workdir={tmp_path}", "data.max_tokens=2048", override])


def test_attention_weights_of_a_chunked_model_come_from_the_dense_path():
    """Inspection (``Transformer.attention_weights``, sown weights) needs the whole matrix:
    under ``chunked`` it takes the dense path and gives dense's weights and logits."""
    config = dict(positions="alibi", num_encoder_layers=1, num_decoder_layers=1)
    dense = build_model(tiny_config(**config), seed=4)
    chunked = build_model(
        tiny_config(**config, attention="chunked", attention_q_block=4, attention_kv_block=4),
        seed=4,
    )
    batch, _ = packed_batch(*random_pairs(6, np.random.default_rng(6)), 10, 6)
    want, got = (
        dense.attention_weights(batch, bos_id=BOS),
        chunked.attention_weights(batch, bos_id=BOS),
    )
    for name in ("encoder", "decoder", "cross", "logits"):
        np.testing.assert_allclose(got[name], want[name], atol=1e-5, err_msg=name)
    # the plain forward pass (chunked) agrees with the dense one as well
    np.testing.assert_allclose(chunked(batch, bos_id=BOS), want["logits"], atol=1e-5)


def _fake_cudnn(real):
    """``jax.nn.dot_product_attention`` where ``implementation="cudnn"`` behaves as cuDNN's
    flash attention does on a query row with no allowed key: NaN (0/0 in the softmax)."""

    def attention(query, key, value, bias=None, mask=None, implementation=None):
        out = real(query, key, value, bias=bias, mask=mask)
        if implementation == "cudnn" and mask is not None:
            empty = ~jnp.any(
                jnp.broadcast_to(mask, (*mask.shape[:2], query.shape[1], key.shape[1])), -1
            )
            out = jnp.where(jnp.swapaxes(empty, 1, 2)[..., None], jnp.nan, out)
        return out

    return attention


@pytest.mark.parametrize("bias_kind", ["none", "relative"])
def test_cudnn_guard_gives_padding_queries_the_dense_values_not_nan(monkeypatch, bias_kind):
    length = 2 * BLOCK + 1
    rng = np.random.default_rng(4)
    q, k, v = (
        jnp.asarray(rng.normal(size=(2, length, HEADS, HEAD_DIM)), jnp.float32) for _ in range(3)
    )
    _, mask, positions, _ = _case(length, "packed")  # row 0 ends in padding queries
    assert not np.asarray(mask.dense()).any(-1).all()  # some query rows have no key
    bias = None
    if bias_kind == "relative":
        graphdef, state = _relative(bidirectional=True)
        bias = PositionBias(nnx.merge(graphdef, state).bias_fn(), positions, positions)
    fake = _fake_cudnn(jax.nn.dot_product_attention)
    # the fake is a real test double: without the guard the padding rows are NaN
    assert np.isnan(np.asarray(fake(q, k, v, mask=mask.dense(), implementation="cudnn"))).any()
    monkeypatch.setattr(jax.nn, "dot_product_attention", fake)

    def loss(implementation, q, k, v):
        out = dot_product_attention(q, k, v, mask, bias=bias, implementation=implementation)
        return jnp.sum(out.astype(jnp.float32) ** 2), out

    (value, out), grads = jax.value_and_grad(
        functools.partial(loss, "cudnn"), argnums=(0, 1, 2), has_aux=True
    )(q, k, v)
    (_, reference), ref_grads = jax.value_and_grad(
        functools.partial(loss, "dense"), argnums=(0, 1, 2), has_aux=True
    )(q, k, v)
    assert np.isfinite(float(value)) and all(np.isfinite(np.asarray(g)).all() for g in grads)
    # bfloat16 operands: equal to the dense float32 reference within bfloat16 rounding,
    # padding queries included (the mean of the values, as dense's uniform weights give)
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(reference), atol=3e-2)
    for g, r in zip(grads, ref_grads):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), atol=0.15, rtol=0.05)


@pytest.mark.gpu
def test_cudnn_equals_dense_on_packed_rows_on_a_gpu():
    if jax.default_backend() != "gpu":
        pytest.skip("cuDNN attention needs a GPU backend")
    length = 64
    rng = np.random.default_rng(5)
    q, k, v = (jnp.asarray(rng.normal(size=(2, length, HEADS, 64)), jnp.float32) for _ in range(3))
    _, mask, _, _ = _case(length, "packed")  # row 0 ends in padding queries

    def run(implementation):
        def loss(q, k, v):
            out = dot_product_attention(q, k, v, mask, implementation=implementation)
            return jnp.sum(out.astype(jnp.float32) ** 2), out

        return jax.jit(jax.value_and_grad(loss, (0, 1, 2), has_aux=True))(q, k, v)

    (_, out), grads = run("cudnn")
    (_, reference), ref_grads = run("dense")
    assert np.isfinite(np.asarray(out)).all()
    assert all(np.isfinite(np.asarray(g)).all() for g in grads)
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(reference), atol=3e-2)
    for g, r in zip(grads, ref_grads):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), atol=0.3, rtol=0.05)
