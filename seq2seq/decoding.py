"""Beam search and greedy decoding with a KV cache, in one ``lax.while_loop``.

Beams are folded into the batch dimension (``[batch·beam, ...]``); the encoder runs once per
sentence and the cross-attention keys/values are computed once per sentence, not per beam.

Beam search rules (documented because toolkits differ here):

* Scores. A hypothesis Y (its tokens up to and including EOS, |Y| tokens) has
  ``logprob = Σ log p(y_t | y_<t, x)`` and ``score = logprob / lp(|Y|)`` where ``lp`` is the
  length penalty: ``gnmt`` ((5+|Y|)/6)^α (Wu et al. 2016, eq. 14), ``plain`` |Y|^α, or
  ``none`` (1).
* Each step takes the top 2·beam continuations of the live beams. A continuation ending in EOS
  becomes a finished hypothesis if it ranks among the top ``beam`` of those (as in fairseq), and
  the best ``beam`` finished hypotheses are kept. The top ``beam`` continuations not ending in
  EOS stay live. PAD and BOS are never generated.
* Length limits: ``max_lengths[b]`` (a·|x|+b, set by the caller) forces EOS at the last
  allowed position; ``min_length`` forbids EOS before it.
* Stopping: a sentence is done when no live beam can beat the worst kept finished hypothesis:
  a live beam's log-probability can only fall, and lp is largest at the maximum length, so
  ``live_logprob / lp(max_length)`` bounds any score it could still reach. Decoding stops when
  every sentence is done (or at the maximum length). With α = 0 and beam 1 this is exactly
  greedy search.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

NEG_INF = -1.0e9


class BeamResult(NamedTuple):
    """n-best output of ``beam_search``, best first.

    Attributes:
      tokens: int32 ``[batch, beam, max_len]``, each hypothesis ending in EOS then PAD.
      lengths: int32 ``[batch, beam]``, tokens including EOS.
      logprobs: float32 ``[batch, beam]``, total log-probability of each hypothesis.
      scores: float32 ``[batch, beam]``, ``logprobs / lp(lengths)``.
    """

    tokens: jax.Array
    lengths: jax.Array
    logprobs: jax.Array
    scores: jax.Array


def length_penalty(length: jax.Array, alpha: float, kind: str = "gnmt") -> jax.Array:
    """lp(|Y|): ``gnmt`` ((5+|Y|)/6)^α (Wu et al. 2016), ``plain`` |Y|^α, ``none`` 1.

    Raises:
      ValueError: unknown ``kind``.
    """
    length = jnp.asarray(length, jnp.float32)
    if kind == "gnmt":
        return ((5.0 + length) / 6.0) ** alpha
    if kind == "plain":
        return length ** alpha
    if kind == "none":
        return jnp.ones_like(length)
    raise ValueError(f"unknown length penalty {kind!r}; choose gnmt, plain or none")


def _positions(segments: jax.Array) -> jax.Array:
    return jnp.where(segments > 0, jnp.arange(segments.shape[1])[None, :], 0).astype(jnp.int32)


def _gather_beams(x: jax.Array, beam_index: jax.Array) -> jax.Array:
    """x ``[batch, beam, ...]`` gathered along the beam axis with int ``[batch, k]``."""
    idx = beam_index.reshape(beam_index.shape + (1,) * (x.ndim - 2))
    return jnp.take_along_axis(x, idx, axis=1)


def _gather_cache(cache: Any, beam_index: jax.Array, beam_size: int) -> Any:
    """Reorder the self-attention caches ``[batch·beam, ...]`` by source beam ``[batch, beam]``."""
    batch = beam_index.shape[0]

    def reorder(x):
        xb = x.reshape(batch, beam_size, *x.shape[1:])
        return _gather_beams(xb, beam_index).reshape(x.shape)

    return {**cache, "layers": jax.tree.map(reorder, cache["layers"])}


def beam_search(model: nnx.Module, src: jax.Array, src_segments: jax.Array, max_lengths: jax.Array,
                *, beam_size: int, max_len: int, alpha: float, bos_id: int, eos_id: int,
                pad_id: int, length_penalty_kind: str = "gnmt", min_length: int = 0) -> BeamResult:
    """Beam search (rules in the module docstring); call it inside ``jax.jit``.

    Args:
      model: a ``Transformer`` (``encode``, ``init_cache``, ``decode_step``).
      src: int32 ``[batch, src_len]`` source ids (ending in EOS, padded with PAD).
      src_segments: int32 ``[batch, src_len]``, 1 for real tokens, 0 for padding.
      max_lengths: int32 ``[batch]`` output length limit per sentence (≤ max_len).
      beam_size: beams per sentence.
      max_len: static number of decoding positions.
      alpha: length-penalty exponent.
      bos_id / eos_id / pad_id: special ids from the tokenizer.
      length_penalty_kind: ``gnmt``, ``plain`` or ``none``.
      min_length: EOS is forbidden before this many tokens.

    Returns:
      ``BeamResult`` with the ``beam_size`` best finished hypotheses per sentence.
    """
    batch, k = src.shape[0], beam_size
    encoded = model.encode(src, src_segments, _positions(src_segments))
    cache = model.init_cache(encoded, src_segments, k, max_len)
    max_lengths = jnp.minimum(max_lengths, max_len).astype(jnp.int32)
    lp_max = length_penalty(max_lengths, alpha, length_penalty_kind)

    init = dict(
        i=jnp.zeros((), jnp.int32),
        last=jnp.full((batch, k), bos_id, jnp.int32),
        alive_seq=jnp.zeros((batch, k, max_len), jnp.int32),
        alive_logp=jnp.tile(jnp.array([0.0] + [NEG_INF] * (k - 1), jnp.float32), (batch, 1)),
        fin_seq=jnp.zeros((batch, k, max_len), jnp.int32),
        fin_logp=jnp.full((batch, k), NEG_INF, jnp.float32),
        fin_score=jnp.full((batch, k), NEG_INF, jnp.float32),
        fin_len=jnp.zeros((batch, k), jnp.int32),
        cache=cache,
    )

    def done(s):
        bound = s["alive_logp"][:, 0] / lp_max
        no_alive = s["alive_logp"][:, 0] <= NEG_INF / 2
        return (s["fin_score"][:, -1] >= bound) | no_alive

    def cond(s):
        return (s["i"] < max_len) & ~jnp.all(done(s))

    def body(s):
        i = s["i"]
        logits, cache = model.decode_step(s["last"].reshape(-1), i, s["cache"], k)
        logp = jax.nn.log_softmax(logits.astype(jnp.float32)).reshape(batch, k, -1)
        vocab = logp.shape[-1]
        token = jnp.arange(vocab)
        is_eos = token == eos_id
        banned = (token == pad_id) | (token == bos_id)
        banned = banned | ((i + 1 >= max_lengths)[:, None, None] & ~is_eos)
        banned = banned | ((i + 1 < min_length) & is_eos)
        logp = jnp.where(banned, NEG_INF, logp)
        cand = (s["alive_logp"][:, :, None] + logp).reshape(batch, k * vocab)
        top_logp, top_idx = jax.lax.top_k(cand, 2 * k)
        src_beam, tok = top_idx // vocab, (top_idx % vocab).astype(jnp.int32)
        seqs = _gather_beams(s["alive_seq"], src_beam)
        seqs = jnp.where(jnp.arange(max_len) == i, tok[:, :, None], seqs)
        valid = top_logp > NEG_INF / 2
        ends = (tok == eos_id) & valid & (jnp.arange(2 * k) < k)

        # finished: merge the kept ones with the new EOS continuations, keep the best k
        length = (i + 1).astype(jnp.float32)
        new_score = jnp.where(ends, top_logp / length_penalty(length, alpha, length_penalty_kind),
                              NEG_INF)
        all_score = jnp.concatenate([s["fin_score"], new_score], axis=1)
        fin_score, pick = jax.lax.top_k(all_score, k)
        cat = lambda a, b: _gather_beams(jnp.concatenate([a, b], axis=1), pick)
        fin_seq = cat(s["fin_seq"], seqs)
        fin_logp = cat(s["fin_logp"], jnp.where(ends, top_logp, NEG_INF))
        fin_len = cat(s["fin_len"], jnp.full((batch, 2 * k), i + 1, jnp.int32))

        # live: the best k continuations that do not end in EOS
        alive_cand = jnp.where(tok == eos_id, NEG_INF, top_logp)
        alive_logp, keep = jax.lax.top_k(alive_cand, k)
        return dict(i=i + 1, last=_gather_beams(tok, keep), alive_seq=_gather_beams(seqs, keep),
                    alive_logp=alive_logp, fin_seq=fin_seq, fin_logp=fin_logp, fin_score=fin_score,
                    fin_len=fin_len, cache=_gather_cache(cache, _gather_beams(src_beam, keep), k))

    s = jax.lax.while_loop(cond, body, init)
    tokens = jnp.where(jnp.arange(max_len) < s["fin_len"][:, :, None], s["fin_seq"], pad_id)
    return BeamResult(tokens=tokens, lengths=s["fin_len"], logprobs=s["fin_logp"],
                      scores=s["fin_score"])


def greedy_search(model: nnx.Module, src: jax.Array, src_segments: jax.Array,
                  max_lengths: jax.Array, *, max_len: int, bos_id: int, eos_id: int,
                  pad_id: int) -> tuple[jax.Array, jax.Array]:
    """Greedy decoding: the most probable token at each step until EOS or the length limit.

    Args: as ``beam_search``.

    Returns:
      tokens int32 ``[batch, max_len]`` (ending in EOS, then PAD) and their total float32
      log-probabilities ``[batch]``.
    """
    batch = src.shape[0]
    encoded = model.encode(src, src_segments, _positions(src_segments))
    cache = model.init_cache(encoded, src_segments, 1, max_len)
    max_lengths = jnp.minimum(max_lengths, max_len).astype(jnp.int32)
    init = dict(i=jnp.zeros((), jnp.int32), last=jnp.full((batch,), bos_id, jnp.int32),
                seq=jnp.full((batch, max_len), pad_id, jnp.int32),
                logp=jnp.zeros((batch,), jnp.float32), finished=jnp.zeros((batch,), bool),
                cache=cache)

    def cond(s):
        return (s["i"] < max_len) & ~jnp.all(s["finished"])

    def body(s):
        i = s["i"]
        logits, cache = model.decode_step(s["last"], i, s["cache"], 1)
        logp = jax.nn.log_softmax(logits.astype(jnp.float32))
        token = jnp.arange(logp.shape[-1])
        banned = (token == pad_id) | (token == bos_id)
        banned = banned | ((i + 1 >= max_lengths)[:, None] & (token != eos_id))
        logp = jnp.where(banned, NEG_INF, logp)
        tok = jnp.argmax(logp, axis=-1).astype(jnp.int32)
        step_logp = jnp.take_along_axis(logp, tok[:, None], axis=-1)[:, 0]
        live = ~s["finished"]
        seq = jnp.where((jnp.arange(max_len) == i) & live[:, None], tok[:, None], s["seq"])
        return dict(i=i + 1, last=tok, seq=seq, logp=s["logp"] + jnp.where(live, step_logp, 0.0),
                    finished=s["finished"] | (tok == eos_id), cache=cache)

    s = jax.lax.while_loop(cond, body, init)
    return s["seq"], s["logp"]


@functools.partial(jax.jit, static_argnames=(
    "graphdef", "beam_size", "max_len", "alpha", "bos_id", "eos_id", "pad_id",
    "length_penalty_kind", "min_length"))
def beam_search_jit(params, src, src_segments, max_lengths, *, graphdef, **kwargs) -> BeamResult:
    """``beam_search`` on a model given as (graphdef, params), compiled once per shape."""
    return beam_search(nnx.merge(graphdef, params), src, src_segments, max_lengths, **kwargs)


@functools.partial(jax.jit, static_argnames=("graphdef", "max_len", "bos_id", "eos_id", "pad_id"))
def greedy_search_jit(params, src, src_segments, max_lengths, *, graphdef, **kwargs):
    """``greedy_search`` on a model given as (graphdef, params), compiled once per shape."""
    return greedy_search(nnx.merge(graphdef, params), src, src_segments, max_lengths, **kwargs)
