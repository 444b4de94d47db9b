"""Beam search, greedy search and sampling with a KV cache, each in one ``lax.while_loop``.

The search owns its hypotheses. The model (``SearchModel``: ``encode``, ``init_cache``,
``decode_step``) only keeps a typed KV cache of slots per row and attends where it is told; how
the hypotheses of a sentence share that cache is decided here (``BeamCache``): the ``k``
hypotheses of a sentence are the ``k`` queries of one cache row of ``max_len·k`` slots, and
reordering them gathers a small ancestry table, never the keys and values. The encoder runs
once per sentence and the cross-attention keys/values are computed once per sentence, not per
hypothesis, and so is beam search's first step (every beam starts from BOS).

Rules shared by every search (documented because toolkits differ here):

* Hypotheses. A hypothesis Y is its tokens up to and including EOS (|Y| counts the EOS), then
  PAD. EOS appears exactly once, at the end; PAD and BOS are never generated, nor the unknown
  piece when the caller passes its ``unk_id`` (the translator does unless ``decode.allow_unk``).
* Scores. ``logprob = Σ_t log p(y_t | y_<t, x)`` under the model's own distribution (before
  any temperature or top-k/top-p filtering), and ``score = logprob / lp(|Y|)`` where ``lp`` is
  the length penalty: ``gnmt`` ((5+|Y|)/6)^α (Wu et al. 2016, eq. 14), ``plain`` |Y|^α, or
  ``none`` (1).
* Length limits. ``max_lengths[b]`` (a·|x|+b, set by the caller) bounds |Y|: at position
  ``max_lengths[b] - 1`` only EOS is allowed, so every hypothesis ends by then. ``min_length``
  forbids EOS while fewer than ``min_length`` tokens precede it (|Y| ≥ min_length + 1);
  where the two collide the maximum wins.
* Target prefix. A search given ``prefix`` forces row b's first tokens to ``prefix[b]`` (up
  to its first PAD): at those positions only the forced token is allowed, except at a row's
  last position, where EOS still wins (the caller keeps prefixes shorter than the limit).
  The forced tokens are part of the hypothesis and of its ``logprob`` and score, which are
  therefore those of the whole output under the model (as fairseq's ``prefix_tokens``), the
  same numbers ``target_logprobs`` gives for that output. An empty prefix forces nothing.
* Ensembles. ``Ensemble`` makes several models one ``SearchModel`` whose next-token
  distribution is the mean of theirs (log-mean-exp of their log-probabilities); every search
  runs on it unchanged.

Beam search:

* Each step takes the top 2·beam continuations of the live beams. A continuation ending in EOS
  becomes a finished hypothesis if it ranks among the top ``beam`` of those (as in fairseq), and
  the best ``beam`` finished hypotheses are kept. The top ``beam`` continuations not ending in
  EOS stay live.
* Stopping: a sentence is done when no live beam can beat the worst kept finished hypothesis:
  a live beam's log-probability can only fall, and lp (α ≥ 0) is largest at the maximum length,
  so ``live_logprob / lp(max_length)`` bounds any score it could still reach. Decoding stops
  when every sentence is done (or at the maximum length). This rule never changes the result,
  it only saves steps. With α = 0 and beam 1 this is exactly greedy search.

Greedy search takes the most probable allowed token at each step; ancestral sampling draws it
from the model's distribution after temperature, top-k (Fan et al. 2018) and nucleus/top-p
(Holtzman et al. 2020) filtering (``filter_logits``). A sentence stops at its first EOS.
Sampling randomness comes from one key per sentence (``sentence_keys``), so a sentence's samples
do not depend on its batch neighbours, its position in the batch or the device layout.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from seq2seq import kernels

NEG_INF = -1.0e9
LENGTH_PENALTIES = ("gnmt", "plain", "none")


class BeamResult(NamedTuple):
    """n-best output of ``beam_search`` (and of ``sample``), best score first.

    Attributes:
      tokens: int32 ``[batch, n, max_len]``, each hypothesis ending in EOS then PAD.
      lengths: int32 ``[batch, n]``, tokens including EOS (|Y|).
      logprobs: float32 ``[batch, n]``, total log-probability of each hypothesis.
      scores: float32 ``[batch, n]``, ``logprobs / lp(lengths)``.

    A slot that holds no hypothesis (possible only when fewer than ``n`` exist, e.g. with a tiny
    vocabulary or a maximum length of 1) has length 0 and score ≤ ``NEG_INF / 2``.
    """

    tokens: jax.Array
    lengths: jax.Array
    logprobs: jax.Array
    scores: jax.Array


class SearchModel(Protocol):
    """What the searches need of a model (``seq2seq.model.Transformer`` is one).

    ``init_cache`` returns a pytree (``DecoderCache``) holding ``slots`` self-attention
    key/value slots per row; ``decode_step`` runs ``q`` queries per row at one decoder
    position, writes their keys/values into slots ``write .. write+q-1`` and lets each query
    attend to the slots ``mask`` (bool ``[rows, q, slots]``) allows.
    """

    def encode(
        self, src: jax.Array, src_segments: jax.Array, src_positions: jax.Array
    ) -> jax.Array: ...

    def init_cache(
        self, encoded: jax.Array, src_segments: jax.Array, *, max_len: int, slots: int
    ) -> Any: ...

    def decode_step(
        self,
        tokens: jax.Array,
        position: jax.Array,
        cache: Any,
        *,
        write: jax.Array,
        mask: jax.Array,
    ) -> tuple[jax.Array, Any]: ...


class Ensemble:
    """Several models as one ``SearchModel``: at every step the next-token distribution is the
    mean of the models' probabilities, returned as its log, ``log((1/n) Σ_m p_m(y | y_<t, x))``
    (log-mean-exp of the log-probabilities, as fairseq's ``EnsembleModel.forward_decoder``
    does), so the searches run unchanged and its scores are log-probabilities of that mixture.

    The models must share the target vocabulary and special ids (the caller checks: the
    translator compares the SentencePiece models); each keeps its own encoder output and
    cache, held here as tuples in the models' order. A one-model ensemble is that model.

    Args:
      models: the ``SearchModel`` s (e.g. ``seq2seq.model.Transformer``), at least one.

    Raises:
      ValueError: no model.
    """

    def __init__(self, models: Sequence[Any]):
        if not models:
            raise ValueError("an ensemble needs at least one model")
        self.models = tuple(models)

    def _mix(self, logits: Sequence[jax.Array]) -> jax.Array:
        logp = jnp.stack([jax.nn.log_softmax(x.astype(jnp.float32), axis=-1) for x in logits])
        return jax.nn.logsumexp(logp, axis=0) - np.log(len(logits)).astype(np.float32)

    def encode(
        self, src: jax.Array, src_segments: jax.Array, src_positions: jax.Array
    ) -> tuple[jax.Array, ...]:
        """One encoder output per model."""
        return tuple(m.encode(src, src_segments, src_positions) for m in self.models)

    def init_cache(
        self, encoded: tuple[jax.Array, ...], src_segments: jax.Array, *, max_len: int, slots: int
    ) -> tuple[Any, ...]:
        """One cache per model, each from its own encoder output."""
        return tuple(
            m.init_cache(e, src_segments, max_len=max_len, slots=slots)
            for m, e in zip(self.models, encoded)
        )

    def decode_step(
        self,
        tokens: jax.Array,
        position: jax.Array,
        cache: tuple[Any, ...],
        *,
        write: jax.Array,
        mask: jax.Array,
    ) -> tuple[jax.Array, tuple[Any, ...]]:
        """float32 ``[batch, q, vocab]`` log-probabilities of the mixture (normalised logits)
        and the models' updated caches."""
        steps = [
            m.decode_step(tokens, position, c, write=write, mask=mask)
            for m, c in zip(self.models, cache)
        ]
        return self._mix([x for x, _ in steps]), tuple(c for _, c in steps)

    def __call__(self, batch: dict[str, jax.Array], *, bos_id: int) -> jax.Array:
        """Teacher-forced log-probabilities of the mixture, float32 ``[batch, tgt_len, vocab]``
        (arguments as ``Transformer.__call__``)."""
        return self._mix([m(batch, bos_id=bos_id) for m in self.models])


