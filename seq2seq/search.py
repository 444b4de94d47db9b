"""Search strategies: one object per decoding method, chosen by ``decode.search``.

A strategy runs its compiled search (``seq2seq.decoding``) on a chunk of sources under the
``Rules`` every method obeys (length limits, banned tokens, forced prefixes) and returns
``Candidates``; a strategy that chooses among finished texts (MBR) then reorders them. The
``Translator`` batches, pads and detokenizes and knows no method; a new method is a class here
and a choice of ``decode.search`` in ``seq2seq.config``.

- ``Beam``: beam search with a length penalty (Wu et al. 2016); a beam of 1 is ``Greedy``.
- ``Greedy``: the most probable token at each step.
- ``Sampling``: ancestral sampling with temperature, epsilon, top-k and top-p.
- ``MBR``: minimum Bayes risk decoding (Kumar & Byrne 2004; Freitag et al. 2023): the candidates
  of a sampling or beam strategy, each scored by its mean chrF (Popović 2015) against all of them
  as pseudo-references, best first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from seq2seq.config import DecodeConfig
from seq2seq.decoding import (
    beam_search_jit,
    greedy_search_jit,
    length_penalty,
    sample_jit,
    sentence_keys,
)

# ``Translator._run``: a compiled search applied to the chunk's arrays with static options.
Run = Callable[..., Any]


@dataclasses.dataclass(frozen=True)
class Rules:
    """What every search obeys in one chunk (``seq2seq.decoding``'s module docstring).

    Attributes:
      max_len: the chunk's output limit in tokens, EOS included (static; ≥ every row's).
      max_lengths: int32 ``[rows]``, each row's output limit (``DecodeConfig.output_limit``).
      bos_id, eos_id, pad_id: the target vocabulary's special ids.
      min_length: tokens before EOS is allowed.
      unk_id: the banned unknown piece, -1 when it is allowed (``decode.allow_unk``).
      prefix: int32 ``[rows, max_len]`` forced target prefixes, PAD after each, or None.
    """

    max_len: int
    max_lengths: np.ndarray
    bos_id: int
    eos_id: int
    pad_id: int
    min_length: int = 0
    unk_id: int = -1
    prefix: np.ndarray | None = None

    def static(self) -> dict[str, int]:
        """The compiled searches' static keyword options."""
        return dict(
            max_len=self.max_len,
            bos_id=self.bos_id,
            eos_id=self.eos_id,
            pad_id=self.pad_id,
            min_length=self.min_length,
            unk_id=self.unk_id,
        )

    def inputs(self, *middle: np.ndarray) -> list[np.ndarray]:
        """``max_lengths``, then ``middle`` (e.g. sampling keys), then the prefix if any."""
        return [self.max_lengths, *middle, *([] if self.prefix is None else [self.prefix])]


class Candidates(NamedTuple):
    """A search's hypotheses of a chunk, best first per row.

    Attributes:
      tokens: int ``[rows, n, max_len]``, EOS included, PAD after it.
      lengths: int ``[rows, n]`` tokens with EOS; 0 marks an empty slot.
      logprobs: float ``[rows, n]`` log-probabilities under the model.
      scores: float ``[rows, n]``: the search's ranking (``logprob / lp`` or MBR's utility).
    """

    tokens: np.ndarray
    lengths: np.ndarray
    logprobs: np.ndarray
    scores: np.ndarray


def _candidates(out: Any) -> Candidates:
    return Candidates(*(np.asarray(x) for x in (out.tokens, out.lengths, out.logprobs, out.scores)))


