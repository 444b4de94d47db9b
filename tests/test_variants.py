"""Model variants from the config: FFN activations, embedding sharing, dropout rates, dtype."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import BOS, random_pairs, tiny_config, unpacked_batch
from flax import nnx

from seq2seq.config import ConfigError, ModelConfig, load_config
from seq2seq.model import build_model
from seq2seq.model.layers import FeedForward
from seq2seq.model.precision import matmul


@pytest.mark.parametrize(
    "activation,act",
    [
        ("relu", jax.nn.relu),
        ("gelu", jax.nn.gelu),
        ("gelu_erf", lambda h: 0.5 * h * (1 + jax.scipy.special.erf(h / np.sqrt(2)))),
        ("swiglu", jax.nn.silu),
        ("geglu", jax.nn.gelu),
    ],
)
def test_ffn_matches_its_formula(activation, act):
    ffn = FeedForward(8, 16, activation=activation, rngs=nnx.Rngs(0))
    for layer in (ffn.wi, ffn.wo, ffn.wi_gate):  # nonzero biases so they are checked too
        if layer is not None:
            layer.bias[...] = jax.random.normal(jax.random.key(1), layer.bias.shape)
    x = jax.random.normal(jax.random.key(2), (2, 3, 8))
    p = nnx.to_pure_dict(nnx.state(ffn, nnx.Param))
    hidden = x @ p["wi"]["kernel"] + p["wi"]["bias"]
    if activation in ("swiglu", "geglu"):  # Shazeer 2020, eqs. 5-6: act(xW) ⊙ xV
        hidden = act(x @ p["wi_gate"]["kernel"] + p["wi_gate"]["bias"]) * hidden
    else:  # Vaswani et al. 2017, eq. 2
        hidden = act(hidden)
    want = hidden @ p["wo"]["kernel"] + p["wo"]["bias"]
    np.testing.assert_allclose(ffn(x), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["all", "target", "none"])
def test_embedding_sharing_modes(mode):
    model = build_model(tiny_config(share_embeddings=mode, norm="post"), seed=0)
    params = nnx.state(model, nnx.Param)
    assert ("target_embed" in params) == (mode != "all")
    assert ("output" in params) == (mode == "none")
    x = jnp.linspace(-1.0, 1.0, 32)[None]
    matrix = {
        "all": model.embed.embedding[...].T,
        "target": model.target_embed.embedding[...].T if mode != "all" else None,
        "none": model.output.kernel[...] if mode == "none" else None,
    }[mode]
    np.testing.assert_allclose(model.logits(x), x @ matrix, atol=1e-5)  # post-norm: no final LN
    if mode != "all":  # the source side keeps its own embedding
        assert not np.allclose(model.embed.embedding[...], model.target_embed.embedding[...])


def test_old_boolean_share_embeddings_still_loads(tmp_path):
    for value, mode in (("true", "all"), ("false", "target")):
        path = tmp_path / "c.yaml"
        path.write_text(f"model: {{share_embeddings: {value}}}\n")
        assert load_config(path).model.share_embeddings == mode
    assert ModelConfig(share_embeddings=True).share_embeddings == "all"


@pytest.mark.parametrize(
    "key,value",
    [
        ("positions", "absolute"),
        ("activation", "mish"),
        ("norm", "sandwich"),
        ("share_embeddings", "some"),
        ("dtype", "float16"),
    ],
)
def test_unknown_choices_are_named(key, value):
    with pytest.raises(ConfigError, match=rf"model\.{key} must be one of .*'{value}'"):
        load_config(None, [f"model.{key}={value}"])


@pytest.mark.parametrize(
    "rate_key", ["dropout_rate", "attention_dropout_rate", "activation_dropout_rate"]
)
def test_each_dropout_rate_acts_on_its_own(rate_key, rng):
    src, tgt = random_pairs(2, rng)
    batch = unpacked_batch(src, tgt, 10)
    real = np.asarray(batch["tgt_segments"] > 0)
    zero = build_model(tiny_config(), seed=0)
    clean = np.asarray(zero(batch, bos_id=BOS))
    # all rates 0: training mode is the deterministic function
    noisy = zero(batch, bos_id=BOS, deterministic=False, rngs=nnx.Rngs(dropout=1))
    np.testing.assert_allclose(np.asarray(noisy)[real], clean[real], atol=1e-6)
    # this one rate alone: training mode differs, evaluation mode does not
    model = build_model(tiny_config(**{rate_key: 0.5}), seed=0)
    np.testing.assert_allclose(np.asarray(model(batch, bos_id=BOS))[real], clean[real], atol=1e-6)
    noisy = np.asarray(model(batch, bos_id=BOS, deterministic=False, rngs=nnx.Rngs(dropout=1)))
    assert np.abs(noisy[real] - clean[real]).max() > 1e-2
    layer = model.encoder_layers[0]
    rates = {
        "dropout_rate": layer.attention_block.dropout.rate,
        "attention_dropout_rate": layer.self_attention.dropout_rate,
        "activation_dropout_rate": layer.ffn.dropout.rate,
    }
    assert rates == {k: (0.5 if k == rate_key else 0.0) for k in rates}


def test_bfloat16_compute_with_float32_parameters(rng):
    src, tgt = random_pairs(3, rng)
    batch = unpacked_batch(src, tgt, 10)
    f32 = build_model(tiny_config(positions="relative"), seed=0)
    bf16 = build_model(tiny_config(positions="relative", dtype="bfloat16"), seed=0)
    for p32, p16 in zip(
        jax.tree.leaves(nnx.state(f32, nnx.Param)), jax.tree.leaves(nnx.state(bf16, nnx.Param))
    ):
        assert p16.dtype == jnp.float32  # parameters stay float32 (and equal: same init)
        np.testing.assert_array_equal(p16, p32)
    encoded = bf16.encode(batch["src"], batch["src_segments"], batch["src_positions"])
    assert encoded.dtype == jnp.bfloat16
    logits = bf16(batch, bos_id=BOS)
    assert logits.dtype == jnp.float32
    real = np.asarray(batch["tgt_segments"] > 0)
    p_bf16 = np.asarray(jax.nn.softmax(logits))[real]
    p_f32 = np.asarray(jax.nn.softmax(f32(batch, bos_id=BOS)))[real]
    assert np.abs(p_bf16 - p_f32).max() < 0.02  # bf16 rounding only
    # attention weights (softmax) are float32 and still sum to one
    weights = bf16.attention_weights(batch, bos_id=BOS)
    assert weights["encoder"].dtype == jnp.float32
    np.testing.assert_allclose(weights["encoder"].sum(-1), 1.0, atol=1e-5)
    # LayerNorm statistics in float32: a bf16 input with a large offset still normalises
    norm = bf16.encoder_layers[0].attention_block.norm
    x = (1000.0 + jnp.arange(32.0)).astype(jnp.bfloat16)[None]
    out = norm(x)
    assert out.dtype == jnp.float32
    xf = x.astype(jnp.float32)
    want = (xf - xf.mean()) / jnp.sqrt(xf.var() + 1e-6)
    # bfloat16 statistics would be off by whole units here (8-bit mantissa at 1000); float32
    # ones by ~1e-4 (flax's one-pass variance, E[x²] − E[x]²)
    np.testing.assert_allclose(out, want, atol=1e-3)


def test_bfloat16_matmuls_accumulate_in_float32_forward_and_backward():
    # 257 ones sum to 257 only with a float32 accumulator (bfloat16 holds 256 and 258)
    ones = jnp.ones((1, 257), jnp.bfloat16)
    assert float(matmul(ones, ones.T, out_dtype=jnp.float32)[0, 0]) == 257.0
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(3, 5, 16)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(16, 7)), jnp.float32)
    for transposed in (False, True):
        wt = w.T if transposed else w
        ref = jax.grad(lambda x, v: jnp.sum(jnp.sin(x @ (v.T if transposed else v))), (0, 1))(x, wt)
        for dtype, tol in ((jnp.float32, 1e-6), (jnp.bfloat16, 3e-2)):
            got = jax.grad(
                lambda x, v: jnp.sum(
                    jnp.sin(
                        matmul(
                            x.astype(dtype),
                            v.astype(dtype),
                            w_transposed=transposed,
                            out_dtype=jnp.float32,
                        )
                    )
                ),
                (0, 1),
            )(x, wt)
            for g, r in zip(got, ref):
                assert g.dtype == jnp.float32 and g.shape == r.shape
                assert float(jnp.abs(g - r).max() / jnp.abs(r).max()) < tol


def _projection_dots(jaxpr) -> list:
    """Every ``dot_general`` without batch dimensions (the projections and the output layer,
    not the attention products) in a jaxpr and its sub-jaxprs."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general" and not any(eqn.params["dimension_numbers"][1]):
            found.append(eqn)
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    found += _projection_dots(inner)
    return found