@dataclasses.dataclass(frozen=True)
class EnsembleDef:
    """The static half of an ensemble, as ``nnx.split`` gives a model's ``graphdef``: one
    graphdef per member, in order; its parameters are the tuple of the members' parameters.
    Hashable, so it is a static argument of the compiled searches like a graphdef.

    Attributes:
      members: the members' graphdefs (at least one).
    """

    members: tuple[Any, ...]

    def __len__(self) -> int:
        return len(self.members)

    def merge(self, params: Sequence[Any]) -> Ensemble:
        """The ``Ensemble`` of the members with ``params`` (one entry per member)."""
        return Ensemble([nnx.merge(g, p) for g, p in zip(self.members, params, strict=True)])


def ensemble_size(graphdef: Any) -> int:
    """Models behind ``graphdef``: its members for an ``EnsembleDef``, else 1."""
    return len(graphdef) if isinstance(graphdef, EnsembleDef) else 1


def merge_models(graphdef: Any, params: Any) -> Any:
    """``nnx.merge`` of one model, or the ``Ensemble`` of an ``EnsembleDef``."""
    if isinstance(graphdef, EnsembleDef):
        return graphdef.merge(params)
    return nnx.merge(graphdef, params)


@struct.dataclass
class BeamCache:
    """The ``k`` hypotheses of every sentence sharing one model cache row of ``max_len·k`` slots.

    Slot ``t·k + j`` holds hypothesis j's key/value at position t: at each step hypothesis j
    writes its own slot and reads, at every earlier position t, the slot of the hypothesis it
    descends from, ``ancestors[b, j, t]``. Reordering hypotheses (``reorder_beams``) gathers
    only this table, never the keys and values of every layer (the copy beam search usually
    makes at every step).

    Attributes:
      model: the model's cache (``SearchModel.init_cache``), ``batch`` rows of ``max_len·k``
        slots.
      ancestors: int32 ``[batch, k, max_len]``; zeros at the start (every hypothesis starts
        from hypothesis 0's first position).
    """

    model: Any
    ancestors: jax.Array


def init_beams(
    model: SearchModel, encoded: jax.Array, src_segments: jax.Array, k: int, max_len: int
) -> BeamCache:
    """An empty ``BeamCache`` for ``k`` hypotheses of ``max_len`` positions per sentence.

    Args:
      encoded: ``[batch, src_len, d_model]`` encoder output; src_segments: int32
        ``[batch, src_len]``.

    Raises:
      ValueError: from the model (e.g. ``learned`` positions and max_len > ``model.max_len``).
    """
    cache = model.init_cache(encoded, src_segments, max_len=max_len, slots=max_len * k)
    batch = src_segments.shape[0]  # not ``encoded``'s: an ensemble encodes to a tuple
    return BeamCache(model=cache, ancestors=jnp.zeros((batch, k, max_len), jnp.int32))