@dataclasses.dataclass(frozen=True)
class Greedy:
    """Greedy search; ``alpha`` and ``length_penalty`` only give its score."""

    alpha: float = 0.6
    length_penalty: str = "gnmt"

    name = "greedy"
    chooses_texts = False  # True: ``choose`` reorders the candidates by their texts

    def max_nbest(self) -> int | None:
        return 1

    def label(self) -> str:
        """The method in a few words (``GET /health``)."""
        return self.name

    def nbest_bound(self) -> str:
        """``max_nbest()`` in words, for the messages."""
        return "1 (greedy search)"

    def samples(self) -> bool:
        """Whether the sampling options (temperature, top-k, top-p, epsilon, seed) apply."""
        return False

    def describe(self) -> str:
        """The method and its options (``seq2seq-evaluate``'s timing line)."""
        return "greedy"

    def search(
        self, run: Run, src: list[np.ndarray], rules: Rules, *, line_ids: np.ndarray, nbest: int
    ) -> Candidates:
        """The candidates of the chunk ``src`` (ids and segments ``[rows, width]``) under
        ``rules``; ``line_ids`` (int ``[rows]``) seed sampling, ``nbest`` samples per row."""
        tokens, logp = run(greedy_search_jit, [*src, *rules.inputs()], **rules.static())
        tokens = np.asarray(tokens)[:, None]
        lengths = (tokens != rules.pad_id).sum(-1)
        logprobs = np.asarray(logp)[:, None]
        lp = np.asarray(length_penalty(lengths, self.alpha, self.length_penalty))
        return Candidates(tokens, lengths, logprobs, logprobs / lp)

    def choose(self, texts: list[list[str]], found: Candidates) -> Candidates:
        """``found`` as it is (only MBR chooses among texts)."""
        return found


@dataclasses.dataclass(frozen=True)
class Beam(Greedy):
    """Beam search of ``beam_size`` hypotheses; a beam of 1 runs ``Greedy``."""

    beam_size: int = 4

    name = "beam"

    def max_nbest(self) -> int | None:
        return self.beam_size

    def label(self) -> str:
        return f"beam {self.beam_size}"

    def nbest_bound(self) -> str:
        return f"the beam size {self.beam_size}"

    def describe(self) -> str:
        return f"beam {self.beam_size}, alpha {self.alpha}"

    def search(
        self, run: Run, src: list[np.ndarray], rules: Rules, *, line_ids: np.ndarray, nbest: int
    ) -> Candidates:
        if self.beam_size == 1:
            return Greedy.search(self, run, src, rules, line_ids=line_ids, nbest=nbest)
        out = run(
            beam_search_jit,
            [*src, *rules.inputs()],
            beam_size=self.beam_size,
            alpha=self.alpha,
            length_penalty_kind=self.length_penalty,
            **rules.static(),
        )
        return _candidates(out)


