"""Ensembles and target prefixes in the searches, against brute force on a hand-made decoder
whose every distribution is a table entry, and on the tiny Transformer."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_decoding import IDS, MAX_LEN, SRCS, hypotheses, pad_batch, run_beam, tiny_model

from seq2seq.decoding import (
    Ensemble,
    EnsembleDef,
    beam_search,
    beam_search_jit,
    greedy_search,
    length_penalty,
    sample,
)

PAD, UNK, BOS, EOS = 0, 1, 2, 3
VOCAB, LENGTH = 6, 4  # body tokens 1, 4, 5: 1 + 3 + 9 + 27 = 40 hypotheses of ≤ 4 tokens
BODY = [t for t in range(VOCAB) if t not in (PAD, BOS, EOS)]
TOY_SRCS = [[4, 5, EOS], [5, 5, 4, EOS]]  # source sums 12 and 17: both source features


class TableDecoder:
    """A ``SearchModel`` whose next-token logits are ``table[f(x), t, y_{t-1}, h % 3]``: f(x) the
    parity of the source's token sum, t the position, y_{t-1} the input token (BOS at 0) and h
    the sum of every input token so far (BOS, y_0 … y_{t-1}), read from its cache slots
    through the search's mask, so a wrong history (a beam reordered badly) changes the result.
    """

    def __init__(self, seed=None, table=None):
        if table is None:
            rng = np.random.default_rng(seed)
            table = jnp.asarray(3.0 * rng.normal(size=(2, LENGTH, VOCAB, 3, VOCAB)), jnp.float32)
        self.table = table

    def encode(self, src, src_segments, src_positions):
        return (jnp.sum(src * src_segments, axis=1) % 2)[:, None]

    def init_cache(self, encoded, src_segments, *, max_len, slots):
        return dict(feature=encoded[:, 0], tokens=jnp.zeros((encoded.shape[0], slots), jnp.int32))

    def decode_step(self, tokens, position, cache, *, write, mask):
        slots = jax.lax.dynamic_update_slice(cache["tokens"], tokens, (0, write))
        history = jnp.sum(jnp.where(mask, slots[:, None, :], 0), axis=-1)  # [batch, q]
        logits = self.table[cache["feature"][:, None], position, tokens, history % 3]
        return logits, dict(feature=cache["feature"], tokens=slots)

    def logp(self, src, seq):
        """Reference: log p(y_t | y_<t, x) of each token of ``seq`` (float64)."""
        feature, inputs, out = sum(src) % 2, [BOS, *seq[:-1]], []
        for t, (inp, y) in enumerate(zip(inputs, seq)):
            row = np.asarray(self.table[feature, t, inp, sum(inputs[: t + 1]) % 3], np.float64)
            out.append(row[y] - np.log(np.exp(row).sum()))
        return np.array(out)


def mixture_logprob(models, src, seq):
    """Σ_t log((1/n) Σ_m p_m(y_t | y_<t, x)): the ensemble's log-probability, by hand."""
    per_model = np.stack([m.logp(src, seq) for m in models])  # [n, |Y|]
    return float(np.sum(np.log(np.mean(np.exp(per_model), axis=0))))


ALL_HYPS = [list(b) + [EOS] for n in range(LENGTH) for b in itertools.product(BODY, repeat=n)]


def ranked(models, src, alpha, prefix=()):
    """Every hypothesis starting with ``prefix``, best score first: (score, logprob, seq)."""
    out = []
    for seq in ALL_HYPS:
        if seq[: len(prefix)] == list(prefix) and len(seq) > len(prefix):
            lp = mixture_logprob(models, src, seq)
            out.append((lp / float(length_penalty(len(seq), alpha)), lp, seq))
    return sorted(out, key=lambda x: -x[0])


def prefix_array(prefixes, width=LENGTH):
    out = np.full((len(prefixes), width), PAD, np.int32)
    for r, p in enumerate(prefixes):
        out[r, : len(p)] = p
    return jnp.asarray(out)


@functools.cache
def toy(seed):
    return TableDecoder(seed)


@functools.cache
def toy_search(models, beam, alpha):
    """Beam search of one ``TableDecoder`` or an ``Ensemble`` of ``models`` of them, their
    tables traced: one compilation per number of models, options and prefix or none."""

    def run(tables, src, segs, limits, prefix):
        decoders = [TableDecoder(table=t) for t in tables]
        model = decoders[0] if models == 1 else Ensemble(decoders)
        return beam_search(
            model,
            src,
            segs,
            limits,
            beam_size=beam,
            max_len=LENGTH,
            alpha=alpha,
            prefix=prefix,
            **IDS,
        )

    return jax.jit(run)


def toy_beam(members, beam, alpha, prefixes=None, srcs=TOY_SRCS, max_lengths=None):
    src, segs = pad_batch(srcs)
    limits = jnp.asarray(max_lengths or [LENGTH] * len(srcs), jnp.int32)
    prefix = None if prefixes is None else prefix_array(prefixes)
    tables = tuple(m.table for m in members)
    return toy_search(len(members), beam, alpha)(tables, src, segs, limits, prefix)