def decode_beams(
    model: SearchModel, tokens: jax.Array, index: jax.Array, cache: BeamCache
) -> tuple[jax.Array, BeamCache]:
    """One decoding step of the first ``q ≤ k`` hypotheses of every sentence.

    Args:
      tokens: int32 ``[batch, q]``, the tokens at position ``index`` (BOS at 0); beam search
        runs step 0 with q = 1.
      index: int32 scalar position.
      cache: from ``init_beams`` or a previous step.

    Returns:
      float32 logits ``[batch, q, vocab]`` and the cache in which hypothesis j < q has written
      slot ``index·k + j``.
    """
    batch, q = tokens.shape
    _, k, max_len = cache.ancestors.shape
    hyp = jnp.arange(k, dtype=jnp.int32)
    positions = jnp.arange(max_len)
    own = (positions == index)[None, None, :] & (hyp < q)[None, :, None]
    ancestors = jnp.where(own, hyp[None, :, None], cache.ancestors)  # [batch, k, max_len]
    # query j reads slot t·k + ancestors[j, t] for t ≤ index
    mask = (ancestors[:, :q, :, None] == hyp) & (positions <= index)[:, None]  # [b, q, L, k]
    logits, model_cache = model.decode_step(
        tokens, index, cache.model, write=index * k, mask=mask.reshape(batch, q, max_len * k)
    )
    return logits, BeamCache(model=model_cache, ancestors=ancestors)


def reorder_beams(cache: BeamCache, parents: jax.Array) -> BeamCache:
    """The cache after hypothesis j of every sentence has become a copy of ``parents[:, j]``.

    Args:
      cache: from ``init_beams``/``decode_beams``.
      parents: int32 ``[batch, k]``, each in ``[0, k)``.

    Returns:
      the cache with ``ancestors[b, j] = old ancestors[b, parents[b, j]]`` (the model's keys
      and values are untouched).
    """
    return dataclasses.replace(cache, ancestors=_gather_beams(cache.ancestors, parents))


def length_penalty(length: jax.Array, alpha: float, kind: str = "gnmt") -> jax.Array:
    """lp(|Y|): ``gnmt`` ((5+|Y|)/6)^α (Wu et al. 2016, eq. 14), ``plain`` |Y|^α, ``none`` 1.

    Args:
      length: int or float, any shape: hypothesis lengths |Y| (EOS included).
      alpha: exponent α.
      kind: ``gnmt``, ``plain`` or ``none``.

    Returns:
      float32, the shape of ``length``.

    Raises:
      ValueError: unknown ``kind``.
    """
    length = jnp.asarray(length, jnp.float32)
    if kind == "gnmt":
        return ((5.0 + length) / 6.0) ** alpha
    if kind == "plain":
        return length**alpha
    if kind == "none":
        return jnp.ones_like(length)
    raise ValueError(f"unknown length penalty {kind!r}; choose gnmt, plain or none")


