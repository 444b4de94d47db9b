"""Loss, schedule and train step: formulas, padding invariance, overfitting, determinism."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from conftest import BOS, random_pairs, tiny_config, unpacked_batch

from seq2seq.config import TrainConfig
from seq2seq.model import build_model
from seq2seq.training.step import (
    create_train_state,
    cross_entropy,
    learning_rate_schedule,
    make_eval_step,
    make_optimizer,
    make_train_step,
)


def _jit_step(graphdef, tx, label_smoothing=0.0):
    return jax.jit(
        make_train_step(graphdef, tx, bos_id=BOS, label_smoothing=label_smoothing), donate_argnums=0
    )


def test_label_smoothed_loss_matches_optax():
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(2, 5, 7)), jnp.float32)
    targets = jnp.asarray(rng.integers(0, 7, (2, 5)))
    weights = jnp.ones((2, 5))
    eps = 0.1
    loss, nll, _ = cross_entropy(logits, targets, weights, eps)
    soft = optax.smooth_labels(jax.nn.one_hot(targets, 7), eps)
    np.testing.assert_allclose(loss, optax.softmax_cross_entropy(logits, soft).sum(), rtol=1e-5)
    np.testing.assert_allclose(
        nll, optax.softmax_cross_entropy_with_integer_labels(logits, targets).sum(), rtol=1e-5
    )


def test_loss_ignores_padding():
    rng = np.random.default_rng(1)
    logits = jnp.asarray(rng.normal(size=(1, 6, 7)), jnp.float32)
    targets = jnp.asarray([[1, 2, 3, 0, 0, 0]])
    weights = (targets > 0).astype(jnp.float32)
    a = cross_entropy(logits, targets, weights, 0.1)
    garbage = logits.at[:, 3:].set(100.0 * rng.normal(size=(1, 3, 7)))
    b = cross_entropy(garbage, targets.at[:, 3:].set(5), weights, 0.1)
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, rtol=1e-6)


def test_schedule_warmup_then_inverse_sqrt():
    # optax counts updates from 0; the rate of optimizer step n = count + 1 is eq. 3's
    cfg = TrainConfig(learning_rate=1e-3, warmup_steps=100, schedule="rsqrt")
    lr = learning_rate_schedule(cfg)
    np.testing.assert_allclose(lr(0), 1e-5, rtol=1e-6)  # step 1 already moves the parameters
    np.testing.assert_allclose(lr(49), 0.5e-3, rtol=1e-6)
    np.testing.assert_allclose(lr(99), 1e-3, rtol=1e-6)
    np.testing.assert_allclose(lr(399), 1e-3 * np.sqrt(100 / 400), rtol=1e-6)


def test_schedule_warmup_then_linear_decay_to_zero():
    # the same warmup; then peak · (T - n + 1) / (T - W + 1): 1 at n = W, 0 after n = T
    cfg = TrainConfig(learning_rate=1e-3, warmup_steps=100, steps=400, schedule="linear")
    lr = learning_rate_schedule(cfg)
    np.testing.assert_allclose(lr(0), 1e-5, rtol=1e-6)
    np.testing.assert_allclose(lr(99), 1e-3, rtol=1e-6)
    np.testing.assert_allclose(lr(100), 1e-3 * 300 / 301, rtol=1e-6)
    np.testing.assert_allclose(lr(249), 1e-3 * 151 / 301, rtol=1e-6)
    np.testing.assert_allclose(lr(399), 1e-3 / 301, rtol=1e-6)  # the last step still moves
    assert float(lr(400)) == 0.0 and float(lr(10_000)) == 0.0
    # the rate never rises after the warmup
    rates = np.array([float(lr(k)) for k in range(99, 420)])
    assert (np.diff(rates) <= 0).all()


def test_the_first_optimizer_step_changes_the_parameters():
    batch = unpacked_batch(*random_pairs(4, np.random.default_rng(7)), 10)
    graphdef, state, train_step = _setup()
    init = jax.tree.map(np.array, state.params)
    new, _ = train_step(state, batch)
    moved = max(
        float(np.abs(np.asarray(a) - b).max())
        for a, b in zip(jax.tree.leaves(new.params), jax.tree.leaves(init))
    )
    assert moved > 1e-5


def _setup(seed=0, dropout=0.0, lr=3e-3):
    model = build_model(tiny_config(dropout_rate=dropout), seed=seed)
    cfg = TrainConfig(learning_rate=lr, warmup_steps=10, weight_decay=0.0)
    tx = make_optimizer(cfg)
    graphdef, state = create_train_state(model, tx, seed)
    return graphdef, state, _jit_step(graphdef, tx)


def test_tiny_model_overfits_32_pairs():
    src, tgt = random_pairs(32, np.random.default_rng(2))
    batch = unpacked_batch(src, tgt, 10)
    graphdef, state, train_step = _setup()
    for _ in range(300):
        state, metrics = train_step(state, batch)
    m = jax.jit(make_eval_step(graphdef, bos_id=BOS, label_smoothing=0.0))(state.params, batch)
    assert float(m["correct"] / m["tokens"]) > 0.99
    assert float(m["nll"] / m["tokens"]) < 0.05


def test_train_step_is_deterministic_given_step_and_seed():
    src, tgt = random_pairs(8, np.random.default_rng(3))
    batch = unpacked_batch(src, tgt, 10)
    runs = []
    for _ in range(2):
        _, state, train_step = _setup(dropout=0.3)
        for _ in range(3):
            state, _ = train_step(state, batch)
        runs.append(state.params)
    for a, b in zip(jax.tree.leaves(runs[0]), jax.tree.leaves(runs[1])):
        np.testing.assert_array_equal(a, b)


def test_non_finite_step_is_skipped():
    src, tgt = random_pairs(4, np.random.default_rng(4))
    batch = unpacked_batch(src, tgt, 10)
    _, state, train_step = _setup()
    bad = jax.tree.map(lambda x: x, state)
    emb = bad.params["embed"]["embedding"]
    emb[...] = emb[...].at[5].set(jnp.nan)
    before = jax.tree.map(np.asarray, bad.params)
    new, metrics = train_step(bad, batch)
    assert float(metrics["skipped"]) == 1.0 and int(new.skipped) == 1 and int(new.step) == 1
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(new.params)):
        np.testing.assert_array_equal(a, np.asarray(b))


def test_grad_accumulation_equals_one_step_on_the_concatenation():
    # plain SGD with rate 1: the parameter change is exactly the (per-token) gradient
    rng = np.random.default_rng(5)
    micro = [unpacked_batch(*random_pairs(4, rng, lo=1, hi=9), 10) for _ in range(3)]
    stacked = {k: jnp.stack([m[k] for m in micro]) for k in micro[0]}
    concat = {k: jnp.concatenate([m[k] for m in micro]) for k in micro[0]}
    assert stacked["tgt"].shape == (3, 4, 10) and concat["tgt"].shape == (12, 10)
    tokens = [int((m["tgt_segments"] > 0).sum()) for m in micro]
    assert len(set(tokens)) > 1  # unequal micro-batches: a mean of means would be wrong
    small = tiny_config(num_encoder_layers=1, num_decoder_layers=1)
    tx = optax.sgd(1.0)
    graphdef, state = create_train_state(build_model(small, seed=0), tx, 0)
    init = jax.tree.map(np.array, state.params)  # a copy: the state is donated
    train_step = _jit_step(graphdef, tx, label_smoothing=0.1)
    copy = jax.tree.map(jnp.array, state)
    acc, m_acc = train_step(state, stacked)
    one, m_one = train_step(copy, concat)
    for a, b in zip(jax.tree.leaves(acc.params), jax.tree.leaves(one.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=0)
    assert float(m_acc["tokens"]) == float(m_one["tokens"]) == sum(tokens)
    for k in ("loss", "nll", "correct", "grad_norm"):
        np.testing.assert_allclose(float(m_acc[k]), float(m_one[k]), rtol=1e-5)
    moved = max(
        float(np.abs(np.asarray(a) - b).max())
        for a, b in zip(jax.tree.leaves(acc.params), jax.tree.leaves(init))
    )
    assert moved > 1e-3  # the step did change the parameters


def test_each_step_uses_the_optimizer_bound_into_it():
    # SGD: the parameter change is rate × gradient, so rate 0.5 moves exactly half as far
    batch = unpacked_batch(*random_pairs(4, np.random.default_rng(6)), 10)
    graphdef, state = create_train_state(build_model(tiny_config(), seed=0), optax.sgd(1.0), 0)
    init = jax.tree.map(np.array, state.params)
    moved = {}
    for rate in (1.0, 0.5):
        start = jax.tree.map(jnp.array, state)
        new, _ = _jit_step(graphdef, optax.sgd(rate))(start, batch)
        moved[rate] = jax.tree.map(lambda a, b: np.asarray(a) - b, new.params, init)
    for a, b in zip(jax.tree.leaves(moved[1.0]), jax.tree.leaves(moved[0.5])):
        np.testing.assert_allclose(b, 0.5 * a, atol=1e-6, rtol=1e-5)
    assert max(float(np.abs(a).max()) for a in jax.tree.leaves(moved[1.0])) > 1e-3


def test_closed_form_loss_gradient_equals_autodiff_of_the_reference():
    rng = np.random.default_rng(4)
    logits = jnp.asarray(3.0 * rng.normal(size=(2, 6, 11)), jnp.float32)
    targets = jnp.asarray(rng.integers(0, 11, (2, 6)))
    weights = jnp.asarray(rng.integers(0, 2, (2, 6)), jnp.float32)

    def reference(z, eps):
        soft = optax.smooth_labels(jax.nn.one_hot(targets, 11), eps)
        return (
            jnp.sum(optax.softmax_cross_entropy(z, soft) * weights),
            jnp.sum(optax.softmax_cross_entropy_with_integer_labels(z, targets) * weights),
        )

    for eps in (0.0, 0.1):
        # a mix of both outputs exercises both cotangents of the custom gradient
        ours = jax.grad(
            lambda z: (
                2.0 * cross_entropy(z, targets, weights, eps)[0]
                - 0.5 * cross_entropy(z, targets, weights, eps)[1]
            )
        )(logits)
        ref = jax.grad(lambda z: 2.0 * reference(z, eps)[0] - 0.5 * reference(z, eps)[1])(logits)
        np.testing.assert_allclose(ours, ref, atol=1e-6)
    # padding positions get exactly zero gradient
    assert np.all(np.asarray(ours)[np.asarray(weights) == 0] == 0.0)
