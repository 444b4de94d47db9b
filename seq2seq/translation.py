"""Translate many sentences: tokenize, batch by token budget in length buckets, decode, restore
order.

Lines are tokenized, sorted by length and cut into batches of at most ``max_tokens`` source
tokens whose width is one of a few ``BUCKETS`` (and whose row count is a power of two or the
full budget), so that few shapes are compiled; results come back in input order. An empty (or
all-whitespace) line gives one empty hypothesis without decoding. Sources longer than
``max_src_len`` tokens are truncated with a warning naming the line, or rejected. A
translation is always one line: line breaks that sampled byte pieces decode to are replaced by
spaces and counted (``one_line``).

Decoding is the strategy ``decode.search`` names (``seq2seq.search``: beam, greedy, sampling or
MBR; ``seq2seq/decoding.py`` has the rules). Sampling is seeded per line
(``sentence_keys(seed, line_index)``), so a line's samples do not depend on the batching or on
the other lines. Decoding runs on a ``Partitioner``'s mesh (one
device by default): sentences split over ``data × fsdp``, parameters placed by the rules.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from seq2seq.config import ConfigError, DecodeConfig, range_problems
from seq2seq.data.pipeline import unknown_rate
from seq2seq.data.tokenizer import Tokenizer, TokenizerPair
from seq2seq.decoding import LENGTH_PENALTIES, length_penalty, target_logprobs_jit
from seq2seq.search import Rules, strategy
from seq2seq.sharding import Partitioner

log = logging.getLogger(__name__)

BUCKETS = (16, 32, 64, 128, 256, 512)
# compiled searches by (search, static options, parameter layout): see ``Translator._run``
_EXECUTABLES: dict[tuple, Any] = {}
ON_LONG = ("truncate", "reject")
# what ``str.splitlines`` splits on (``\r\n`` is one break): none stays in a translation
LINE_BREAKS = re.compile("\r\n|[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]")


def one_line(text: str) -> tuple[str, int]:
    """``text`` with each line break (``LINE_BREAKS``) replaced by a space, and their number.

    A sampled byte piece such as ``<0x0A>`` decodes to a line break; replaced, a translation
    is always one line of a file, whatever the model writes.
    """
    return LINE_BREAKS.subn(" ", text)


@dataclass(frozen=True)
class Hypothesis:
    """One translation.

    Attributes:
      text: detokenized output (SentencePiece's decode of ``tokens``, byte pieces as bytes),
        one line: its line breaks replaced by spaces (``one_line``).
      tokens: output ids without EOS.
      logprob: total log-probability under the model (EOS included).
      score: ``logprob / lp(|Y|)`` with the configured length penalty.
      decoded: False for the empty hypothesis of a line that was not decoded (empty source,
        no prefix).
      line_breaks: line breaks the decoded text held, replaced in ``text``.
    """

    text: str
    tokens: tuple[int, ...]
    logprob: float
    score: float
    decoded: bool = field(default=True, compare=False)
    line_breaks: int = 0


@dataclass(frozen=True)
class Scored:
    """The teacher-forced score of one given translation (``Translator.score``).

    Attributes:
      tokens: target ids without EOS.
      pieces: the SentencePiece piece of each scored token, EOS (``</s>``) last.
      token_logprobs: ``log p(y_t | y_<t, x)`` of each piece, EOS last.
      logprob: their sum.
      score: ``logprob / lp(|Y|)``, the length-normalised score beam search ranks by.
    """

    tokens: tuple[int, ...]
    pieces: tuple[str, ...]
    token_logprobs: tuple[float, ...]
    logprob: float
    score: float

    @property
    def per_token(self) -> float:
        """``logprob / |Y|`` (EOS counted)."""
        return self.logprob / len(self.token_logprobs)


def bucket_length(n: int, max_len: int) -> int:
    """Smallest bucket ≥ n tokens (bounded by ``max_len``): few shapes, few compilations."""
    for b in BUCKETS:
        if n <= b:
            return min(b, max_len)
    return max_len


def check_decode_config(config: DecodeConfig) -> None:
    """Validate decoding options before any work is done.

    Raises:
      ConfigError: a value is out of range (a ``ValueError``); the message names the
        ``decode.*`` key.
    """
    problems = range_problems(config, "decode.")  # each key's Range in the schema
    if config.length_penalty not in LENGTH_PENALTIES:
        problems.append(
            f"decode.length_penalty must be one of {', '.join(LENGTH_PENALTIES)}, "
            f"got {config.length_penalty!r}"
        )
    if problems:
        raise ConfigError("; ".join(problems))


def chunk_rules(
    config: DecodeConfig,
    tokenizer: Any,
    width: int,
    lengths: np.ndarray,
    prefix: np.ndarray | None = None,
) -> Rules:
    """The search ``Rules`` of a chunk of sources ``width`` tokens wide: the bucket's output
    limit (``config.output_limit(width)``, which every row's fits in), each row's limit from
    its source length (int ``[rows]``, EOS included), ``tokenizer``'s special ids (anything
    with ``pad_id``, ``bos_id``, ``eos_id``, ``unk_id``), the unknown piece banned unless
    ``decode.allow_unk``, and ``prefix`` (int32 ``[rows, max_len]`` or None)."""
    max_len = config.output_limit(width)
    max_lengths = np.array([min(config.output_limit(int(n)), max_len) for n in lengths])
    return Rules(
        max_len=max_len,
        max_lengths=max_lengths.astype(np.int32),
        bos_id=tokenizer.bos_id,
        eos_id=tokenizer.eos_id,
        pad_id=tokenizer.pad_id,
        min_length=config.min_length,
        unk_id=-1 if config.allow_unk else tokenizer.unk_id,  # never " ⁇ " by default
        prefix=prefix,
    )


def chunk_rows(lines: int, width: int, max_tokens: int, shards: int) -> int:
    """Rows of a decoding chunk of ``lines`` sources ``width`` tokens wide: the
    ``max_tokens`` budget (at least one row), or the next power of two for fewer lines,
    rounded up to whole rows per device (``shards`` = data × fsdp)."""
    budget = max(1, max_tokens // width)
    rows = min(budget, 1 << (min(lines, budget) - 1).bit_length())
    return -(-rows // shards) * shards


def search_step(
    partitioner: Partitioner, param_shardings: Any, search: Any, static: dict[str, Any]
) -> Any:
    """``search(params, *rows, **static)`` jitted over ``partitioner``'s mesh as the
    ``Translator`` runs it: parameters come in with ``param_shardings`` and compute gathered
    over ``fsdp`` (once, not in every decoding step), the rows (a tuple of arrays
    ``[sentences, ...]``) are split over ``data × fsdp``, the results are replicated."""
    layout = partitioner.compute_layout(param_shardings)

    def decode(params, rows):
        return search(jax.lax.with_sharding_constraint(params, layout), *rows, **static)

    return partitioner.jit(decode, param_shardings)


class Translator:
    """Translation of raw sentences with a trained model.

    Args:
      graphdef, params: the model split by ``nnx.split(model, nnx.Param)``; or tuples of
        them, one entry per model, for an ensemble (``seq2seq.decoding.Ensemble``: the models
        must share ``tokenizer``'s vocabularies).
      tokenizer: the run's SentencePiece tokenizer (gives PAD/BOS/EOS ids).
      config: decoding options (``decode.search`` names the strategy, ``self.strategy``; α,
        length limits, sampling, token budget).
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
        self.strategy = strategy(config)
        self.max_src_len, self.on_long = max_src_len, on_long
        self.partitioner = partitioner or Partitioner.single_device()
        self._param_shardings = self.partitioner.shardings(params)
        self.params = self.partitioner.place(params)

    def translate(
        self,
        lines: Sequence[str],
        *,
        nbest: int = 1,
        progress: bool | tqdm = False,
        source: str | None = None,
        prefixes: Sequence[str] | None = None,
        prefix_source: str | None = None,
        first_line: int = 0,
    ) -> list[list[Hypothesis]]:
        """Translate ``lines`` (one sentence each), returning results in input order.

        Args:
          lines: source sentences.
          nbest: hypotheses per line, best first: at most the strategy's ``max_nbest()`` (the
            beam size; 1 for greedy; MBR's candidates), any number of independent samples.
          progress: show a progress bar (stderr), or advance this ``tqdm`` bar by each
            decoded line.
          source: the file ``lines`` come from, named with the line in the messages about
            long lines (``file:line``).
          first_line: the 0-based line number of ``lines[0]`` in ``source`` (a part of a
            file): it numbers the lines in the messages and seeds each line's samples, so a
            part decodes as it would within the whole file.
          prefixes: one target prefix per line (None: none), SentencePiece-encoded without
            EOS; each translation starts with its prefix's pieces, which count in its
            logprob and score (``seq2seq.decoding``, "Target prefix"). An empty prefix forces
            nothing.
          prefix_source: the file ``prefixes`` come from, named in the messages.

        Returns:
          One list per line with up to ``nbest`` hypotheses (fewer only if fewer exist, e.g.
          with a maximum output length of 1); an empty or all-whitespace line without a prefix
          gives exactly one empty hypothesis with logprob and score 0. Each text is one line
          (``Hypothesis.line_breaks``); a warning counts the line breaks replaced.

        Raises:
          ValueError: ``nbest`` out of range, ``on_long="reject"`` and a line has more than
            ``max_src_len`` tokens (the message names the lines), ``prefixes`` not one per
            line, or a prefix that leaves no room for EOS within its line's output limit
            (``decode.max_len_a``·|x| + ``decode.max_len_b``; the message names the line).
        """
        cfg = self.config
        limit = self.strategy.max_nbest()
        if nbest < 1 or (limit is not None and nbest > limit):
            raise ValueError(f"nbest={nbest} must be between 1 and {self.strategy.nbest_bound()}")
        prefix_ids = (
            None if prefixes is None else self.check_prefixes(lines, prefixes, prefix_source)
        )
        ids = self.source_ids(lines, source, first_line)
        results = [[Hypothesis("", (), 0.0, 0.0, decoded=False)] for _ in lines]
        todo = []
        for i, (line, x) in enumerate(zip(lines, ids)):
            if not line.strip() and (prefix_ids is None or not len(prefix_ids[i])):
                continue
            todo.append((len(x), i, x))
        todo.sort(key=lambda t: (t[0], t[1]))
        shards = self.partitioner.batch_shards  # whole rows per device
        own_bar = not isinstance(progress, tqdm)
        bar: tqdm = (
            progress
            if isinstance(progress, tqdm)
            else tqdm(total=len(todo), desc="translate", unit="sent", disable=not progress)
        )
        start = 0
        while start < len(todo):
            width = bucket_length(todo[start][0], self.max_src_len)
            budget = max(1, cfg.max_tokens // width)
            chunk = [t for t in todo[start : start + budget] if t[0] <= width]
            start += len(chunk)
            rows = chunk_rows(len(chunk), width, cfg.max_tokens, shards)
            self._decode_chunk(chunk, width, rows, nbest, results, prefix_ids, first_line)
            bar.update(len(chunk))
        if own_bar:
            bar.close()
        breaks = [sum(h.line_breaks for h in hyps) for hyps in results]
        if any(breaks):
            first = first_line + next(i for i, n in enumerate(breaks) if n) + 1
            log.warning(
                "%s%d line break(s) in the translations of %d line(s) replaced by spaces "
                "(first: line %d): one line out per line in",
                f"{source}: " if source else "",
                sum(breaks),
                sum(n > 0 for n in breaks),
                first,
            )
        return results

    def source_ids(
        self, lines: Sequence[str], source: str | None, first_line: int = 0
    ) -> list[np.ndarray]:
        """Source ids of each line (EOS last), longer ones truncated (with a warning) or
        rejected as ``on_long`` says (lines numbered from ``first_line + 1``)."""
        tok = self.tokenizer
        ids = tok.encode(list(lines))
        too_long = []
        for i, x in enumerate(ids):
            if len(x) > self.max_src_len:
                too_long.append((i, len(x)))
                if self.on_long == "truncate":
                    log.warning(
                        "%s: %d tokens, truncated to %d",
                        f"{source}:{first_line + i + 1}"
                        if source
                        else f"line {first_line + i + 1}",
                        len(x),
                        self.max_src_len,
                    )
                    keep = x[: self.max_src_len - 1]
                    ids[i] = np.concatenate([keep, [tok.eos_id]]).astype(np.int32)
        if too_long and self.on_long == "reject":
            named = ", ".join(f"line {first_line + i + 1} ({n} tokens)" for i, n in too_long[:10])
            more = f" and {len(too_long) - 10} more" if len(too_long) > 10 else ""
            raise ValueError(
                f"{source + ': ' if source else ''}{len(too_long)} line(s) "
                "longer than the limit of "
                f"{self.max_src_len} tokens: {named}{more}"
            )
        return ids

    def log_unknown_rate(self, lines: Sequence[str], name: str = "input") -> float:
        """Log the share of ``lines``' source tokens (EOS included) that are the unknown piece,
        as training logs one per split (``seq2seq.data.pipeline.unknown_rate``); a warning
        from 1% up (text the tokenizer does not cover). ``name``: the input, in the message.

        Returns:
          the share, in [0, 1].
        """
        tok = self.tokenizer
        source = tok.source if isinstance(tok, TokenizerPair) else tok
        rate = unknown_rate(source.encode(list(lines)), source.unk_id)
        log.log(
            logging.WARNING if rate >= 0.01 else logging.INFO,
            "unknown pieces (share of tokens): %s %.3f%%%s",
            name,
            100 * rate,
            "; the tokenizer does not cover this text well (its characters were rare or absent "
            "in the training data)"
            if rate >= 0.01
            else "",
        )
        return rate

    def _target_encode(self, texts: Sequence[str], *, add_eos: bool) -> list[np.ndarray]:
        target = self.tokenizer.target if isinstance(self.tokenizer, TokenizerPair) else None
        return (target or self.tokenizer).encode(list(texts), add_eos=add_eos)

    def check_prefixes(
        self, lines: Sequence[str], prefixes: Sequence[str], prefix_source: str | None = None
    ) -> list[np.ndarray]:
        """Target ids (int32, no EOS) of the prefix of each line, checked as ``translate``
        checks them (before any decoding, e.g. per request in a server).

        Raises:
          ValueError: not one prefix per line, or a prefix that leaves no room for EOS in its
            line's output limit (the message names ``prefix_source:line``).
        """
        if len(prefixes) != len(lines):
            raise ValueError(
                f"{prefix_source or 'the prefixes'} has {len(prefixes)} line(s) but the input "
                f"has {len(lines)}; give one prefix per input line (an empty line: no prefix)"
            )
        ids = self._target_encode(prefixes, add_eos=False)
        sources = self.tokenizer.encode(list(lines))
        for i, (x, p) in enumerate(zip(sources, ids)):
            if len(p):
                self._check_prefix(min(len(x), self.max_src_len), len(p), i, prefix_source)
        return ids

    def _check_prefix(self, n: int, p: int, i: int, prefix_source: str | None) -> None:
        """A prefix of ``p`` tokens must leave room for EOS in the output limit of line ``i``
        (source of ``n`` tokens), as ``_decode_chunk`` computes it."""
        cfg = self.config
        limit = cfg.output_limit(n)  # n ≤ its bucket width: the bucket's limit is not lower
        if p + 1 > limit:
            where = f"{prefix_source}:{i + 1}" if prefix_source else f"prefix of line {i + 1}"
            raise ValueError(
                f"{where}: the prefix has {p} tokens, but the output of that line is limited to "
                f"{limit} tokens with EOS (decode.max_len_a={cfg.max_len_a} · {n} source tokens "
                f"+ decode.max_len_b={cfg.max_len_b}); shorten the prefix or raise the limit"
            )

    def _run(self, search, inputs: list[np.ndarray], **static):
        """``search(params, *inputs, graphdef=self.graphdef, **static)`` on the partitioner's
        mesh, compiled once per search, options, parameter layout and input shape (shared by
        every ``Translator`` of the process: another run or checkpoint of the same model reuses
        the executables)."""
        static.setdefault("graphdef", self.graphdef)
        shardings = jax.tree.flatten(self._param_shardings)
        key = (search, tuple(sorted(static.items())), shardings[1], tuple(shardings[0]))
        if key not in _EXECUTABLES:
            _EXECUTABLES[key] = search_step(self.partitioner, self._param_shardings, search, static)
        placed = self.partitioner.shard_batch(dict(enumerate(inputs)))
        return _EXECUTABLES[key](self.params, tuple(placed.values()))

    def _decode_chunk(self, chunk, width, rows, nbest, results, prefix_ids=None, first_line=0):
        cfg, tok = self.config, self.tokenizer
        src = np.full((rows, width), tok.pad_id, np.int32)
        lengths = np.zeros((rows,), np.int32)
        line_ids = np.zeros((rows,), np.int64)
        for r, (n, i, x) in enumerate(chunk):
            src[r, :n] = x
            lengths[r] = n
            line_ids[r] = first_line + i  # the line number in the file seeds its samples
        src_rows = [src, (src != tok.pad_id).astype(np.int32)]
        prefix = None
        if prefix_ids is not None:  # [rows, max_len]: no new shape, PAD after each prefix
            prefix = np.full((rows, cfg.output_limit(width)), tok.pad_id, np.int32)
            for r, (_, i, _) in enumerate(chunk):
                prefix[r, : len(prefix_ids[i])] = prefix_ids[i]
        rules = chunk_rules(cfg, tok, width, lengths, prefix)
        found = self.strategy.search(self._run, src_rows, rules, line_ids=line_ids, nbest=nbest)
        if self.strategy.chooses_texts:  # MBR: among the candidates' texts
            texts = [
                tok.decode(
                    [
                        [int(x) for x in t[: n - 1]]
                        for t, n in zip(found.tokens[r], found.lengths[r])
                        if n
                    ]
                )
                for r in range(len(chunk))
            ]
            found = self.strategy.choose(texts, found)
        tokens, lens, logprobs, scores = found
        for r, (_, i, _) in enumerate(chunk):
            hyps = []
            for j in range(min(nbest, tokens.shape[1])):
                if lens[r, j] < 1:  # an empty n-best slot (fewer hypotheses than nbest exist)
                    continue
                body = tuple(int(t) for t in tokens[r, j, : lens[r, j] - 1])
                text, breaks = one_line(tok.decode([body])[0])
                hyps.append(
                    Hypothesis(
                        text, body, float(logprobs[r, j]), float(scores[r, j]), line_breaks=breaks
                    )
                )
            results[i] = hyps

    def score(
        self,
        sources: Sequence[str],
        targets: Sequence[str | Sequence[int]],
        *,
        source: str | None = None,
    ) -> list[Scored]:
        """Teacher-forced log-probabilities of given translations, in input order.

        The forward pass of the training loss (``seq2seq.decoding.target_logprobs``), batched
        like ``translate``: ``-Σ token_logprobs / Σ |Y|`` over a set is the unsmoothed eval
        loss on those pairs, and the ``logprob``/``score`` of a hypothesis equal the search's.
        An ensemble scores under the mixture of its models.

        Args:
          sources: source sentences (long ones truncated or rejected as in ``translate``).
          targets: one translation per source: text (SentencePiece-encoded with EOS) or
            target ids without EOS (e.g. ``Hypothesis.tokens``).
          source: the file ``sources`` come from, for the messages.

        Returns:
          one ``Scored`` per pair.

        Raises:
          ValueError: ``sources`` and ``targets`` differ in length, or ``on_long="reject"``
            and a source is too long.
        """
        if len(sources) != len(targets):
            raise ValueError(f"{len(sources)} sources but {len(targets)} targets")
        cfg, tok = self.config, self.tokenizer
        src_ids = self.source_ids(sources, source)
        texts = {i: t for i, t in enumerate(targets) if isinstance(t, str)}
        encoded = dict(zip(texts, self._target_encode(list(texts.values()), add_eos=True)))
        tgt_ids = [
            encoded[i] if i in encoded else np.asarray([*t, tok.eos_id], np.int32)
            for i, t in enumerate(targets)
        ]

        def width(n: int) -> int:  # buckets as for sources, beyond them the length itself
            return next((b for b in BUCKETS if n <= b), n)

        todo = sorted(
            range(len(sources)),
            key=lambda i: (width(len(src_ids[i])), width(len(tgt_ids[i])), i),
        )
        target = tok.target if isinstance(tok, TokenizerPair) else tok
        out: list[Scored | None] = [None] * len(sources)
        shards = self.partitioner.batch_shards
        start = 0
        while start < len(todo):
            first = todo[start]
            sw, tw = width(len(src_ids[first])), width(len(tgt_ids[first]))
            budget = max(1, cfg.max_tokens // max(sw, tw))
            chunk = [
                i
                for i in todo[start : start + budget]
                if (width(len(src_ids[i])), width(len(tgt_ids[i]))) == (sw, tw)
            ]
            start += len(chunk)
            rows = min(budget, 1 << (len(chunk) - 1).bit_length())
            rows = -(-rows // shards) * shards
            src = np.full((rows, sw), tok.pad_id, np.int32)
            tgt = np.full((rows, tw), tok.pad_id, np.int32)
            for r, i in enumerate(chunk):
                src[r, : len(src_ids[i])] = src_ids[i]
                tgt[r, : len(tgt_ids[i])] = tgt_ids[i]
            tgt_segments = np.zeros((rows, tw), np.int32)
            for r, i in enumerate(chunk):
                tgt_segments[r, : len(tgt_ids[i])] = 1
            inputs = [src, (src != tok.pad_id).astype(np.int32), tgt, tgt_segments]
            logp = np.asarray(
                self._run(target_logprobs_jit, inputs, graphdef=self.graphdef, bos_id=tok.bos_id),
                np.float64,
            )
            lengths = jnp.asarray([len(tgt_ids[i]) for i in chunk])
            lps = np.asarray(length_penalty(lengths, cfg.alpha, cfg.length_penalty), np.float64)
            for r, i in enumerate(chunk):
                y = tgt_ids[i]
                values = tuple(float(v) for v in logp[r, : len(y)])
                total = float(np.sum(logp[r, : len(y)]))
                lp = float(lps[r])
                out[i] = Scored(
                    tokens=tuple(int(t) for t in y[:-1]),
                    pieces=tuple(target.id_to_piece(int(t)) for t in y),
                    token_logprobs=values,
                    logprob=total,
                    score=total / lp,
                )
        return [s for s in out if s is not None]
