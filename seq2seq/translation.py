"""Translate many sentences: tokenize, batch by token budget in length buckets, decode, restore
order.

Lines are tokenized, sorted by length and cut into batches of at most ``max_tokens`` source
tokens whose width is one of a few ``BUCKETS`` (and whose row count is a power of two or the
full budget), so that few shapes are compiled; results come back in input order. An empty (or
all-whitespace) line gives one empty hypothesis without decoding. Sources longer than
``max_src_len`` tokens are truncated with a warning naming the line, or rejected.

Decoding is beam search, greedy search (beam 1) or sampling (``seq2seq/decoding.py`` has the
rules). Sampling is seeded per line (``sentence_keys(seed, line_index)``), so a line's samples do
not depend on the batching or on the other lines. Decoding runs on a ``Partitioner``'s mesh (one
device by default): sentences split over ``data × fsdp``, parameters placed by the rules.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from tqdm.auto import tqdm

from seq2seq.config import DecodeConfig
from seq2seq.data.tokenizer import Tokenizer, TokenizerPair
from seq2seq.decoding import (
    LENGTH_PENALTIES,
    beam_search_jit,
    check_sampling,
    greedy_search_jit,
    length_penalty,
    sample_jit,
    sentence_keys,
)
from seq2seq.sharding import Partitioner

log = logging.getLogger(__name__)

BUCKETS = (16, 32, 64, 128, 256, 512)
ON_LONG = ("truncate", "reject")


@dataclass(frozen=True)
class Hypothesis:
    """One translation.

    Attributes:
      text: detokenized output.
      tokens: output ids without EOS.
      logprob: total log-probability under the model (EOS included).
      score: ``logprob / lp(|Y|)`` with the configured length penalty.
    """

    text: str
    tokens: tuple[int, ...]
    logprob: float
    score: float


def bucket_length(n: int, max_len: int) -> int:
    """Smallest bucket ≥ n tokens (bounded by ``max_len``): few shapes, few compilations."""
    for b in BUCKETS:
        if n <= b:
            return min(b, max_len)
    return max_len


def check_decode_config(config: DecodeConfig) -> None:
    """Validate decoding options before any work is done.

    Raises:
      ValueError: a value is out of range; the message names the ``decode.*`` key.
    """
    problems = []
    if config.beam_size < 1:
        problems.append(f"decode.beam_size must be ≥ 1, got {config.beam_size}")
    if config.alpha < 0:
        problems.append(f"decode.alpha must be ≥ 0, got {config.alpha}")
    if config.length_penalty not in LENGTH_PENALTIES:
        problems.append(
            f"decode.length_penalty must be one of {', '.join(LENGTH_PENALTIES)}, "
            f"got {config.length_penalty!r}"
        )
    if config.max_len_a < 0 or config.max_len_b < 1:
        problems.append(
            f"decode.max_len_a must be ≥ 0 and decode.max_len_b ≥ 1, got "
            f"{config.max_len_a} and {config.max_len_b}"
        )
    if config.min_length < 0:
        problems.append(f"decode.min_length must be ≥ 0, got {config.min_length}")
    if config.max_tokens < 1:
        problems.append(f"decode.max_tokens must be ≥ 1, got {config.max_tokens}")
    try:
        check_sampling(config.temperature, config.top_k, config.top_p)
    except ValueError as e:
        problems.append(f"decode.{e}")
    if problems:
        raise ValueError("; ".join(problems))


class Translator:
    """Translation of raw sentences with a trained model.

    Args:
      graphdef, params: the model split by ``nnx.split(model, nnx.Param)``.
      tokenizer: the run's SentencePiece tokenizer (gives PAD/BOS/EOS ids).
      config: decoding options (search, α, length limits, sampling, token budget).
      max_src_len: source limit in tokens, EOS included (≥ 2).
      on_long: a longer source is ``truncate``-d to its first ``max_src_len - 1`` tokens plus
        EOS (with a warning naming the line) or makes ``translate`` ``reject`` the input.
      partitioner: the mesh to decode on (``seq2seq.sharding.Partitioner``; default: this
        process's first device): parameters placed by its rules, sentences split over
        ``data × fsdp`` (row counts rounded up to a multiple of it), results replicated to
        every process.

    Raises:
      ValueError: invalid ``config`` (``check_decode_config``), ``max_src_len`` < 2 or unknown
        ``on_long``.
    """

    def __init__(
        self,
        graphdef: Any,
        params: Any,
        tokenizer: Tokenizer | TokenizerPair,
        config: DecodeConfig,
        max_src_len: int = 256,
        *,
        on_long: str = "truncate",
        partitioner: Partitioner | None = None,
    ):
        check_decode_config(config)
        if max_src_len < 2:
            raise ValueError(f"max_src_len must be ≥ 2 (a token and EOS), got {max_src_len}")
        if on_long not in ON_LONG:
            raise ValueError(f"on_long must be one of {', '.join(ON_LONG)}, got {on_long!r}")
        self.graphdef, self.tokenizer, self.config = graphdef, tokenizer, config
        self.max_src_len, self.on_long = max_src_len, on_long
        self.partitioner = partitioner or Partitioner.single_device()
        self._param_shardings = self.partitioner.shardings(params)
        self.params = self.partitioner.place(params)
        self._compiled: dict[tuple, Any] = {}  # one executable per search and its options

    def translate(
        self,
        lines: Sequence[str],
        *,
        nbest: int = 1,
        progress: bool = False,
        source: str | None = None,
    ) -> list[list[Hypothesis]]:
        """Translate ``lines`` (one sentence each), returning results in input order.

        Args:
          lines: source sentences.
          nbest: hypotheses per line, best first: ≤ beam size for beam search; the number of
            independent samples when sampling.
          progress: show a progress bar (stderr).
          source: the file ``lines`` come from, named with the line in the messages about
            long lines (``file:line``).

        Returns:
          One list per line with up to ``nbest`` hypotheses (fewer only if fewer exist, e.g.
          with a maximum output length of 1); an empty or all-whitespace line gives exactly one
          empty hypothesis with logprob and score 0.

        Raises:
          ValueError: ``nbest`` out of range, or ``on_long="reject"`` and a line has more than
            ``max_src_len`` tokens (the message names the lines).
        """
        cfg, tok = self.config, self.tokenizer
        limit = cfg.beam_size if not cfg.sampling else None
        if nbest < 1 or (limit is not None and nbest > limit):
            raise ValueError(f"nbest={nbest} must be between 1 and the beam size {cfg.beam_size}")
        ids = tok.encode(list(lines))
        results: list[list[Hypothesis]] = [[Hypothesis("", (), 0.0, 0.0)] for _ in lines]
        todo, too_long = [], []
        for i, (line, x) in enumerate(zip(lines, ids)):
            if not line.strip():
                continue
            if len(x) > self.max_src_len:
                too_long.append((i, len(x)))
                if self.on_long == "truncate":
                    log.warning(
                        "%s: %d tokens, truncated to %d",
                        f"{source}:{i + 1}" if source else f"line {i + 1}",
                        len(x),
                        self.max_src_len,
                    )
                    x = np.concatenate([x[: self.max_src_len - 1], [tok.eos_id]]).astype(np.int32)
            todo.append((len(x), i, x))
        if too_long and self.on_long == "reject":
            named = ", ".join(f"line {i + 1} ({n} tokens)" for i, n in too_long[:10])
            more = f" and {len(too_long) - 10} more" if len(too_long) > 10 else ""
            raise ValueError(
                f"{source + ': ' if source else ''}{len(too_long)} line(s) "
                "longer than the limit of "
                f"{self.max_src_len} tokens: {named}{more}"
            )
        todo.sort(key=lambda t: (t[0], t[1]))
        shards = self.partitioner.batch_shards  # whole rows per device
        bar = tqdm(total=len(todo), desc="translate", unit="sent", disable=not progress)
        start = 0
        while start < len(todo):
            width = bucket_length(todo[start][0], self.max_src_len)
            budget = max(1, cfg.max_tokens // width)
            chunk = [t for t in todo[start : start + budget] if t[0] <= width]
            start += len(chunk)
            # the full budget, or the next power of two for a smaller (last) chunk
            rows = min(budget, 1 << (len(chunk) - 1).bit_length())
            rows = -(-rows // shards) * shards
            self._decode_chunk(chunk, width, rows, nbest, results)
            bar.update(len(chunk))
        bar.close()
        return results

    def _run(self, search, inputs: list[np.ndarray], **static):
        """``search(params, *inputs, **static)`` on the partitioner's mesh, compiled once per
        search and options (and input shape)."""
        key = (search, tuple(sorted(static.items())))
        if key not in self._compiled:
            layout = self.partitioner.compute_layout(self._param_shardings)

            def decode(params, rows):  # parameters gathered over fsdp once, not in every step
                return search(jax.lax.with_sharding_constraint(params, layout), *rows, **static)

            self._compiled[key] = self.partitioner.jit(decode, self._param_shardings)
        placed = self.partitioner.shard_batch(dict(enumerate(inputs)))
        return self._compiled[key](self.params, tuple(placed.values()))

    def _decode_chunk(self, chunk, width, rows, nbest, results):
        cfg, tok = self.config, self.tokenizer
        src = np.full((rows, width), tok.pad_id, np.int32)
        lengths = np.zeros((rows,), np.int32)
        line_ids = np.zeros((rows,), np.int64)
        for r, (n, i, x) in enumerate(chunk):
            src[r, :n] = x
            lengths[r] = n
            line_ids[r] = i
        max_len = int(cfg.max_len_a * width + cfg.max_len_b)
        max_lengths = np.minimum(np.ceil(cfg.max_len_a * lengths + cfg.max_len_b), max_len)
        inputs = [src, (src != tok.pad_id).astype(np.int32), max_lengths.astype(np.int32)]
        common = dict(
            graphdef=self.graphdef,
            max_len=max_len,
            bos_id=tok.bos_id,
            eos_id=tok.eos_id,
            pad_id=tok.pad_id,
            min_length=cfg.min_length,
            unk_id=-1 if cfg.allow_unk else tok.unk_id,
        )  # never " ⁇ " by default
        scoring = dict(alpha=cfg.alpha, length_penalty_kind=cfg.length_penalty)
        if cfg.sampling:
            inputs.append(np.asarray(sentence_keys(cfg.seed, line_ids)))
            out = self._run(
                sample_jit,
                inputs,
                num_samples=nbest,
                temperature=cfg.temperature,
                top_k=cfg.top_k,
                top_p=cfg.top_p,
                **common,
                **scoring,
            )
            tokens, lens = np.asarray(out.tokens), np.asarray(out.lengths)
            logprobs, scores = np.asarray(out.logprobs), np.asarray(out.scores)
        elif cfg.beam_size == 1:
            out_tokens, out_logp = self._run(greedy_search_jit, inputs, **common)
            tokens = np.asarray(out_tokens)[:, None]
            lens = (tokens != tok.pad_id).sum(-1)
            logprobs = np.asarray(out_logp)[:, None]
            scores = logprobs / np.asarray(length_penalty(lens, cfg.alpha, cfg.length_penalty))
        else:
            out = self._run(beam_search_jit, inputs, beam_size=cfg.beam_size, **common, **scoring)
            tokens, lens = np.asarray(out.tokens), np.asarray(out.lengths)
            logprobs, scores = np.asarray(out.logprobs), np.asarray(out.scores)
        for r, (_, i, _) in enumerate(chunk):
            hyps = []
            for j in range(min(nbest, tokens.shape[1])):
                if lens[r, j] < 1:  # an empty n-best slot (fewer hypotheses than nbest exist)
                    continue
                body = tuple(int(t) for t in tokens[r, j, : lens[r, j] - 1])
                hyps.append(
                    Hypothesis(
                        tok.decode([body])[0], body, float(logprobs[r, j]), float(scores[r, j])
                    )
                )
            results[i] = hyps
