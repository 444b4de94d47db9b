"""Beam search, greedy search and sampling against brute force and teacher forcing."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from seq2seq.config import ModelConfig
from seq2seq.decoding import (
    NEG_INF,
    _top_continuations,
    beam_search_jit,
    filter_logits,
    greedy_search_jit,
    length_penalty,
    sample_jit,
    sentence_keys,
    top_k_by_chunks,
)
from seq2seq.model import build_model

PAD, UNK, BOS, EOS = 0, 1, 2, 3
IDS = dict(bos_id=BOS, eos_id=EOS, pad_id=PAD)
# most tests decode this batch with MAX_LEN positions, so the compiled searches are shared
SRCS = [[5, 6, 7, EOS], [8, 9, EOS], [10, 11, 4, 5, 6, EOS]]
MAX_LEN = 8
SAMPLING = dict(temperature=1.5, top_k=5, alpha=0.6)


def tiny_model(vocab=12, seed=0, eos_bias=0.0, scale=8.0, unk_bias=0.0):
    cfg = ModelConfig(
        vocab_size=vocab,
        d_model=16,
        num_heads=2,
        num_encoder_layers=1,
        num_decoder_layers=1,
        d_ff=32,
        dropout_rate=0.0,
    )
    model = build_model(cfg, seed=seed)
    # sharpen the output distribution (scale 8) so hypotheses differ clearly; sampling tests
    # use a flatter one (scale 2) so that samples differ
    model.embed.embedding[...] = model.embed.embedding[...] * scale
    if eos_bias or unk_bias:
        # logits = norm(x) · Eᵀ: a norm bias b with E b = c·onehot(EOS) (vocab < d_model, so it
        # exists) adds c to the EOS logit and nothing to the others, whatever the context
        shift = np.zeros(vocab)
        shift[EOS], shift[UNK] = eos_bias, unk_bias
        bias = np.linalg.pinv(np.asarray(model.embed.embedding[...])) @ shift
        model.decoder_norm.bias[...] = model.decoder_norm.bias[...] + jnp.asarray(bias)
    return nnx.split(model, nnx.Param)


@functools.partial(jax.jit, static_argnames="graphdef")
def _forward_logp(params, src, tgt, tgt_len, *, graphdef):
    """log p(· | y_<t, x) at every position t < tgt_len of each row: float32 [n, L, vocab]."""
    model = nnx.merge(graphdef, params)
    length = tgt.shape[1]
    segs = (jnp.arange(length)[None, :] < tgt_len[:, None]).astype(jnp.int32)
    batch = dict(
        src=src,
        src_segments=(src != PAD).astype(jnp.int32),
        src_positions=jnp.broadcast_to(jnp.arange(src.shape[1]), src.shape),
        tgt=tgt,
        tgt_segments=segs,
        tgt_positions=segs * jnp.arange(length)[None, :],
    )
    return jax.nn.log_softmax(model(batch, bos_id=BOS))


def forward_logp(graphdef, params, src, seqs, width):
    """Teacher-forced log-probabilities ``[len(seqs), width, vocab]`` for one source.

    Row t of sequence s is log p(· | s[:t], src); sequences are padded to ``width`` (a fixed
    shape, so the forward pass compiles once per width).
    """
    rows = max(4, 1 << (len(seqs) - 1).bit_length())  # few row counts, few compilations
    tgt = np.full((rows, width), 4, np.int32)
    lens = np.ones((rows,), np.int32)
    for r, s in enumerate(seqs):
        tgt[r, : len(s)] = s
        lens[r] = min(len(s) + 1, width)
    src = jnp.asarray(np.tile(np.asarray(src, np.int32), (rows, 1)))
    out = _forward_logp(params, src, jnp.asarray(tgt), jnp.asarray(lens), graphdef=graphdef)
    return np.asarray(out, np.float64)[: len(seqs)]


def teacher_forced_logprobs(graphdef, params, src, hyps, width):
    """Σ_t log p(y_t | y_<t, x) of each hypothesis (ending in EOS), by full forward passes."""
    logp = forward_logp(graphdef, params, src, hyps, width)
    return np.array([sum(logp[r, t, y] for t, y in enumerate(h)) for r, h in enumerate(hyps)])


def pad_batch(srcs):
    src = np.zeros((len(srcs), max(len(s) for s in srcs)), np.int32)
    for i, s in enumerate(srcs):
        src[i, : len(s)] = s
    return jnp.asarray(src), jnp.asarray((src != PAD).astype(np.int32))


def run_beam(
    graphdef, params, srcs, beam, max_len, alpha, kind="gnmt", max_lengths=None, min_length=0
):
    src, segs = pad_batch(srcs)
    limits = jnp.asarray(
        max_lengths if max_lengths is not None else [max_len] * len(srcs), jnp.int32
    )
    return beam_search_jit(
        params,
        src,
        segs,
        limits,
        graphdef=graphdef,
        beam_size=beam,
        max_len=max_len,
        alpha=alpha,
        length_penalty_kind=kind,
        min_length=min_length,
        **IDS,
    )


def run_greedy(graphdef, params, srcs, max_len, max_lengths=None, min_length=0):
    src, segs = pad_batch(srcs)
    limits = jnp.asarray(
        max_lengths if max_lengths is not None else [max_len] * len(srcs), jnp.int32
    )
    return greedy_search_jit(
        params, src, segs, limits, graphdef=graphdef, max_len=max_len, min_length=min_length, **IDS
    )


def run_sample(graphdef, params, srcs, n, max_len, keys, max_lengths=None, **options):
    src, segs = pad_batch(srcs)
    limits = jnp.asarray(
        max_lengths if max_lengths is not None else [max_len] * len(srcs), jnp.int32
    )
    return sample_jit(
        params,
        src,
        segs,
        limits,
        keys,
        graphdef=graphdef,
        num_samples=n,
        max_len=max_len,
        **IDS,
        **options,
    )


def hypotheses(tokens, lengths):
    """[batch, n, L] tokens and [batch, n] lengths → nested lists of token lists (with EOS)."""
    tokens, lengths = np.asarray(tokens), np.asarray(lengths)
    return [
        [list(tokens[b, j, : lengths[b, j]]) for j in range(tokens.shape[1])]
        for b in range(tokens.shape[0])
    ]


def allowed_tokens(vocab, position, max_length, min_length):
    """Tokens the length rules allow at 0-based ``position`` (module docstring of decoding.py)."""
    if position + 1 >= max_length:
        return [EOS]
    return [t for t in range(vocab) if t not in (PAD, BOS) and (t != EOS or position >= min_length)]


def nucleus_set(logits, allowed, temperature, top_k, top_p):
    """Brute force: the tokens temperature + top-k + top-p sampling may emit (float64)."""
    x = {t: float(logits[t]) / temperature for t in allowed}
    order = sorted(x, key=lambda t: -x[t])
    if top_k:
        order = order[:top_k]
    z = np.exp([x[t] - x[order[0]] for t in order])
    probs = z / z.sum()
    kept, mass = [], 0.0
    for t, p in zip(order, probs):
        if mass >= top_p:
            break
        kept.append(t)
        mass += p
    return set(kept)


# -- length penalty ------------------------------------------------------------------------------


def test_length_penalty_formulas():
    np.testing.assert_allclose(length_penalty(7, 0.6, "gnmt"), (12 / 6) ** 0.6, rtol=1e-6)
    np.testing.assert_allclose(length_penalty(7, 0.6, "plain"), 7**0.6, rtol=1e-6)
    np.testing.assert_allclose(length_penalty(7, 0.6, "none"), 1.0)
    np.testing.assert_allclose(length_penalty(1, 0.6, "gnmt"), 1.0, rtol=1e-6)
    with pytest.raises(ValueError, match="unknown length penalty"):
        length_penalty(3, 0.6, "fairseq")


# -- beam search ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def enumerated():
    """Every hypothesis of a vocab-6 model up to 4 tokens, with its teacher-forced logprob."""
    vocab, max_len = 6, 4
    graphdef, params = tiny_model(vocab)
    src = [4, 5, 4, EOS]  # 40 hypotheses: 1 + 3 + 9 + 27 (tokens 1, 4, 5 then EOS)
    body_tokens = [t for t in range(vocab) if t not in (PAD, BOS, EOS)]
    hyps = [
        list(body) + [EOS]
        for n in range(max_len)
        for body in itertools.product(body_tokens, repeat=n)
    ]
    logprobs = teacher_forced_logprobs(graphdef, params, src, hyps, max_len)
    return graphdef, params, src, vocab, max_len, hyps, logprobs


@pytest.mark.parametrize("alpha,kind", [(0.0, "none"), (0.6, "gnmt"), (1.0, "plain")])
def test_beam_search_nbest_is_exhaustive_ranking(enumerated, alpha, kind):
    """With beam = vocab^max_len, the n-best list is every hypothesis ranked by exact score."""
    graphdef, params, src, vocab, max_len, hyps, logprobs = enumerated
    beam = vocab**max_len
    res = run_beam(graphdef, params, [src], beam=beam, max_len=max_len, alpha=alpha, kind=kind)
    scores = [lp / float(length_penalty(len(h), alpha, kind)) for h, lp in zip(hyps, logprobs)]
    order = np.argsort(scores)[::-1]
    n = len(hyps)  # 40 ≤ beam, so every hypothesis is finished and kept
    got = hypotheses(res.tokens, res.lengths)[0]
    assert got[:n] == [hyps[i] for i in order]
    np.testing.assert_allclose(
        np.asarray(res.scores[0, :n]), np.asarray(scores)[order], rtol=1e-4, atol=1e-5
    )
    np.testing.assert_allclose(
        np.asarray(res.logprobs[0, :n]), logprobs[order], rtol=1e-4, atol=1e-5
    )
    assert np.all(np.asarray(res.scores[0, n:]) <= NEG_INF / 2)  # empty slots stay empty
    assert np.all(np.asarray(res.lengths[0, n:]) == 0)


def reference_beam_search(graphdef, params, src, beam, max_length, alpha, kind, min_length, vocab):
    """The documented beam rules in plain Python, scored by teacher forcing, never stopping
    early."""
    alive, finished = [((), 0.0)], []
    for i in range(max_length):
        logp = forward_logp(graphdef, params, src, [seq for seq, _ in alive], MAX_LEN)
        cands = [
            (lp + logp[r, i, t], seq + (t,))
            for r, (seq, lp) in enumerate(alive)
            for t in allowed_tokens(vocab, i, max_length, min_length)
        ]
        top = sorted(cands, key=lambda c: -c[0])[: 2 * beam]
        for rank, (lp, seq) in enumerate(top):
            if seq[-1] == EOS and rank < beam:
                finished.append((lp / float(length_penalty(len(seq), alpha, kind)), lp, seq))
        finished = sorted(finished, key=lambda f: -f[0])[:beam]
        alive = [(seq, lp) for lp, seq in top if seq[-1] != EOS][:beam]
        if not alive:
            break
    return finished


@pytest.mark.parametrize("beam,alpha,kind,min_length", [(2, 0.6, "gnmt", 0), (3, 1.0, "plain", 2)])
def test_beam_search_matches_reference_without_early_stopping(beam, alpha, kind, min_length):
    """KV cache, beam reordering and the early stop agree with a plain re-implementation."""
    vocab = 12
    # a flatter model whose EOS is likely enough that hypotheses end at many lengths: the early
    # stop then triggers, and the decoder's history (the reordered KV cache) matters
    graphdef, params = tiny_model(vocab, seed=4, scale=2.0, eos_bias=4.0)
    max_lengths = [8, 4, 6]
    res = run_beam(
        graphdef,
        params,
        SRCS,
        beam=beam,
        max_len=MAX_LEN,
        alpha=alpha,
        kind=kind,
        max_lengths=max_lengths,
        min_length=min_length,
    )
    got = hypotheses(res.tokens, res.lengths)
    for b, src in enumerate(SRCS):
        ref = reference_beam_search(
            graphdef, params, src, beam, max_lengths[b], alpha, kind, min_length, vocab
        )
        assert len(ref) == beam
        assert [list(seq) for _, _, seq in ref] == got[b]
        np.testing.assert_allclose(
            np.asarray(res.scores[b]), [s for s, _, _ in ref], rtol=1e-4, atol=1e-5
        )
        np.testing.assert_allclose(
            np.asarray(res.logprobs[b]), [lp for _, lp, _ in ref], rtol=1e-4, atol=1e-5
        )


def test_reported_scores_equal_teacher_forced_logprob():
    graphdef, params = tiny_model(seed=1)
    res = run_beam(graphdef, params, SRCS, beam=3, max_len=MAX_LEN, alpha=0.6)
    graphdef, flat = tiny_model(seed=1, scale=2.0)
    out = run_sample(graphdef, flat, SRCS, 4, MAX_LEN, sentence_keys(0, [0, 1, 2]), **SAMPLING)
    # beam hypotheses, then samples (whose logprobs are under the unfiltered model too)
    for result, weights in ((res, params), (out, flat)):
        for b, src in enumerate(SRCS):
            hyps = hypotheses(result.tokens, result.lengths)[b]
            lp = teacher_forced_logprobs(graphdef, weights, src, hyps, MAX_LEN)
            np.testing.assert_allclose(np.asarray(result.logprobs[b]), lp, rtol=1e-4, atol=1e-4)
            lp_len = np.asarray(length_penalty(np.asarray(result.lengths[b]), 0.6))
            np.testing.assert_allclose(
                np.asarray(result.scores[b]), lp / lp_len, rtol=1e-4, atol=1e-4
            )
            assert np.all(np.diff(np.asarray(result.scores[b])) <= 1e-6)  # best first


def test_beam_one_equals_greedy():
    graphdef, params = tiny_model(seed=2)
    res = run_beam(graphdef, params, SRCS, beam=1, max_len=MAX_LEN, alpha=0.0)
    tokens, logp = run_greedy(graphdef, params, SRCS, max_len=MAX_LEN)
    np.testing.assert_array_equal(np.asarray(res.tokens[:, 0]), np.asarray(tokens))
    np.testing.assert_allclose(np.asarray(res.logprobs[:, 0]), np.asarray(logp), rtol=1e-5)


def test_translation_does_not_depend_on_batch_neighbours():
    graphdef, params = tiny_model(seed=3)
    target = [5, 6, 7, EOS]
    batch = [[8, EOS], target, [4, 5, 6, 7, 8, EOS]]
    alone = run_beam(graphdef, params, [target], beam=3, max_len=MAX_LEN, alpha=0.6)
    mixed = run_beam(graphdef, params, batch, beam=3, max_len=MAX_LEN, alpha=0.6)
    np.testing.assert_array_equal(np.asarray(alone.tokens[0]), np.asarray(mixed.tokens[1]))
    np.testing.assert_allclose(np.asarray(alone.scores[0]), np.asarray(mixed.scores[1]), rtol=1e-5)
    # sampling: a sentence's samples depend on its key, not on its neighbours or its row
    graphdef, params = tiny_model(seed=3, scale=2.0)
    first = run_sample(
        graphdef,
        params,
        [target, [9, EOS], [7, 7, 7, 7, 7, EOS]],
        4,
        MAX_LEN,
        sentence_keys(7, [5, 1, 2]),
        **SAMPLING,
    )
    second = run_sample(
        graphdef, params, batch, 4, MAX_LEN, sentence_keys(7, [9, 5, 1]), **SAMPLING
    )
    np.testing.assert_array_equal(np.asarray(first.tokens[0]), np.asarray(second.tokens[1]))
    np.testing.assert_allclose(
        np.asarray(first.logprobs[0]), np.asarray(second.logprobs[1]), rtol=1e-5
    )
    assert len({tuple(h) for h in hypotheses(first.tokens, first.lengths)[0]}) > 1


# -- length rules: EOS only at the end, min_length, max length ------------------------------------


def check_well_formed(tokens, lengths, max_lengths, min_length):
    tokens, lengths = np.asarray(tokens), np.asarray(lengths)
    for b in range(tokens.shape[0]):
        for j in range(tokens.shape[1]):
            n, row = int(lengths[b, j]), tokens[b, j]
            assert 1 <= n <= max_lengths[b]
            assert row[n - 1] == EOS  # EOS exactly once, at the end, then only PAD
            assert not np.isin(row[: n - 1], [EOS, PAD, BOS]).any()
            assert np.all(row[n:] == PAD)
            assert n - 1 >= min(min_length, max_lengths[b] - 1)  # the maximum wins


def test_min_length_and_eos_only_at_the_end():
    # EOS made very likely, so without min_length every hypothesis would be (nearly) empty
    graphdef, params = tiny_model(seed=5, eos_bias=60.0)
    max_lengths = [8, 8, 3]
    keys = sentence_keys(0, [0, 1, 2])
    free = run_beam(graphdef, params, SRCS, 3, MAX_LEN, 0.6, max_lengths=max_lengths)
    assert np.asarray(free.lengths[:, 0]).max() <= 2  # min_length below has something to do
    for m in (0, 4):
        res = run_beam(
            graphdef, params, SRCS, 3, MAX_LEN, 0.6, max_lengths=max_lengths, min_length=m
        )
        check_well_formed(res.tokens, res.lengths, max_lengths, m)
        tokens, _ = run_greedy(
            graphdef, params, SRCS, MAX_LEN, max_lengths=max_lengths, min_length=m
        )
        lengths = (np.asarray(tokens) != PAD).sum(1)
        check_well_formed(np.asarray(tokens)[:, None], lengths[:, None], max_lengths, m)
        out = run_sample(
            graphdef,
            params,
            SRCS,
            4,
            MAX_LEN,
            keys,
            max_lengths=max_lengths,
            min_length=m,
            **SAMPLING,
        )
        check_well_formed(out.tokens, out.lengths, max_lengths, m)
    # min_length 4: four tokens, then the (very likely) EOS; the third row's maximum (3) wins
    assert list(lengths) == [5, 5, 3]
    np.testing.assert_array_equal(np.asarray(res.lengths[:, 0]), [5, 5, 3])


def test_the_unknown_piece_is_generated_only_when_not_banned():
    # UNK made very likely: every search emits it unless its id is banned (the translator's
    # default, decode.allow_unk=false)
    graphdef, params = tiny_model(seed=7, unk_bias=60.0)
    keys = sentence_keys(0, [0, 1, 2])
    src, segs = pad_batch(SRCS)
    limits = jnp.full((len(SRCS),), MAX_LEN, jnp.int32)
    for unk_id, emitted in ((-1, True), (UNK, False)):
        beam = beam_search_jit(
            params,
            src,
            segs,
            limits,
            graphdef=graphdef,
            beam_size=3,
            max_len=MAX_LEN,
            alpha=0.6,
            unk_id=unk_id,
            **IDS,
        )
        greedy, _ = greedy_search_jit(
            params, src, segs, limits, graphdef=graphdef, max_len=MAX_LEN, unk_id=unk_id, **IDS
        )
        sampled = sample_jit(
            params,
            src,
            segs,
            limits,
            keys,
            graphdef=graphdef,
            num_samples=4,
            max_len=MAX_LEN,
            unk_id=unk_id,
            **IDS,
            **SAMPLING,
        )
        for tokens in (beam.tokens, np.asarray(greedy)[:, None], sampled.tokens):
            assert (UNK in np.asarray(tokens)) == emitted
        check_well_formed(beam.tokens, beam.lengths, [MAX_LEN] * 3, 0)


def test_max_length_forces_eos():
    # EOS made very unlikely: every hypothesis runs to its own maximum length
    graphdef, params = tiny_model(seed=6, eos_bias=-60.0)
    max_lengths = [8, 3, 5]
    res = run_beam(graphdef, params, SRCS, 3, MAX_LEN, 0.6, max_lengths=max_lengths)
    np.testing.assert_array_equal(np.asarray(res.lengths), np.repeat([[8], [3], [5]], 3, axis=1))
    check_well_formed(res.tokens, res.lengths, max_lengths, 0)
    tokens, _ = run_greedy(graphdef, params, SRCS, MAX_LEN, max_lengths=max_lengths)
    np.testing.assert_array_equal((np.asarray(tokens) != PAD).sum(1), max_lengths)


# -- sampling ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "temperature,top_k,top_p",
    [(1.0, 3, 1.0), (0.7, 0, 0.6), (1.5, 4, 0.8), (2.0, 0, 0.95), (1.0, 12, 1.0)],
)
def test_filter_logits_matches_brute_force(temperature, top_k, top_p):
    rng = np.random.default_rng(0)
    vocab = 12
    logits = rng.normal(0.0, 2.0, (300, vocab)).astype(np.float32)
    banned = rng.random((300, vocab)) < 0.2
    banned[:, 0] = False  # at least one token allowed per row
    logits[banned] = NEG_INF
    out = np.asarray(
        filter_logits(jnp.asarray(logits), temperature=temperature, top_k=top_k, top_p=top_p)
    )
    checked = 0
    for row, ban, got in zip(logits, banned, out):
        allowed = [t for t in range(vocab) if not ban[t]]
        want = nucleus_set(row, allowed, temperature, top_k, top_p)
        # a row whose cumulative mass lands within float32 noise of top_p is ambiguous: skip it
        if want != nucleus_set(row, allowed, temperature, top_k, top_p + 1e-5):
            continue
        checked += 1
        assert set(np.flatnonzero(got > NEG_INF / 2)) == want
        np.testing.assert_allclose(got[sorted(want)], row[sorted(want)] / temperature, rtol=1e-6)
    assert checked >= 290


def test_filter_logits_rejects_bad_options():
    x = jnp.zeros((2, 5))
    for bad in (dict(temperature=0.0), dict(top_k=-1), dict(top_p=0.0), dict(top_p=1.5)):
        with pytest.raises(ValueError):
            filter_logits(x, **bad)


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.5, 3, 1.0), (1.0, 0, 0.9), (2.0, 5, 0.8)])
def test_sampled_tokens_stay_in_the_allowed_set(temperature, top_k, top_p):
    """Every sampled token lies in the brute-force top-k/top-p set of its own prefix."""
    vocab, n = 12, 8
    graphdef, params = tiny_model(vocab, seed=7, scale=2.0)
    max_lengths, min_length = [8, 4, 6], 1
    out = run_sample(
        graphdef,
        params,
        SRCS,
        n,
        MAX_LEN,
        sentence_keys(3, [0, 1, 2]),
        max_lengths=max_lengths,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_length=min_length,
    )
    samples = hypotheses(out.tokens, out.lengths)
    check_well_formed(out.tokens, out.lengths, max_lengths, min_length)
    distinct = 0
    for b, src in enumerate(SRCS):
        distinct += len({tuple(s) for s in samples[b]})
        # log p differs from the logits by a per-row constant: the same filtered distribution
        logp = forward_logp(graphdef, params, src, samples[b], MAX_LEN)
        for r, hyp in enumerate(samples[b]):
            for t, y in enumerate(hyp):
                allowed = allowed_tokens(vocab, t, max_lengths[b], min_length)
                assert y in nucleus_set(logp[r, t], allowed, temperature, top_k, top_p + 1e-4)
    assert distinct >= 2 * len(SRCS)  # the samples differ, so the check is not vacuous


def test_sampling_frequencies_match_the_filtered_distribution():
    """First-token frequencies over 4000 samples match softmax(filter_logits(logits / T))."""
    vocab, n = 12, 4000
    graphdef, params = tiny_model(vocab, seed=8, scale=2.0)
    src = [5, 6, 7, EOS]
    temperature, top_k = 2.0, 5
    out = run_sample(
        graphdef, params, [src], n, 2, sentence_keys(11, [0]), temperature=temperature, top_k=top_k
    )
    first = np.asarray(out.tokens[0, :, 0])
    logits = forward_logp(graphdef, params, src, [[]], 2)[0, 0]
    logits[[PAD, BOS]] = NEG_INF
    expected = np.asarray(
        jax.nn.softmax(
            filter_logits(jnp.asarray(logits, jnp.float32), temperature=temperature, top_k=top_k)
        )
    )
    assert np.count_nonzero(expected > 1e-9) == top_k
    freq = np.bincount(first, minlength=vocab) / n
    assert np.all(freq[expected == 0] == 0)
    np.testing.assert_array_less(
        np.abs(freq - expected), 5 * np.sqrt(expected * (1 - expected) / n) + 1e-3
    )


def test_sampling_with_top_k_1_or_tiny_top_p_is_greedy():
    graphdef, params = tiny_model(seed=2, scale=2.0)
    tokens, logp = run_greedy(graphdef, params, SRCS, max_len=MAX_LEN)
    keys = sentence_keys(1, [0, 1, 2])
    for opts in (dict(top_k=1, temperature=3.0), dict(top_p=1e-6, temperature=0.5)):
        out = run_sample(graphdef, params, SRCS, 2, MAX_LEN, keys, **opts)
        for j in range(2):
            np.testing.assert_array_equal(np.asarray(out.tokens[:, j]), np.asarray(tokens))
            np.testing.assert_allclose(np.asarray(out.logprobs[:, j]), np.asarray(logp), rtol=1e-5)


def test_sampling_is_seeded():
    graphdef, params = tiny_model(seed=9, scale=2.0)
    a = run_sample(graphdef, params, SRCS, 4, MAX_LEN, sentence_keys(0, [0, 1, 2]), **SAMPLING)
    b = run_sample(graphdef, params, SRCS, 4, MAX_LEN, sentence_keys(0, [0, 1, 2]), **SAMPLING)
    c = run_sample(graphdef, params, SRCS, 4, MAX_LEN, sentence_keys(1, [0, 1, 2]), **SAMPLING)
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    assert not np.array_equal(np.asarray(a.tokens), np.asarray(c.tokens))


def test_search_options_are_validated():
    graphdef, params = tiny_model(6)
    with pytest.raises(ValueError, match="alpha"):
        run_beam(graphdef, params, [[4, EOS]], beam=2, max_len=3, alpha=-0.5)
    with pytest.raises(ValueError, match="beam_size"):
        run_beam(graphdef, params, [[4, EOS]], beam=0, max_len=3, alpha=0.6)
    with pytest.raises(ValueError, match="min_length"):
        run_greedy(graphdef, params, [[4, EOS]], max_len=3, min_length=-1)
    with pytest.raises(ValueError, match="num_samples"):
        run_sample(graphdef, params, [[4, EOS]], 0, 3, sentence_keys(0, [0]))
    with pytest.raises(ValueError, match="top_p"):
        run_sample(graphdef, params, [[4, EOS]], 1, 3, sentence_keys(0, [0]), top_p=2.0)


def test_two_stage_top_k_equals_top_k_over_all_candidates():
    rng = np.random.default_rng(7)
    batch, beam, vocab, n = 3, 4, 50, 8
    logits = jnp.asarray(rng.normal(size=(batch, beam, vocab)), jnp.float32)
    banned = jnp.asarray(rng.random((batch, vocab)) < 0.2)
    alive = jnp.asarray([[0.0, -1.5, -2.0, NEG_INF]] * batch, jnp.float32)
    logp = jnp.where(banned[:, None, :], NEG_INF, jax.nn.log_softmax(logits))
    want_logp, idx = jax.lax.top_k((alive[:, :, None] + logp).reshape(batch, -1), n)
    got_logp, src_beam, tok = _top_continuations(logits, banned, alive, n)
    np.testing.assert_array_equal(src_beam, idx // vocab)
    np.testing.assert_array_equal(tok, idx % vocab)
    np.testing.assert_allclose(got_logp, want_logp, rtol=1e-6)


@pytest.mark.parametrize("n,k", [(50, 8), (8000, 8), (1000, 3), (37, 1), (9, 9)])
def test_top_k_by_chunks_equals_top_k_with_ties(n, k):
    rng = np.random.default_rng(n + k)
    x = rng.normal(size=(6, n)).astype(np.float32)
    x[1] = np.round(x[1])  # many ties, across chunks
    x[2] = 0.0  # all equal: the lowest indices win
    x[3, :-3] = NEG_INF  # the best entries at the end (a padded last chunk)
    x[4, ::7] = 5.0  # ties at the top in many chunks
    want_v, want_i = jax.lax.top_k(jnp.asarray(x), k)
    got_v, got_i = top_k_by_chunks(jnp.asarray(x), k)
    np.testing.assert_array_equal(got_v, want_v)
    np.testing.assert_array_equal(got_i, want_i)