def test_ensemble_beam_search_is_the_exhaustive_ranking_of_the_mixture():
    """Beam 64 ≥ every hypothesis: the n-best list is all 40, ranked by the averaged score."""
    a, b, alpha = toy(1), toy(2), 0.6
    res = toy_beam([a, b], 64, alpha)
    got = hypotheses(res.tokens, res.lengths)
    for r, src in enumerate(TOY_SRCS):
        ref = ranked([a, b], src, alpha)
        assert len(ref) == 40 and got[r][:40] == [seq for _, _, seq in ref]
        np.testing.assert_allclose(np.asarray(res.scores[r, :40]), [s for s, _, _ in ref], 1e-5)
        np.testing.assert_allclose(np.asarray(res.logprobs[r, :40]), [x for _, x, _ in ref], 1e-5)
        # the mixture is neither model: each ranks the hypotheses differently
        for single in (a, b):
            assert [seq for _, _, seq in ranked([single], src, alpha)] != got[r][:40]
    # and a small beam finds the mixture's best hypothesis (the model of a real decode)
    small = toy_beam([a, b], 3, alpha)
    for r, src in enumerate(TOY_SRCS):
        assert hypotheses(small.tokens, small.lengths)[r][0] == ranked([a, b], src, alpha)[0][2]


def test_prefix_beam_search_is_the_exhaustive_ranking_of_the_continuations():
    a, b, alpha = toy(1), toy(2), 1.0
    prefixes = [[4], [5, 1]]
    for members in ([a], [a, b]):
        res = toy_beam(members, 64, alpha, prefixes)
        got = hypotheses(res.tokens, res.lengths)
        for r, src in enumerate(TOY_SRCS):
            ref = ranked(members, src, alpha, prefixes[r])
            assert len(ref) == (13 if r == 0 else 4)
            assert got[r][: len(ref)] == [seq for _, _, seq in ref]
            np.testing.assert_allclose(
                np.asarray(res.scores[r, : len(ref)]), [s for s, _, _ in ref], 1e-5
            )  # the forced tokens count in the score
            assert np.all(np.asarray(res.lengths[r, len(ref) :]) == 0)  # nothing else
    # an empty prefix forces nothing; a prefix too long for a row's limit yields to EOS there
    free, empty = toy_beam([a], 64, alpha), toy_beam([a], 64, alpha, [[], []])
    assert hypotheses(free.tokens, free.lengths) == hypotheses(empty.tokens, empty.lengths)
    np.testing.assert_allclose(np.asarray(free.scores), np.asarray(empty.scores), 1e-6)
    short = toy_beam([a], 64, alpha, [[4, 5, 4], [4, 5, 4]], max_lengths=[2, 4])
    assert hypotheses(short.tokens, short.lengths)[0][0] == [4, EOS]
    assert hypotheses(short.tokens, short.lengths)[1][0] == [4, 5, 4, EOS]


def test_prefix_greedy_and_sampling_start_with_it_and_score_it():
    a, b = toy(1), toy(2)
    src, segs = pad_batch(TOY_SRCS)
    limits = jnp.full((2,), LENGTH, jnp.int32)
    prefixes = [[5], [4, 4]]
    model = Ensemble([a, b])
    tokens, logp = jax.jit(
        lambda s, g, m, p: greedy_search(model, s, g, m, max_len=LENGTH, prefix=p, **IDS)
    )(src, segs, limits, prefix_array(prefixes))
    for r, src_r in enumerate(TOY_SRCS):
        seq = list(np.asarray(tokens[r])[: list(np.asarray(tokens[r])).index(EOS) + 1])
        # greedy by hand: the prefix, then the most probable allowed token at each step
        ref = list(prefixes[r])
        while not ref or ref[-1] != EOS:
            allowed = [EOS] if len(ref) + 1 == LENGTH else BODY + [EOS]
            ref.append(max(allowed, key=lambda t: mixture_logprob([a, b], src_r, ref + [t])))
        assert seq == ref
        np.testing.assert_allclose(float(logp[r]), mixture_logprob([a, b], src_r, seq), 1e-5)
    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    res = jax.jit(
        lambda s, g, m, k, p: sample(
            model, s, g, m, k, num_samples=8, max_len=LENGTH, prefix=p, alpha=0.6, **IDS
        )
    )(src, segs, limits, keys, prefix_array(prefixes))
    for r, src_r in enumerate(TOY_SRCS):
        samples = hypotheses(res.tokens, res.lengths)[r]
        assert all(s[: len(prefixes[r])] == prefixes[r] for s in samples)
        assert len({tuple(s) for s in samples}) > 1  # still random after the prefix
        np.testing.assert_allclose(
            np.asarray(res.logprobs[r]), [mixture_logprob([a, b], src_r, s) for s in samples], 1e-5
        )


@pytest.mark.slow  # ~15 s of compiling; the translate command checks the same to print precision
def test_an_ensemble_of_a_model_with_itself_is_the_model():
    """Through the jitted searches on the tiny Transformer (an ``EnsembleDef`` of two)."""
    graphdef, params = tiny_model(seed=3, scale=2.0, eos_bias=2.0)
    src, segs = pad_batch(SRCS)
    limits = jnp.full((len(SRCS),), MAX_LEN, jnp.int32)
    options = dict(beam_size=3, max_len=MAX_LEN, alpha=0.6, **IDS)
    one = run_beam(graphdef, params, SRCS, beam=3, max_len=MAX_LEN, alpha=0.6)
    two = beam_search_jit(
        (params, params), src, segs, limits, graphdef=EnsembleDef((graphdef, graphdef)), **options
    )
    assert hypotheses(one.tokens, one.lengths) == hypotheses(two.tokens, two.lengths)
    np.testing.assert_allclose(np.asarray(one.scores), np.asarray(two.scores), atol=1e-5)
    np.testing.assert_allclose(np.asarray(one.logprobs), np.asarray(two.logprobs), atol=1e-5)


def test_an_ensemble_needs_a_model():
    with pytest.raises(ValueError, match="at least one model"):
        Ensemble([])