@dataclasses.dataclass(frozen=True)
class Sampling(Greedy):
    """``nbest`` independent samples per sentence, sorted by ``logprob / lp``; a sentence's
    samples depend on ``seed`` and its line number only (``seq2seq.decoding.sample``)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    epsilon: float = 0.0
    seed: int = 0

    name = "sampling"

    def max_nbest(self) -> int | None:
        return None

    def samples(self) -> bool:
        return True

    def describe(self) -> str:
        eps = f", epsilon {self.epsilon}" if self.epsilon else ""
        return (
            f"sampling (temperature {self.temperature}, top-k {self.top_k}, top-p "
            f"{self.top_p}{eps}, seed {self.seed})"
        )

    def search(
        self, run: Run, src: list[np.ndarray], rules: Rules, *, line_ids: np.ndarray, nbest: int
    ) -> Candidates:
        keys = np.asarray(sentence_keys(self.seed, line_ids))
        out = run(
            sample_jit,
            [*src, *rules.inputs(keys)],
            num_samples=nbest,
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            epsilon=self.epsilon,
            alpha=self.alpha,
            length_penalty_kind=self.length_penalty,
            **rules.static(),
        )
        return _candidates(out)


def chrf_matrix(texts: Sequence[Sequence[str]]) -> list[np.ndarray]:
    """Sentence chrF (sacreBLEU's defaults: character 6-grams, β = 2, no word n-grams) of every
    text of a group against every text of the same group, float64 ``[n, n]`` per group:
    ``[i, j]`` is text i scored against text j as reference.

    With the ``fastchrf`` package installed (the ``mbr`` extra) it computes the matrix (equal to
    sacreBLEU's sentence scores; ``tests/test_search.py``); else sacreBLEU scores each pair.
    """
    try:
        import fastchrf
    except ImportError:
        from sacrebleu.metrics import CHRF

        chrf = CHRF()
        return [
            np.array([[chrf.sentence_score(h, [r]).score for r in group] for h in group])
            for group in texts
        ]
    groups = [list(g) for g in texts]
    return [np.asarray(m, np.float64) for m in fastchrf.pairwise_chrf(groups, groups)]


@dataclasses.dataclass(frozen=True)
class MBR:
    """Minimum Bayes risk decoding with chrF as the utility (Freitag et al. 2023).

    The ``candidates`` strategy gives ``size`` hypotheses per sentence (samples, or a beam's
    n-best); they are also the pseudo-references, an estimate of the model's distribution. Each
    distinct text gets its expected utility, the mean chrF against all ``size`` of them
    (duplicates counted: a frequent sample weighs more), and the texts come best first with that
    value (chrF points, 0-100) as their ``score``; ``logprob`` stays the model's.
    """

    candidates: Sampling | Beam
    size: int = 16

    name = "mbr"
    chooses_texts = True

    def max_nbest(self) -> int | None:
        return self.size

    def label(self) -> str:
        return f"mbr {self.size} ({self.candidates.name})"

    def nbest_bound(self) -> str:
        return f"the MBR candidates decode.mbr_size={self.size}"

    def samples(self) -> bool:
        return self.candidates.samples()

    def describe(self) -> str:
        return f"mbr ({self.size} candidates from {self.candidates.describe()}, chrF)"

    def search(
        self, run: Run, src: list[np.ndarray], rules: Rules, *, line_ids: np.ndarray, nbest: int
    ) -> Candidates:
        return self.candidates.search(run, src, rules, line_ids=line_ids, nbest=self.size)

    def choose(self, texts: list[list[str]], found: Candidates) -> Candidates:
        """``found`` reordered by expected chrF per row, one slot per distinct text; ``texts``
        holds each row's candidate texts (empty slots excluded), in slot order."""
        tokens = np.zeros_like(found.tokens)
        lengths = np.zeros_like(found.lengths)
        logprobs = np.zeros_like(found.logprobs)
        scores = np.zeros(found.scores.shape, np.float64)
        for r, (group, utility) in enumerate(zip(texts, chrf_matrix(texts))):
            if not group:
                continue
            slots = np.flatnonzero(found.lengths[r] > 0)  # group[k] is slot slots[k]'s text
            expected = utility.mean(axis=1)
            first: dict[str, int] = {}
            for k, text in enumerate(group):
                first.setdefault(text, k)
            order = sorted(first.values(), key=lambda k: (-expected[k], k))
            for slot, k in enumerate(order):
                j = slots[k]
                tokens[r, slot], lengths[r, slot] = found.tokens[r, j], found.lengths[r, j]
                logprobs[r, slot], scores[r, slot] = found.logprobs[r, j], expected[k]
        return Candidates(tokens, lengths, logprobs, scores)


Strategy = Greedy | Beam | Sampling | MBR


def strategy(decode: DecodeConfig) -> Strategy:
    """The strategy of ``decode.search`` with its options from ``decode``."""
    alpha, kind = decode.alpha, decode.length_penalty
    sampling = Sampling(
        temperature=decode.temperature,
        top_k=decode.top_k,
        top_p=decode.top_p,
        epsilon=decode.sampling_epsilon,
        seed=decode.seed,
        alpha=alpha,
        length_penalty=kind,
    )
    if decode.search == "greedy":
        return Greedy(alpha=alpha, length_penalty=kind)
    if decode.search == "sampling":
        return sampling
    if decode.search == "mbr":
        beam = Beam(beam_size=decode.mbr_size, alpha=alpha, length_penalty=kind)
        return MBR(sampling if decode.mbr_candidates == "sampling" else beam, decode.mbr_size)
    return Beam(beam_size=decode.beam_size, alpha=alpha, length_penalty=kind)