def _training_projection_dots(dtype: str) -> list:
    """The projection ``dot_general``s of a tiny model's forward and backward pass."""
    model = build_model(tiny_config(dtype=dtype), seed=0)
    graphdef, params = nnx.split(model, nnx.Param)
    src, tgt = random_pairs(2, np.random.default_rng(0))
    batch = unpacked_batch(src, tgt, 8)

    def loss(p):
        return jnp.sum(nnx.merge(graphdef, p)(batch, bos_id=BOS))

    dots = _projection_dots(jax.make_jaxpr(jax.grad(loss))(params).jaxpr)
    assert len(dots) > 20
    return dots


def test_float32_weight_gradients_are_two_dimensional_matmuls():
    # autodiff would contract [batch, length, in] with [batch, length, out] over two axes, which
    # XLA:CPU runs through its slow generic dot; precision.matmul's VJP flattens tokens first
    dots = _training_projection_dots("float32")
    contracted = [len(eqn.params["dimension_numbers"][0][0]) for eqn in dots]
    assert contracted == [1] * len(dots)
    weight_grads = [eqn for eqn in dots if eqn.params["dimension_numbers"][0] == ((0,), (0,))]
    assert len(weight_grads) >= 20 and all(v.aval.ndim == 2 for e in weight_grads for v in e.invars)


def test_bfloat16_layers_multiply_bfloat16_operands_in_the_backward_pass_too():
    dots = [
        tuple(v.aval.dtype for v in eqn.invars) for eqn in _training_projection_dots("bfloat16")
    ]
    # every projection of the forward and backward pass multiplies bfloat16 operands (the
    # float32-accumulated products are rounded back), none silently falls back to float32
    # (jax.nn.dot_product_attention's own backward keeps float32 score gradients)
    assert all(d == (jnp.bfloat16, jnp.bfloat16) for d in dots), sorted(set(dots))
