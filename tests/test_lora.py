"""LoRA (train.lora_rank): merging, what trains, the optimizer state, named errors, resume.

The adapters are Flax NNX's ``nnx.LoRA`` on the projections (``seq2seq/model/lora.py``); a
run trains only them (``seq2seq.training.step``) and every reader merges them
(``seq2seq.trained``)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from test_decoding import BOS, MAX_LEN, SRCS, forward_logp, run_beam, run_greedy
from tiny_run import assert_trees_equal, tiny_config, tiny_overrides, write_corpus

from seq2seq import cli
from seq2seq.config import Config, ConfigError, ModelConfig, TrainConfig, load_config, replace
from seq2seq.model import build_model
from seq2seq.model.lora import add_lora, expand_targets, has_lora, merged
from seq2seq.trained import average_checkpoints, load_trained
from seq2seq.training.checkpoints import Checkpointer
from seq2seq.training.checks import check_train_config
from seq2seq.training.step import (
    abstract_train_state,
    base_params,
    build_train_model,
    create_train_state,
    make_optimizer,
    make_train_step,
    split_trainable,
    train_size,
)
from seq2seq.workdir import checkpoint_dir

VOCAB = 12


def _model_config(activation: str = "swiglu") -> ModelConfig:
    return ModelConfig(
        vocab_size=VOCAB,
        d_model=16,
        num_heads=2,
        num_encoder_layers=1,
        num_decoder_layers=1,
        d_ff=32,
        dropout_rate=0.0,
        activation=activation,
    )


def _adapted(targets=("attention", "ffn"), rank=2, alpha=4.0):
    """A tiny random model with adapters whose B is random too (a trained adapter), as
    (graphdef, params)."""
    model = build_model(_model_config(), seed=0)
    model.embed.embedding[...] = model.embed.embedding[...] * 8.0  # sharp, as test_decoding
    add_lora(model, rank=rank, alpha=alpha, targets=targets, seed=1)
    graphdef, params = nnx.split(model, nnx.Param)
    adapters, rest = split_trainable(params, True)
    keys = iter(jax.random.split(jax.random.key(7), len(jax.tree.leaves(adapters))))
    adapters = jax.tree.map(lambda x: x + 0.3 * jax.random.normal(next(keys), x.shape), adapters)
    return graphdef, nnx.merge_state(rest, adapters)


def test_targets_expand_to_the_projections():
    assert expand_targets(["attention"]) == ("query", "key", "value", "out")
    assert expand_targets(["wo", "query"]) == ("query", "wo")
    assert expand_targets(["ffn", "value"]) == ("value", "wi", "wi_gate", "wo")
    with pytest.raises(ValueError, match="unknown LoRA target 'q_proj'"):
        expand_targets(["q_proj"])


def test_the_merged_model_computes_and_translates_as_the_adapted_one():
    graphdef, params = _adapted()
    plain_graphdef, plain = merged(graphdef, params)
    assert not has_lora(nnx.merge(plain_graphdef, plain))
    # the merged model is a plain one: the parameter tree of a model that never had adapters
    _, fresh = nnx.split(build_model(_model_config()), nnx.Param)
    assert jax.tree.structure(plain) == jax.tree.structure(fresh)
    # 2 layers x (4 attention [+4 cross] + 3 FFN) projections, A and B each
    assert len(jax.tree.leaves(params)) - len(jax.tree.leaves(plain)) == 2 * (4 + 4 + 3 + 4 + 3)
    # the adapters matter: the merged weights differ from the base
    assert not np.allclose(
        plain["encoder_layers"][0]["self_attention"]["query"]["kernel"][...],
        base_params(params)["encoder_layers"][0]["self_attention"]["query"]["kernel"][...],
    )
    seqs = [[5, 6, 7, 3], [8, 3]]
    for src in SRCS:
        a = forward_logp(graphdef, params, src, seqs, MAX_LEN)
        b = forward_logp(plain_graphdef, plain, src, seqs, MAX_LEN)
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=0)
    greedy_a, logp_a = run_greedy(graphdef, params, SRCS, MAX_LEN)
    greedy_b, logp_b = run_greedy(plain_graphdef, plain, SRCS, MAX_LEN)
    np.testing.assert_array_equal(np.asarray(greedy_a), np.asarray(greedy_b))
    np.testing.assert_allclose(np.asarray(logp_a), np.asarray(logp_b), atol=1e-4)
    beam_a = run_beam(graphdef, params, SRCS, 3, MAX_LEN, 0.6)
    beam_b = run_beam(plain_graphdef, plain, SRCS, 3, MAX_LEN, 0.6)
    np.testing.assert_array_equal(np.asarray(beam_a.tokens), np.asarray(beam_b.tokens))
    np.testing.assert_allclose(np.asarray(beam_a.scores), np.asarray(beam_b.scores), atol=1e-4)
    # and the adapted model is not the base model
    base = forward_logp(plain_graphdef, base_params(params), SRCS[0], seqs, MAX_LEN)
    assert np.abs(base - forward_logp(plain_graphdef, plain, SRCS[0], seqs, MAX_LEN)).max() > 1e-2


def _batch(rows=4, length=8, seed=0):
    rng = np.random.default_rng(seed)
    src = rng.integers(4, VOCAB, (rows, length)).astype(np.int32)
    tgt = rng.integers(4, VOCAB, (rows, length)).astype(np.int32)
    segments = np.ones((rows, length), np.int32)
    positions = np.broadcast_to(np.arange(length, dtype=np.int32), (rows, length))
    return dict(
        src=src,
        src_segments=segments,
        src_positions=positions,
        tgt=tgt,
        tgt_segments=segments,
        tgt_positions=positions,
    )


def _lora_config(rank=2, targets=("attention",), **train) -> Config:
    return Config(
        model=_model_config(),
        train=TrainConfig(
            lora_rank=rank,
            lora_alpha=4.0,
            lora_targets=list(targets),
            learning_rate=1e-2,
            warmup_steps=1,
            **train,
        ),
    )


def test_only_the_adapters_change_and_adam_holds_moments_for_them_alone():
    config = _lora_config(targets=("attention", "wo"))
    t = config.train
    tx = make_optimizer(t)
    graphdef, state = create_train_state(build_train_model(config), tx, t.seed)
    adapters, base = split_trainable(state.params, True)
    n_adapters = sum(x.size for x in jax.tree.leaves(adapters))
    # rank r on [in, out]: r·(in + out); 2 attention stacks of 4 + cross-attention's 4, d=16;
    # wo [32, 16] in both FFNs
    assert n_adapters == 2 * ((4 + 4 + 4) * (16 + 16) + 2 * (32 + 16))
    size = train_size(state)
    assert size.trainable == n_adapters
    assert size.parameters == n_adapters + sum(x.size for x in jax.tree.leaves(base))
    assert size.moment_bytes == 2 * 4 * n_adapters  # mu and nu, float32
    # the same figures without allocating anything
    assert train_size(abstract_train_state(config)[1]) == size
    # full fine-tuning of the same model: moments for every parameter
    full = train_size(abstract_train_state(replace(config, **{"train.lora_rank": 0}))[1])
    assert full.trainable == full.parameters == size.parameters - n_adapters
    assert full.moment_bytes == 8 * full.parameters

    step = jax.jit(make_train_step(graphdef, tx, bos_id=BOS, label_smoothing=0.1, lora=True))
    before = jax.tree.map(np.asarray, state.params)
    losses = []
    for i in range(3):
        state, metrics = step(state, _batch(seed=i))
        losses.append(float(metrics["loss"] / metrics["tokens"]))
    adapters_after, base_after = split_trainable(state.params, True)
    adapters_before, base_before = split_trainable(before, True)
    assert_trees_equal(base_before, base_after)  # bitwise unchanged
    for a, b in zip(jax.tree.leaves(adapters_before), jax.tree.leaves(adapters_after)):
        assert not np.array_equal(np.asarray(a), np.asarray(b))  # A and B both move
    assert jax.tree.structure(state.opt_state) == jax.tree.structure(tx.init(adapters))


def test_rank_zero_is_the_model_and_optimizer_of_before():
    config = replace(_lora_config(), **{"train.lora_rank": 0})
    graphdef, state = abstract_train_state(config)
    model = build_model(config.model, config.train.seed)
    _, params = nnx.split(model, nnx.Param)
    assert jax.tree.structure(state.params) == jax.tree.structure(params)
    assert jax.tree.structure(state.opt_state) == jax.tree.structure(
        jax.eval_shape(lambda: make_optimizer(config.train).init(params))
    )
    assert not has_lora(nnx.merge(graphdef, jax.tree.map(jnp.zeros_like, params)))
    assert split_trainable(params, False) == (params, None)
    # the step of a rank-0 run is the full step: every parameter moves
    t = config.train
    tx = make_optimizer(t)
    graphdef, real = create_train_state(build_model(config.model, t.seed), tx, t.seed)
    step = jax.jit(make_train_step(graphdef, tx, bos_id=BOS, label_smoothing=0.1))
    after, _ = step(real, _batch())
    kernels = [
        (a, b)
        for a, b in zip(jax.tree.leaves(real.params), jax.tree.leaves(after.params))
        if np.ndim(a) == 2
    ]
    assert kernels and all(not np.array_equal(a, b) for a, b in kernels)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["train.lora_rank=-1"], "train.lora_rank must be ≥ 0 (0 = off), got -1"),
        (["train.lora_rank=4"], "train.lora_rank=4 needs train.init_from"),
        (
            ["train.lora_rank=4", "train.init_from=p", "train.lora_alpha=0"],
            "train.lora_alpha must be > 0 (scale α / r), got 0.0",
        ),
        (
            ["train.lora_rank=4", "train.init_from=p", "train.lora_targets=[q_proj]"],
            "train.lora_targets: unknown projection 'q_proj'",
        ),
        (
            ["train.lora_rank=4", "train.init_from=p", "train.lora_targets=[]"],
            "train.lora_targets is empty",
        ),
        (
            ["train.lora_rank=4", "train.init_from=p", "train.lora_targets=[wi_gate]"],
            "wi_gate, which model.activation=relu lacks",
        ),
        (["train.lora_rank=300", "train.init_from=p"], "above model.d_model=256"),
        (
            ["train.lora_rank=4", "train.init_from=p", "train.init_optimizer=true"],
            "train.init_optimizer=false",
        ),
    ],
)
def test_bad_values_are_errors_naming_the_key(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_train_config(load_config(None, overrides))


def test_the_keys_round_trip_through_the_command_line():
    config = load_config(
        None, ["train.lora_rank=8", "train.lora_alpha=8", "train.lora_targets=[query,value,ffn]"]
    )
    assert config.train.lora_rank == 8 and config.train.lora_alpha == 8.0
    assert list(config.train.lora_targets) == ["query", "value", "ffn"]
    assert list(load_config().train.lora_targets) == ["attention"]
    assert load_config().train.lora_rank == 0


@pytest.fixture(scope="module")
def parent(tmp_path_factory):
    """A tiny run trained for 3 steps: the model the LoRA runs adapt."""
    root = tmp_path_factory.mktemp("lora")
    corpus = write_corpus(root / "corpus")
    workdir = root / "parent"
    assert cli.train_main(tiny_overrides(corpus, workdir, "train.steps=3")) == 0
    return corpus, workdir


def _child(corpus, parent, workdir, *extra):
    return tiny_overrides(
        corpus,
        workdir,
        f"train.init_from={parent}",
        "train.lora_rank=2",
        "train.lora_alpha=4",
        "train.lora_targets=[attention,wi]",
        "train.learning_rate=1e-2",
        "train.checkpoint_every=2",
        "decode.test_limit=2",
        *extra,
    )


def _restore(workdir, step):
    config = load_config(workdir / "config.yaml")
    ck = Checkpointer(checkpoint_dir(workdir), async_save=False)
    try:
        return config, ck.restore(abstract_train_state(config)[1], step)[0]
    finally:
        ck.close()


@pytest.mark.slow
def test_a_lora_run_resumes_exactly_keeps_the_parent_frozen_and_reads_merged(parent, tmp_path):
    corpus, parent_dir = parent
    whole, split = tmp_path / "whole", tmp_path / "split"
    assert cli.train_main(_child(corpus, parent_dir, whole, "train.steps=4")) == 0
    assert cli.train_main(_child(corpus, parent_dir, split, "train.steps=2")) == 0
    assert cli.train_main(_child(corpus, parent_dir, split, "train.steps=4")) == 0
    _, a = _restore(whole, 4)
    _, b = _restore(split, 4)
    for part in ("params", "opt_state", "rng", "step"):
        assert_trees_equal(getattr(a, part), getattr(b, part))
    # the parent's weights are the frozen base, bitwise; the adapters moved
    _, p = _restore(parent_dir, 3)
    assert_trees_equal(p.params, base_params(a.params))
    adapters, _ = split_trainable(a.params, True)
    assert any(np.abs(np.asarray(x)).max() > 0 for x in jax.tree.leaves(adapters))
    # translate/evaluate/export read the plain, merged model
    config, _, graphdef, params = load_trained(whole, 4)
    assert config.train.lora_rank == 0 and not has_lora(nnx.merge(graphdef, params))
    want = merged(abstract_train_state(load_config(whole / "config.yaml"))[0], a.params)[1]
    assert_trees_equal(want, params)
    # the average is of merged weights, and a plain run
    out, steps = average_checkpoints(whole, tmp_path / "avg", last=2)
    assert steps == [2, 4]
    _, b2 = _restore(whole, 2)
    mean = jax.tree.map(
        lambda x, y: ((np.asarray(x, np.float64) + np.asarray(y)) / 2).astype(np.float32),
        merged(graphdef_of(whole), b2.params)[1],
        want,
    )
    assert_trees_equal(load_trained(out)[3], mean)
    assert load_config(out / "config.yaml").train.lora_rank == 0
    # a run started from a LoRA run starts from its merged weights
    child = tmp_path / "child"
    cfg = tiny_config(corpus, child, f"train.init_from={whole}", "train.steps=1")
    assert cfg.train.lora_rank == 0
    assert (
        cli.train_main(
            tiny_overrides(
                corpus,
                child,
                f"train.init_from={whole}",
                "train.steps=1",
                "train.learning_rate=0",
                "decode.test_limit=1",
            )
        )
        == 0
    )
    _, c = _restore(child, 1)
    assert_trees_equal(c.params, want)  # learning rate 0: the loaded weights as they are
    log = (whole / "train.log").read_text(encoding="utf-8")
    assert "LoRA rank 2 (alpha 4) on attention, wi; the other weights frozen" in log


def graphdef_of(workdir):
    return abstract_train_state(load_config(workdir / "config.yaml"))[0]


def test_optax_moments_are_those_of_adam():
    # the formula the memory figures use: scale_by_adam keeps mu and nu like the parameters
    state = optax.scale_by_adam().init({"w": jnp.zeros((3, 5))})
    assert sum(x.size for x in jax.tree.leaves(state) if np.ndim(x)) == 2 * 15
