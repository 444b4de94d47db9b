"""The XLA:CPU kernels against the reference ones (``seq2seq.kernels``): same results."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import BOS, EOS, random_pairs, tiny_config, unpacked_batch
from flax import nnx

from seq2seq import kernels
from seq2seq.decoding import _top_continuations, beam_search_jit
from seq2seq.model import build_model
from seq2seq.model.attention import cached_attention
from seq2seq.model.precision import matmul


def both(fn):
    """``fn()`` under the ``cpu`` kernels and under the ``reference`` ones."""
    with kernels.use(kernels.CPU):
        cpu = fn()
    with kernels.use(kernels.REFERENCE):
        reference = fn()
    return cpu, reference


def test_the_default_on_this_cpu_is_cpu_unless_the_environment_says_otherwise():
    def selected(value):
        env = {k: v for k, v in os.environ.items() if k != "SEQ2SEQ_KERNELS"}
        if value is not None:
            env["SEQ2SEQ_KERNELS"] = value
        return subprocess.run(
            [sys.executable, "-c", "from seq2seq import kernels; print(kernels.selected())"],
            env=env,
            capture_output=True,
            text=True,
        )

    assert selected(None).stdout.strip() == "cpu"
    assert selected("reference").stdout.strip() == "reference"
    bad = selected("fast")
    assert bad.returncode != 0 and "unknown kernels 'fast'; choose cpu or reference" in bad.stderr


@pytest.mark.parametrize(
    "backend, expected",
    [("cpu", "cpu"), ("gpu", "reference"), ("cuda", "reference"), ("tpu", "reference")],
)
def test_the_default_follows_the_backend_and_is_logged(monkeypatch, caplog, backend, expected):
    monkeypatch.setattr(kernels, "_selected", None)  # as at import without SEQ2SEQ_KERNELS
    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    with caplog.at_level("INFO", logger="seq2seq.kernels"):
        assert kernels.selected() == expected and kernels.cpu() == (expected == "cpu")
    assert f"kernels: {expected} (the default on the JAX {backend} backend" in caplog.text
    assert kernels.for_backend(backend) == expected


@kernels.use(kernels.CPU)
def test_the_switch_selects_restores_and_retraces():
    traces = []

    @jax.jit
    def f(x):
        traces.append(kernels.selected())
        return matmul(x, x)

    x = jnp.eye(3)
    f(x), f(x)
    with kernels.use("reference"):
        assert not kernels.cpu()
        f(x)  # traced again: nothing compiled under the cpu kernels is reused
    f(x)
    assert traces == ["cpu", "reference", "cpu"] and kernels.selected() == "cpu"
    with pytest.raises(ValueError, match="unknown kernels 'gpu'; choose cpu or reference"):
        kernels.select("gpu")


def test_matmul_outputs_and_gradients_equal_autodiff():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(3, 5, 16)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(16, 8)), jnp.float32)

    def run():
        y = matmul(x, w)
        yt = matmul(x, w.T, w_transposed=True)
        grads = jax.grad(lambda a, b: jnp.sum(jnp.sin(matmul(a, b))), argnums=(0, 1))(x, w)
        return y, yt, grads

    cpu, reference = both(run)
    for a, b in zip(jax.tree.leaves(cpu), jax.tree.leaves(reference)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("w_transposed", [False, True])
def test_bfloat16_operands_equal_autodiff_of_the_rounded_product(w_transposed):
    """``operand_dtype``: the value and both gradients are those of autodiff through
    ``dot(bf16(x), bf16(W))`` accumulated in float32, with the incoming gradient rounded too;
    also for a ``[out, in]`` table (``w_transposed``), whose weight gradient is transposed back
    from ``[in, out]``."""
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(3, 5, 16)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(16, 8)), jnp.float32)
    bf = jnp.bfloat16
    stored = w.T if w_transposed else w  # the array matmul receives

    def rounded(a, b):
        b = b.T if w_transposed else b
        out = jnp.einsum(
            "bli,io->blo", a.astype(bf), b.astype(bf), preferred_element_type=jnp.float32
        )
        return out

    def loss(f):
        return lambda a, b: jnp.sum(jnp.sin(f(a, b)) * 3.0)

    def ours(a, b):
        return matmul(a, b, w_transposed=w_transposed, operand_dtype=bf)

    with kernels.use(kernels.CPU):
        y = ours(x, stored)
        dx, dw = jax.grad(loss(ours), (0, 1))(x, stored)
    assert y.dtype == dx.dtype == dw.dtype == jnp.float32
    assert dw.shape == stored.shape
    np.testing.assert_allclose(y, rounded(x, stored), rtol=1e-6, atol=1e-6)
    # reference: the cotangent of sin(y)·3 rounded to bf16, then float32 products of the
    # rounded operands
    g = (jnp.cos(rounded(x, stored)) * 3.0).astype(bf).astype(jnp.float32)
    xr, wr = x.astype(bf).astype(jnp.float32), w.astype(bf).astype(jnp.float32)
    dw_ref = jnp.einsum("bli,blo->io", xr, g)
    np.testing.assert_allclose(dx, jnp.einsum("blo,io->bli", g, wr), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dw, dw_ref.T if w_transposed else dw_ref, rtol=1e-5, atol=1e-5)
    # and the rounding is real: float32 operands give a different product
    assert float(jnp.max(jnp.abs(matmul(x, stored, w_transposed=w_transposed) - y))) > 1e-3


def test_training_loss_and_gradients_equal_under_both_kernels(rng):
    model = build_model(tiny_config(), seed=0)
    graphdef, params = nnx.split(model, nnx.Param)
    batch = unpacked_batch(*random_pairs(4, rng), 12)

    def run():
        def loss(p):
            logp = jax.nn.log_softmax(nnx.merge(graphdef, p)(batch, bos_id=BOS))
            nll = -jnp.take_along_axis(logp, batch["tgt"][..., None], axis=-1)[..., 0]
            return jnp.sum(nll * (batch["tgt_segments"] > 0))

        return jax.jit(jax.value_and_grad(loss))(params)

    (loss_cpu, grads_cpu), (loss_ref, grads_ref) = both(run)
    np.testing.assert_allclose(loss_cpu, loss_ref, rtol=1e-6)
    leaves_cpu, leaves_ref = jax.tree.leaves(grads_cpu), jax.tree.leaves(grads_ref)
    assert len(leaves_cpu) > 20
    for a, b in zip(leaves_cpu, leaves_ref):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("queries", [1, 4])
def test_cached_attention_equals_einsum_attention(queries):
    rng = np.random.default_rng(1)
    b, h, d, slots = 3, 2, 8, 24
    normal = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)
    query, keys, values = normal(b, queries, h, d), normal(b, h, d, slots), normal(b, h, slots, d)
    mask = jnp.asarray(rng.random((b, 1, queries, slots)) < 0.6)
    bias = normal(1, h, 1, slots)
    cpu, reference = both(lambda: cached_attention(query, keys, values, mask, bias=bias))
    np.testing.assert_allclose(cpu, reference, rtol=1e-5, atol=1e-6)


def test_top_continuations_equal_under_both_kernels():
    rng = np.random.default_rng(2)
    batch, beam, vocab = 4, 3, 500
    logits = jnp.asarray(rng.normal(size=(batch, beam, vocab)), jnp.float32)
    logits = logits.at[:, :, 7].set(logits[:, :, 3])  # ties
    banned = jnp.zeros((batch, vocab), bool).at[:, :3].set(True)
    alive = jnp.asarray(-rng.random((batch, beam)), jnp.float32)
    cpu, reference = both(lambda: _top_continuations(logits, banned, alive, 2 * beam))
    for a, b in zip(cpu, reference):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("positions", ["sinusoidal", "relative"])
def test_beam_search_finds_the_same_tokens_under_both_kernels(positions, rng):
    # untied output weights: a random tied model repeats its input token, in every beam
    model = build_model(
        tiny_config(vocab_size=300, positions=positions, share_embeddings="none"), seed=4
    )
    graphdef, params = nnx.split(model, nnx.Param)
    src = unpacked_batch(*random_pairs(5, rng, vocab=300), 10)
    kw = dict(
        graphdef=graphdef, beam_size=4, max_len=12, alpha=0.6, bos_id=BOS, eos_id=EOS, pad_id=0
    )

    def run():
        return beam_search_jit(
            params, src["src"], src["src_segments"], jnp.full((5,), 12, jnp.int32), **kw
        )

    cpu, reference = both(run)
    np.testing.assert_array_equal(cpu.tokens, reference.tokens)
    np.testing.assert_array_equal(cpu.lengths, reference.lengths)
    np.testing.assert_allclose(cpu.scores, reference.scores, rtol=1e-5)
    assert len({tuple(t) for t in np.asarray(cpu.tokens).reshape(-1, 12)}) > 12  # not degenerate