def check_sampling(temperature: float, top_k: int, top_p: float, epsilon: float = 0.0) -> None:
    """Validate sampling options.

    Raises:
      ValueError: ``temperature`` ≤ 0, ``top_k`` < 0, ``top_p`` outside (0, 1] or ``epsilon``
        outside [0, 1).
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if top_k < 0:
        raise ValueError(f"top_k must be ≥ 0 (0 = off), got {top_k}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1] (1 = off), got {top_p}")
    if not 0 <= epsilon < 1:
        raise ValueError(f"epsilon must be in [0, 1) (0 = off), got {epsilon}")


def _check_search(max_len: int, min_length: int, alpha: float, kind: str) -> None:
    if max_len < 1:
        raise ValueError(f"max_len must be ≥ 1, got {max_len}")
    if min_length < 0:
        raise ValueError(f"min_length must be ≥ 0, got {min_length}")
    if alpha < 0:
        # the stopping bound assumes lp grows with length
        raise ValueError(f"alpha must be ≥ 0, got {alpha}")
    if kind not in LENGTH_PENALTIES:
        raise ValueError(f"unknown length penalty {kind!r}; choose gnmt, plain or none")


def filter_logits(
    logits: jax.Array,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    epsilon: float = 0.0,
) -> jax.Array:
    """The sampling distribution: temperature, then epsilon, top-k and top-p filtering.

    Temperature divides the logits (Ackley et al. 1985). Epsilon sampling drops the tokens whose
    probability (after temperature) is below ``epsilon`` (Hewitt et al. 2022), never the most
    probable one; it gives MBR's candidates (Freitag et al. 2023, ε = 0.02). Top-k keeps the
    ``top_k`` most probable tokens (Fan et al. 2018). Top-p keeps the smallest set of most
    probable tokens whose probability, renormalised after top-k, sums to at least ``top_p``
    (Holtzman et al. 2020, eq. 2): a token is kept when the probability of the strictly more
    probable tokens is < ``top_p``, so the most probable token is always kept. Tokens tied with
    the last kept one are kept too.

    Args:
      logits: float ``[..., vocab]``; tokens already excluded carry a value ≤ ``NEG_INF / 2``
        (they stay excluded whatever the temperature).
      temperature: > 0; 1 leaves the distribution as it is.
      top_k: tokens kept, 0 = all (static).
      top_p: probability mass kept, in (0, 1]; 1 = all (static).
      epsilon: probability floor in [0, 1); 0 = off (static).

    Returns:
      float32 ``[..., vocab]``: ``logits / temperature`` on kept tokens, ``NEG_INF`` elsewhere;
      ``jax.random.categorical`` of it samples the filtered distribution.

    Raises:
      ValueError: an option is out of range (``check_sampling``).
    """
    check_sampling(temperature, top_k, top_p, epsilon)
    logits = jnp.asarray(logits, jnp.float32)
    x = jnp.where(logits <= NEG_INF / 2, NEG_INF, logits / temperature)
    if epsilon > 0:
        probs = jax.nn.softmax(x, axis=-1)
        top = jnp.max(probs, axis=-1, keepdims=True)
        x = jnp.where((probs >= epsilon) | (probs >= top), x, NEG_INF)
    if 0 < top_k < x.shape[-1]:
        kth = jax.lax.top_k(x, top_k)[0][..., -1:]
        x = jnp.where(x >= kth, x, NEG_INF)
    if top_p < 1.0:
        probs = jax.nn.softmax(x, axis=-1)
        desc = -jnp.sort(-probs, axis=-1)
        before = jnp.cumsum(desc, axis=-1) - desc  # mass of the strictly more probable tokens
        smallest_kept = jnp.min(jnp.where(before < top_p, desc, jnp.inf), axis=-1, keepdims=True)
        x = jnp.where(probs >= smallest_kept, x, NEG_INF)
    return x


def sentence_keys(seed: int, ids: Sequence[int] | np.ndarray) -> jax.Array:
    """One PRNG key per sentence: ``fold_in(PRNGKey(seed), id)``.

    Args:
      seed: the run's sampling seed.
      ids: int ``[batch]`` sentence identifiers (e.g. input line numbers).

    Returns:
      uint32 ``[batch, 2]`` raw keys for ``sample``.
    """
    base = jax.random.PRNGKey(seed)
    return jax.vmap(lambda i: jax.random.fold_in(base, i))(jnp.asarray(ids, jnp.uint32))


def _positions(segments: jax.Array) -> jax.Array:
    return jnp.where(segments > 0, jnp.arange(segments.shape[1])[None, :], 0).astype(jnp.int32)


def _banned(
    vocab: int,
    i: jax.Array,
    max_lengths: jax.Array,
    min_length: int,
    *,
    bos_id: int,
    eos_id: int,
    pad_id: int,
    unk_id: int = -1,
    prefix: jax.Array | None = None,
) -> jax.Array:
    """bool ``[batch, vocab]``: tokens not allowed at position ``i`` (0-based) of each row.

    Only EOS is allowed at the last position a row's ``max_lengths`` permits; EOS is forbidden
    while fewer than ``min_length`` tokens precede it (the maximum wins); PAD/BOS never, nor
    ``unk_id`` (-1: no unknown piece banned). Where ``prefix`` (int32 ``[batch, p]``, PAD after
    each row's forced tokens) holds a token at ``i`` and ``i`` is not the last position, only
    that token is allowed (whatever the other rules say).
    """
    token = jnp.arange(vocab)
    is_eos = token == eos_id
    last = (i + 1 >= max_lengths)[:, None]
    banned = (
        ((token == pad_id) | (token == bos_id) | (token == unk_id))[None, :]
        | (last & ~is_eos[None, :])
        | (~last & (i < min_length) & is_eos[None, :])
    )
    if prefix is None:
        return banned
    width = prefix.shape[1]
    forced = jnp.where(i < width, prefix[:, jnp.minimum(i, width - 1)], pad_id)  # [batch]
    forcing = ((forced != pad_id)[:, None]) & ~last  # [batch, 1]
    return jnp.where(forcing, token[None, :] != forced[:, None], banned)


def _gather_beams(x: jax.Array, beam_index: jax.Array) -> jax.Array:
    """x ``[batch, beam, ...]`` gathered along the beam axis with int ``[batch, k]``."""
    idx = beam_index.reshape(beam_index.shape + (1,) * (x.ndim - 2))
    return jnp.take_along_axis(x, idx, axis=1)


def top_k_by_chunks(x: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """``jax.lax.top_k`` over the last axis, exactly, found through chunk maxima.

    The last axis is cut into chunks of c ≈ √(n/k) entries; the k chunks with the largest
    maxima hold the k largest entries (each top entry lies in a chunk whose maximum is at least
    as large), so one top-k over the chunk maxima and one over those k chunks give the answer.
    Chunks are taken in index order and the chunk top-k prefers lower chunks, so ties resolve
    to the lower index, as in ``top_k``. It exists because XLA:CPU's ``top_k`` over a whole
    vocabulary is slow; ``seq2seq.kernels`` selects it (``cpu``) or ``top_k`` (``reference``).

    Args:
      x: float ``[rows, n]``; entries must not be NaN.
      k: 1 ≤ k ≤ n (static).

    Returns:
      values ``[rows, k]`` (descending, dtype of ``x``) and int32 indices ``[rows, k]``,
      equal to ``jax.lax.top_k(x, k)``.
    """
    rows, n = x.shape
    c = max(1, round((n / k) ** 0.5))
    chunks = -(-n // c)
    if chunks <= k:
        return jax.lax.top_k(x, k)
    padded = jnp.pad(x, ((0, 0), (0, chunks * c - n)), constant_values=-jnp.inf)
    blocks = padded.reshape(rows, chunks, c)
    _, best = jax.lax.top_k(blocks.max(axis=-1), k)
    best = jnp.sort(best, axis=-1)  # index order, so ties keep the lower index
    cand = jnp.take_along_axis(blocks, best[:, :, None], axis=1).reshape(rows, k * c)
    values, j = jax.lax.top_k(cand, k)
    index = jnp.take_along_axis(best, j // c, axis=1) * c + j % c
    return values, index.astype(jnp.int32)


def _top_continuations(
    logits: jax.Array, banned: jax.Array, alive_logp: jax.Array, n: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The ``n`` best continuations ``alive_logp + log p(token)`` of every sentence.

    Equal to ``top_k`` over all ``beam·vocab`` candidates, done in two stages: each beam's
    ``n`` best tokens by logit (``top_k_by_chunks`` or ``top_k``, as ``seq2seq.kernels``
    says; log-softmax is a per-row shift, so the order is the same), then the best ``n`` of
    those ``beam·n``. Equal scores keep
    ``top_k``'s order (lower beam, then lower token first); the one difference is two distinct
    logits that round to the same log-probability, which keep their logit order.
    Log-probabilities are computed only for the kept tokens.

    Args:
      logits: float32 ``[batch, beam, vocab]``.
      banned: bool ``[batch, vocab]``, tokens that may not be generated (score ``NEG_INF``).
      alive_logp: float32 ``[batch, beam]``.
      n: candidates kept per sentence, ≤ beam·vocab.

    Returns:
      float32 ``[batch, n]`` total log-probabilities (descending), int32 ``[batch, n]`` source
      beams and int32 ``[batch, n]`` tokens.
    """
    batch, beam, vocab = logits.shape
    m = jnp.max(logits, axis=-1, keepdims=True)
    log_z = jnp.log(jnp.sum(jnp.exp(logits - m), axis=-1, keepdims=True))
    per_beam = min(n, vocab)
    masked = jnp.where(banned[:, None, :], NEG_INF, logits).reshape(batch * beam, vocab)
    top_k = top_k_by_chunks if kernels.cpu() else jax.lax.top_k
    top_logit, tok = top_k(masked, per_beam)
    top_logit = top_logit.reshape(batch, beam, per_beam)
    tok = tok.reshape(batch, beam, per_beam)
    is_banned = jnp.take_along_axis(banned[:, None, :], tok, axis=-1)
    logp = jnp.where(is_banned, NEG_INF, (top_logit - m) - log_z)
    cand = (alive_logp[:, :, None] + logp).reshape(batch, beam * per_beam)
    top_logp, idx = jax.lax.top_k(cand, n)
    src_beam = (idx // per_beam).astype(jnp.int32)
    return top_logp, src_beam, jnp.take_along_axis(tok.reshape(batch, -1), idx, axis=1)


@struct.dataclass
class BeamState:
    """The loop state of ``beam_search`` (after the step at position ``i - 1``).

    Attributes:
      i: int32 scalar, the position decoded next.
      last: int32 ``[batch, k]``, each live hypothesis's token at position ``i - 1``.
      alive_seq: int32 ``[batch, k, max_len]``, the live hypotheses (tokens before ``i``).
      alive_logp: float32 ``[batch, k]``, their log-probabilities, descending (``NEG_INF``:
        no hypothesis).
      fin_seq: int32 ``[batch, k, max_len]``, the best finished hypotheses so far.
      fin_logp: float32 ``[batch, k]``, their log-probabilities.
      fin_score: float32 ``[batch, k]``, their scores, descending (``NEG_INF``: empty).
      fin_len: int32 ``[batch, k]``, their lengths |Y| (0: empty).
      cache: the ``BeamCache`` after position ``i - 1``, ordered like ``alive_*``.
    """

    i: jax.Array
    last: jax.Array
    alive_seq: jax.Array
    alive_logp: jax.Array
    fin_seq: jax.Array
    fin_logp: jax.Array
    fin_score: jax.Array
    fin_len: jax.Array
    cache: BeamCache


def beam_search(
    model: SearchModel,
    src: jax.Array,
    src_segments: jax.Array,
    max_lengths: jax.Array,
    *,
    beam_size: int,
    max_len: int,
    alpha: float,
    bos_id: int,
    eos_id: int,
    pad_id: int,
    length_penalty_kind: str = "gnmt",
    min_length: int = 0,
    unk_id: int = -1,
    prefix: jax.Array | None = None,
) -> BeamResult:
    """Beam search (rules in the module docstring); call it inside ``jax.jit``.

    Args:
      model: a ``SearchModel`` (``seq2seq.model.Transformer``).
      src: int32 ``[batch, src_len]`` source ids (ending in EOS, padded with PAD).
      src_segments: int32 ``[batch, src_len]``, 1 for real tokens, 0 for padding.
      max_lengths: int32 ``[batch]`` limit on |Y| (EOS included) per sentence; clipped to
        ``[1, max_len]``.
      beam_size: beams per sentence (static).
      max_len: static number of decoding positions.
      alpha: length-penalty exponent α ≥ 0.
      bos_id / eos_id / pad_id: special ids from the tokenizer.
      length_penalty_kind: ``gnmt``, ``plain`` or ``none``.
      min_length: EOS is forbidden while fewer than this many tokens precede it.
      unk_id: the unknown piece, never generated (-1: none banned).
      prefix: int32 ``[batch, p]`` target prefix per sentence, PAD after its tokens (None:
        none): hypotheses start with these tokens (module docstring, "Target prefix").

    Returns:
      ``BeamResult`` with the ``beam_size`` best finished hypotheses per sentence.

    Raises:
      ValueError: ``beam_size`` or ``max_len`` < 1, ``min_length`` or ``alpha`` < 0, unknown
        ``length_penalty_kind``.
    """
    if beam_size < 1:
        raise ValueError(f"beam_size must be ≥ 1, got {beam_size}")
    _check_search(max_len, min_length, alpha, length_penalty_kind)
    batch, k = src.shape[0], beam_size
    encoded = model.encode(src, src_segments, _positions(src_segments))
    max_lengths = jnp.clip(max_lengths, 1, max_len).astype(jnp.int32)  # [batch]
    lp_max = length_penalty(max_lengths, alpha, length_penalty_kind)  # [batch]

    # Step 0 runs once per sentence: every beam starts from the same BOS, so the decoder's
    # work is not repeated k times; the k beams then all read hypothesis 0's first slot.
    first_logits, cache = decode_beams(
        model,
        jnp.full((batch, 1), bos_id, jnp.int32),
        jnp.zeros((), jnp.int32),
        init_beams(model, encoded, src_segments, k, max_len),
    )
    init = BeamState(  # before the search at position 0; ``last`` is not read
        i=jnp.zeros((), jnp.int32),
        last=jnp.zeros((batch, k), jnp.int32),
        alive_seq=jnp.zeros((batch, k, max_len), jnp.int32),
        alive_logp=jnp.tile(jnp.array([0.0] + [NEG_INF] * (k - 1), jnp.float32), (batch, 1)),
        fin_seq=jnp.zeros((batch, k, max_len), jnp.int32),
        fin_logp=jnp.full((batch, k), NEG_INF, jnp.float32),
        fin_score=jnp.full((batch, k), NEG_INF, jnp.float32),
        fin_len=jnp.zeros((batch, k), jnp.int32),
        cache=cache,
    )

    def done(s: BeamState) -> jax.Array:  # bool [batch]
        bound = s.alive_logp[:, 0] / lp_max
        no_alive = s.alive_logp[:, 0] <= NEG_INF / 2
        return (s.fin_score[:, -1] >= bound) | no_alive

    def cond(s: BeamState) -> jax.Array:
        return (s.i < max_len) & ~jnp.all(done(s))

    def search(s: BeamState, logits: jax.Array) -> BeamState:
        """One step of the search given the logits ``[batch, k, vocab]`` at position ``i``."""
        i = s.i
        logits = logits.astype(jnp.float32)  # [batch, k, vocab]
        banned = _banned(
            logits.shape[-1],
            i,
            max_lengths,
            min_length,
            bos_id=bos_id,
            eos_id=eos_id,
            pad_id=pad_id,
            unk_id=unk_id,
            prefix=prefix,
        )  # [batch, vocab]
        # [batch, 2k] each: total log-probability, source beam and token of every candidate
        top_logp, src_beam, tok = _top_continuations(logits, banned, s.alive_logp, 2 * k)
        seqs = _gather_beams(s.alive_seq, src_beam)  # [batch, 2k, max_len]
        seqs = jnp.where(jnp.arange(max_len) == i, tok[:, :, None], seqs)
        valid = top_logp > NEG_INF / 2  # [batch, 2k]
        ends = (tok == eos_id) & valid & (jnp.arange(2 * k) < k)  # [batch, 2k]

        # finished: merge the kept ones with the new EOS continuations, keep the best k
        length = (i + 1).astype(jnp.float32)
        new_score = jnp.where(
            ends, top_logp / length_penalty(length, alpha, length_penalty_kind), NEG_INF
        )  # [batch, 2k]
        all_score = jnp.concatenate([s.fin_score, new_score], axis=1)  # [batch, 3k]
        fin_score, pick = jax.lax.top_k(all_score, k)  # [batch, k]
        cat = lambda a, b: _gather_beams(jnp.concatenate([a, b], axis=1), pick)
        fin_seq = cat(s.fin_seq, seqs)  # [batch, k, max_len]
        fin_logp = cat(s.fin_logp, jnp.where(ends, top_logp, NEG_INF))  # [batch, k]
        fin_len = cat(s.fin_len, jnp.where(ends, i + 1, 0).astype(jnp.int32))  # [batch, k]

        # live: the best k continuations that do not end in EOS
        alive_cand = jnp.where(tok == eos_id, NEG_INF, top_logp)  # [batch, 2k]
        alive_logp, keep = jax.lax.top_k(alive_cand, k)  # [batch, k]
        return BeamState(
            i=i + 1,
            last=_gather_beams(tok, keep),  # [batch, k]
            alive_seq=_gather_beams(seqs, keep),  # [batch, k, max_len]
            alive_logp=alive_logp,
            fin_seq=fin_seq,
            fin_logp=fin_logp,
            fin_score=fin_score,
            fin_len=fin_len,
            cache=reorder_beams(s.cache, _gather_beams(src_beam, keep)),
        )

    def body(s: BeamState) -> BeamState:
        logits, cache = decode_beams(model, s.last, s.i, s.cache)  # [batch, k, vocab]
        return search(dataclasses.replace(s, cache=cache), logits)

    first = jnp.broadcast_to(first_logits, (batch, k, first_logits.shape[-1]))
    s = jax.lax.while_loop(cond, body, search(init, first))
    tokens = jnp.where(jnp.arange(max_len) < s.fin_len[:, :, None], s.fin_seq, pad_id)
    return BeamResult(tokens=tokens, lengths=s.fin_len, logprobs=s.fin_logp, scores=s.fin_score)


@struct.dataclass
class SampleState:
    """The loop state of ``_ancestral`` (greedy search and sampling), rows = batch·num.

    Attributes:
      i: int32 scalar, the position decoded next.
      last: int32 ``[rows]``, each row's token at position ``i - 1`` (BOS before position 0).
      seq: int32 ``[rows, max_len]``, the tokens so far, PAD after a row's EOS.
      logp: float32 ``[rows]``, their log-probabilities.
      length: int32 ``[rows]``, tokens up to and including EOS (so far).
      finished: bool ``[rows]``, the row has produced EOS.
      cache: a ``BeamCache`` whose ``num`` hypotheses per sentence are never reordered.
    """

    i: jax.Array
    last: jax.Array
    seq: jax.Array
    logp: jax.Array
    length: jax.Array
    finished: jax.Array
    cache: BeamCache


def _ancestral(
    model: SearchModel,
    src: jax.Array,
    src_segments: jax.Array,
    max_lengths: jax.Array,
    choose: Callable[[jax.Array, jax.Array], jax.Array],
    *,
    num: int,
    max_len: int,
    bos_id: int,
    eos_id: int,
    pad_id: int,
    min_length: int,
    unk_id: int = -1,
    prefix: jax.Array | None = None,
):
    """Left-to-right decoding of ``num`` hypotheses per sentence, one token per step.

    ``choose(logits, i)`` maps float32 ``[batch·num, vocab]`` logits (banned tokens at
    ``NEG_INF``) at position ``i`` to int32 ``[batch·num]`` tokens. A row stops at its first EOS.

    Returns:
      tokens int32 ``[batch, num, max_len]`` (EOS then PAD), lengths int32 ``[batch, num]``
      (EOS included) and float32 log-probabilities ``[batch, num]``.
    """
    _check_search(max_len, min_length, 0.0, "none")
    batch, rows = src.shape[0], src.shape[0] * num
    encoded = model.encode(src, src_segments, _positions(src_segments))
    row_max = jnp.repeat(jnp.clip(max_lengths, 1, max_len).astype(jnp.int32), num)  # [rows]
    row_prefix = None if prefix is None else jnp.repeat(prefix, num, axis=0)  # [rows, p]
    init = SampleState(
        i=jnp.zeros((), jnp.int32),
        last=jnp.full((rows,), bos_id, jnp.int32),
        seq=jnp.full((rows, max_len), pad_id, jnp.int32),
        logp=jnp.zeros((rows,), jnp.float32),
        length=jnp.zeros((rows,), jnp.int32),
        finished=jnp.zeros((rows,), bool),
        cache=init_beams(model, encoded, src_segments, num, max_len),
    )

    def cond(s: SampleState) -> jax.Array:
        return (s.i < max_len) & ~jnp.all(s.finished)

    def body(s: SampleState) -> SampleState:
        i = s.i
        logits, cache = decode_beams(model, s.last.reshape(batch, num), i, s.cache)
        logits = logits.reshape(rows, -1).astype(jnp.float32)  # [rows, vocab]
        banned = _banned(
            logits.shape[-1],
            i,
            row_max,
            min_length,
            bos_id=bos_id,
            eos_id=eos_id,
            pad_id=pad_id,
            unk_id=unk_id,
            prefix=row_prefix,
        )  # [rows, vocab]
        tok = choose(jnp.where(banned, NEG_INF, logits), i).astype(jnp.int32)  # [rows]
        step_logp = jnp.take_along_axis(jax.nn.log_softmax(logits), tok[:, None], axis=-1)[
            :, 0
        ]  # [rows]
        live = ~s.finished  # [rows]
        seq = jnp.where((jnp.arange(max_len) == i) & live[:, None], tok[:, None], s.seq)
        return SampleState(
            i=i + 1,
            last=tok,
            seq=seq,  # [rows], [rows, max_len]
            logp=s.logp + jnp.where(live, step_logp, 0.0),
            length=jnp.where(live, i + 1, s.length),
            finished=s.finished | (tok == eos_id),
            cache=cache,
        )

    s = jax.lax.while_loop(cond, body, init)
    return (
        s.seq.reshape(batch, num, max_len),
        s.length.reshape(batch, num),
        s.logp.reshape(batch, num),
    )


def greedy_search(
    model: SearchModel,
    src: jax.Array,
    src_segments: jax.Array,
    max_lengths: jax.Array,
    *,
    max_len: int,
    bos_id: int,
    eos_id: int,
    pad_id: int,
    min_length: int = 0,
    unk_id: int = -1,
    prefix: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Greedy decoding: the most probable allowed token at each step until EOS.

    Args: as ``beam_search``.

    Returns:
      tokens int32 ``[batch, max_len]`` (ending in EOS, then PAD) and their total float32
      log-probabilities ``[batch]``.

    Raises:
      ValueError: ``max_len`` < 1 or ``min_length`` < 0.
    """
    tokens, _, logp = _ancestral(
        model,
        src,
        src_segments,
        max_lengths,
        lambda x, i: jnp.argmax(x, axis=-1),
        num=1,
        max_len=max_len,
        bos_id=bos_id,
        eos_id=eos_id,
        pad_id=pad_id,
        min_length=min_length,
        unk_id=unk_id,
        prefix=prefix,
    )
    return tokens[:, 0], logp[:, 0]


def sample(
    model: SearchModel,
    src: jax.Array,
    src_segments: jax.Array,
    max_lengths: jax.Array,
    keys: jax.Array,
    *,
    num_samples: int,
    max_len: int,
    bos_id: int,
    eos_id: int,
    pad_id: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    epsilon: float = 0.0,
    min_length: int = 0,
    alpha: float = 0.0,
    length_penalty_kind: str = "gnmt",
    unk_id: int = -1,
    prefix: jax.Array | None = None,
) -> BeamResult:
    """Ancestral sampling with temperature, epsilon, top-k and top-p (Holtzman et al. 2020,
    §3.1).

    At each step the token is drawn from ``filter_logits`` of the model's logits after the
    length rules (module docstring) have removed the banned tokens. Sample ``j`` of sentence
    ``b`` uses ``split(keys[b], num_samples)[j]`` folded with the position, so it depends only
    on its own key, source and the model (not on the batch or device layout). ``top_k=1`` (or a
    tiny ``top_p``) is greedy search.

    Args:
      model, src, src_segments, max_lengths, max_len, bos_id, eos_id, pad_id, min_length,
        unk_id, prefix: as ``beam_search``.
      keys: uint32 ``[batch, 2]`` one PRNG key per sentence (``sentence_keys``).
      num_samples: independent samples per sentence (static).
      temperature, top_k, top_p, epsilon: as ``filter_logits`` (static).
      alpha, length_penalty_kind: only to compute ``scores`` (and the order of the samples).

    Returns:
      ``BeamResult`` ``[batch, num_samples, ...]``, samples sorted by score, best first;
      ``logprobs`` are under the model's unfiltered distribution.

    Raises:
      ValueError: ``num_samples`` < 1, or an option out of range.
    """
    if num_samples < 1:
        raise ValueError(f"num_samples must be ≥ 1, got {num_samples}")
    check_sampling(temperature, top_k, top_p, epsilon)
    _check_search(max_len, min_length, alpha, length_penalty_kind)
    sample_keys = jax.vmap(lambda key: jax.random.split(key, num_samples))(keys).reshape(-1, 2)

    def choose(logits, i):
        step_keys = jax.vmap(jax.random.fold_in, (0, None))(sample_keys, i)
        filtered = filter_logits(
            logits, temperature=temperature, top_k=top_k, top_p=top_p, epsilon=epsilon
        )
        return jax.vmap(jax.random.categorical)(step_keys, filtered)

    tokens, lengths, logp = _ancestral(
        model,
        src,
        src_segments,
        max_lengths,
        choose,
        num=num_samples,
        max_len=max_len,
        bos_id=bos_id,
        eos_id=eos_id,
        pad_id=pad_id,
        min_length=min_length,
        unk_id=unk_id,
        prefix=prefix,
    )
    scores = logp / length_penalty(lengths, alpha, length_penalty_kind)
    order = jnp.argsort(-scores, axis=1, stable=True)
    return BeamResult(
        tokens=_gather_beams(tokens, order),
        lengths=_gather_beams(lengths, order),
        logprobs=_gather_beams(logp, order),
        scores=_gather_beams(scores, order),
    )


@functools.partial(
    jax.jit,
    static_argnames=(
        "graphdef",
        "beam_size",
        "max_len",
        "alpha",
        "bos_id",
        "eos_id",
        "pad_id",
        "length_penalty_kind",
        "min_length",
        "unk_id",
    ),
)
def beam_search_jit(
    params, src, src_segments, max_lengths, prefix=None, *, graphdef, **kwargs
) -> BeamResult:
    """``beam_search`` on a model given as (graphdef, params), or an ensemble as tuples of
    them (``merge_models``); arrays as in ``beam_search``.

    ``graphdef`` and the keyword options are static: one compilation per input shape and set
    of options (and whether a ``prefix`` is given).
    """
    model = merge_models(graphdef, params)
    return beam_search(model, src, src_segments, max_lengths, prefix=prefix, **kwargs)


@functools.partial(
    jax.jit,
    static_argnames=("graphdef", "max_len", "bos_id", "eos_id", "pad_id", "min_length", "unk_id"),
)
def greedy_search_jit(params, src, src_segments, max_lengths, prefix=None, *, graphdef, **kwargs):
    """``greedy_search`` on a model given as (graphdef, params); static as ``beam_search_jit``."""
    model = merge_models(graphdef, params)
    return greedy_search(model, src, src_segments, max_lengths, prefix=prefix, **kwargs)


@functools.partial(
    jax.jit,
    static_argnames=(
        "graphdef",
        "num_samples",
        "max_len",
        "bos_id",
        "eos_id",
        "pad_id",
        "temperature",
        "top_k",
        "top_p",
        "epsilon",
        "min_length",
        "alpha",
        "length_penalty_kind",
        "unk_id",
    ),
)
def sample_jit(
    params, src, src_segments, max_lengths, keys, prefix=None, *, graphdef, **kwargs
) -> BeamResult:
    """``sample`` on a model given as (graphdef, params); static as ``beam_search_jit`` (the
    keys are traced, so a new seed does not recompile)."""
    model = merge_models(graphdef, params)
    return sample(model, src, src_segments, max_lengths, keys, prefix=prefix, **kwargs)


def target_logprobs(
    model: Any,
    src: jax.Array,
    src_segments: jax.Array,
    tgt: jax.Array,
    tgt_segments: jax.Array,
    *,
    bos_id: int,
) -> jax.Array:
    """Teacher-forced ``log p(y_t | y_<t, x)`` of given targets (the scores of ``seq2seq-score``).

    The same forward pass as the training loss (``model(batch)``, no dropout), so
    ``-Σ logp / tokens`` over a set is its unsmoothed eval loss; beam search's ``logprob`` of a
    hypothesis is ``Σ_t`` of these (computed incrementally there, equal up to float rounding).

    Args:
      model: a ``Transformer`` or an ``Ensemble`` (log-probabilities of the mixture).
      src, src_segments: int32 ``[batch, src_len]`` as ``beam_search``.
      tgt: int32 ``[batch, tgt_len]`` targets ending in EOS, then PAD.
      tgt_segments: int32 ``[batch, tgt_len]``, 1 for real tokens (EOS included), 0 for PAD.
      bos_id: the BOS id that starts the decoder input.

    Returns:
      float32 ``[batch, tgt_len]``, 0 at padding.
    """
    batch = dict(
        src=src,
        src_segments=src_segments,
        src_positions=_positions(src_segments),
        tgt=tgt,
        tgt_segments=tgt_segments,
        tgt_positions=_positions(tgt_segments),
    )
    logp = jax.nn.log_softmax(model(batch, bos_id=bos_id).astype(jnp.float32), axis=-1)
    picked = jnp.take_along_axis(logp, tgt[..., None], axis=-1)[..., 0]
    return jnp.where(tgt_segments > 0, picked, 0.0)


@functools.partial(jax.jit, static_argnames=("graphdef", "bos_id"))
def target_logprobs_jit(params, src, src_segments, tgt, tgt_segments, *, graphdef, bos_id):
    """``target_logprobs`` on (graphdef, params) or an ensemble of them (``merge_models``)."""
    model = merge_models(graphdef, params)
    return target_logprobs(model, src, src_segments, tgt, tgt_segments, bos_id=bos_id)
