"""Beam search and greedy decoding against brute force and teacher forcing."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from seq2seq.config import ModelConfig
from seq2seq.decoding import beam_search_jit, greedy_search_jit, length_penalty
from seq2seq.model import build_model

PAD, BOS, EOS = 0, 2, 3


def tiny_model(vocab=6, seed=0):
    cfg = ModelConfig(vocab_size=vocab, d_model=16, num_heads=2, num_encoder_layers=1,
                      num_decoder_layers=1, d_ff=32, dropout_rate=0.0)
    model = build_model(cfg, seed=seed)
    # sharpen the output distribution so hypotheses differ clearly
    model.embed.embedding[...] = model.embed.embedding[...] * 8.0
    return nnx.split(model, nnx.Param)


def teacher_forced_logprob(graphdef, params, src, tgt):
    """Σ log p(y_t | y_<t, x) of one hypothesis ``tgt`` (ending in EOS) by a full forward pass."""
    model = nnx.merge(graphdef, params)
    s = jnp.asarray([src], jnp.int32)
    t = jnp.asarray([tgt], jnp.int32)
    batch = dict(src=s, src_segments=jnp.ones_like(s), src_positions=jnp.arange(s.shape[1])[None],
                 tgt=t, tgt_segments=jnp.ones_like(t), tgt_positions=jnp.arange(t.shape[1])[None])
    logp = jax.nn.log_softmax(model(batch, bos_id=BOS))
    return float(jnp.take_along_axis(logp[0], t[0][:, None], axis=-1).sum())


def run_beam(graphdef, params, srcs, beam, max_len, alpha, kind="gnmt"):
    width = max(len(s) for s in srcs)
    src = np.zeros((len(srcs), width), np.int32)
    for i, s in enumerate(srcs):
        src[i, :len(s)] = s
    return beam_search_jit(params, jnp.asarray(src), jnp.asarray((src > 0).astype(np.int32)),
                           jnp.full((len(srcs),), max_len, jnp.int32), graphdef=graphdef,
                           beam_size=beam, max_len=max_len, alpha=alpha, bos_id=BOS, eos_id=EOS,
                           pad_id=PAD, length_penalty_kind=kind)


@pytest.mark.parametrize("alpha,kind", [(0.0, "none"), (0.6, "gnmt"), (1.0, "plain")])
def test_beam_search_finds_exhaustive_optimum(alpha, kind):
    vocab, max_len = 6, 4
    graphdef, params = tiny_model(vocab)
    src = [4, 5, 4, EOS]
    res = run_beam(graphdef, params, [src], beam=vocab ** max_len, max_len=max_len, alpha=alpha,
                   kind=kind)
    allowed = [t for t in range(vocab) if t not in (PAD, BOS, EOS)]
    best, best_score = None, -np.inf
    for n in range(max_len):
        for body in itertools.product(allowed, repeat=n):
            hyp = list(body) + [EOS]
            lp = teacher_forced_logprob(graphdef, params, src, hyp)
            score = lp / float(length_penalty(len(hyp), alpha, kind))
            if score > best_score:
                best, best_score = hyp, score
    length = int(res.lengths[0, 0])
    assert list(np.asarray(res.tokens[0, 0, :length])) == best
    np.testing.assert_allclose(float(res.scores[0, 0]), best_score, rtol=1e-4)


def test_reported_scores_equal_teacher_forced_logprob():
    graphdef, params = tiny_model(12, seed=1)
    src = [5, 6, 7, 8, EOS]
    res = run_beam(graphdef, params, [src], beam=4, max_len=8, alpha=0.6)
    for j in range(4):
        n = int(res.lengths[0, j])
        hyp = list(np.asarray(res.tokens[0, j, :n]))
        assert hyp[-1] == EOS and EOS not in hyp[:-1]
        lp = teacher_forced_logprob(graphdef, params, src, hyp)
        np.testing.assert_allclose(float(res.logprobs[0, j]), lp, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(float(res.scores[0, j]),
                                   lp / float(length_penalty(n, 0.6)), rtol=1e-4, atol=1e-4)
    assert np.all(np.diff(np.asarray(res.scores[0])) <= 1e-6)


def test_beam_one_equals_greedy():
    graphdef, params = tiny_model(12, seed=2)
    srcs = [[5, 6, 7, EOS], [8, 9, EOS], [10, 11, 4, 5, 6, EOS]]
    res = run_beam(graphdef, params, srcs, beam=1, max_len=10, alpha=0.0)
    width = max(len(s) for s in srcs)
    src = np.zeros((len(srcs), width), np.int32)
    for i, s in enumerate(srcs):
        src[i, :len(s)] = s
    tokens, logp = greedy_search_jit(params, jnp.asarray(src), jnp.asarray((src > 0).astype(np.int32)),
                                     jnp.full((3,), 10, jnp.int32), graphdef=graphdef, max_len=10,
                                     bos_id=BOS, eos_id=EOS, pad_id=PAD)
    np.testing.assert_array_equal(np.asarray(res.tokens[:, 0]), np.asarray(tokens))
    np.testing.assert_allclose(np.asarray(res.logprobs[:, 0]), np.asarray(logp), rtol=1e-5)


def test_translation_does_not_depend_on_batch_neighbours():
    graphdef, params = tiny_model(12, seed=3)
    target = [5, 6, 7, EOS]
    alone = run_beam(graphdef, params, [target], beam=3, max_len=9, alpha=0.6)
    mixed = run_beam(graphdef, params, [[8, EOS], target, [4, 5, 6, 7, 8, 9, 10, EOS]], beam=3,
                     max_len=9, alpha=0.6)
    np.testing.assert_array_equal(np.asarray(alone.tokens[0]), np.asarray(mixed.tokens[1]))
    np.testing.assert_allclose(np.asarray(alone.scores[0]), np.asarray(mixed.scores[1]), rtol=1e-5)
