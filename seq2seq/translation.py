"""Translate many sentences: tokenize, batch by token budget in length buckets, decode, restore order."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Sequence

import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from seq2seq.config import DecodeConfig
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.decoding import beam_search_jit

log = logging.getLogger(__name__)

BUCKETS = (16, 32, 64, 128, 256, 512)


@dataclass(frozen=True)
class Hypothesis:
    """One translation: detokenized ``text``, its ``tokens`` (ids without EOS),
    total ``logprob`` and length-penalised ``score``."""

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


class Translator:
    """Beam-search translation of raw sentences with a trained model.

    Args:
      graphdef, params: the model split by ``nnx.split(model, nnx.Param)``.
      tokenizer: the run's SentencePiece tokenizer (gives PAD/BOS/EOS ids).
      config: decoding options (beam size, α, length limits, token budget).
      max_src_len: longer sources are truncated (with a warning naming the line).
      partitioner: decode over a device mesh (``seq2seq.sharding.Partitioner``): parameters
        sharded by the rules, sentences split over ``data × fsdp`` (batches rounded up to a
        multiple of it), results replicated. None: one device.
    """

    def __init__(self, graphdef: Any, params: Any, tokenizer: Tokenizer, config: DecodeConfig,
                 max_src_len: int = 256, partitioner: Any = None):
        self.graphdef, self.params = graphdef, params
        self.tokenizer, self.config, self.max_src_len = tokenizer, config, max_src_len
        self.partitioner = partitioner
        if partitioner is not None:
            self._param_shardings = partitioner.shardings(params)
            self.params = partitioner.place(params)

    def translate(self, lines: Sequence[str], *, nbest: int = 1, progress: bool = False) -> list[
            list[Hypothesis]]:
        """Translate ``lines`` (one sentence each); returns ``nbest`` hypotheses per line, in order.

        An empty (or all-whitespace) line gives one empty hypothesis without decoding.

        Raises:
          ValueError: ``nbest`` exceeds the beam size.
        """
        cfg = self.config
        if not 1 <= nbest <= cfg.beam_size:
            raise ValueError(f"nbest={nbest} must be between 1 and the beam size {cfg.beam_size}")
        ids = self.tokenizer.encode(list(lines))
        results: list[list[Hypothesis]] = [[Hypothesis("", (), 0.0, 0.0)] for _ in lines]
        todo = []
        for i, (line, x) in enumerate(zip(lines, ids)):
            if not line.strip():
                continue
            if len(x) > self.max_src_len:
                log.warning("line %d: %d tokens, truncated to %d", i + 1, len(x), self.max_src_len)
                x = np.concatenate([x[: self.max_src_len - 1], [self.tokenizer.eos_id]])
            todo.append((len(x), i, x))
        todo.sort()
        bar = tqdm(total=len(todo), desc="translate", unit="sent", disable=not progress)
        start = 0
        while start < len(todo):
            width = bucket_length(todo[start][0], self.max_src_len)
            rows = max(1, cfg.max_tokens // width)
            if self.partitioner is not None:  # whole rows per device
                rows = -(-rows // self.partitioner.batch_shards) * self.partitioner.batch_shards
            chunk = [t for t in todo[start:start + rows] if t[0] <= width]
            start += len(chunk)
            self._decode_chunk(chunk, width, rows, nbest, results)
            bar.update(len(chunk))
        bar.close()
        return results

    def _decode_chunk(self, chunk, width, rows, nbest, results):
        cfg, tok = self.config, self.tokenizer
        src = np.full((rows, width), tok.pad_id, np.int32)
        lengths = np.zeros((rows,), np.int32)
        for r, (n, _, x) in enumerate(chunk):
            src[r, :n] = x
            lengths[r] = n
        max_len = int(cfg.max_len_a * width + cfg.max_len_b)
        max_lengths = np.minimum(np.ceil(cfg.max_len_a * lengths + cfg.max_len_b), max_len)
        inputs = (src, (src != tok.pad_id).astype(np.int32), max_lengths.astype(np.int32))
        static = dict(graphdef=self.graphdef, beam_size=cfg.beam_size, max_len=max_len,
                      alpha=cfg.alpha, bos_id=tok.bos_id, eos_id=tok.eos_id, pad_id=tok.pad_id,
                      length_penalty_kind=cfg.length_penalty)
        if self.partitioner is None:
            out = beam_search_jit(self.params, *map(jnp.asarray, inputs), **static)
        else:
            search = self.partitioner.jit_decode(beam_search_jit, self._param_shardings, **static)
            placed = self.partitioner.shard_batch(dict(enumerate(inputs)))
            out = search(self.params, tuple(placed.values()))
        tokens, lens = np.asarray(out.tokens), np.asarray(out.lengths)
        logprobs, scores = np.asarray(out.logprobs), np.asarray(out.scores)
        for r, (_, i, _) in enumerate(chunk):
            hyps = []
            for j in range(nbest):
                body = tuple(int(t) for t in tokens[r, j, : max(lens[r, j] - 1, 0)])
                hyps.append(Hypothesis(tok.decode([body])[0], body, float(logprobs[r, j]),
                                       float(scores[r, j])))
            results[i] = hyps
