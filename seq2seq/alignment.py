"""Cross-attention of translations, and the word alignments read from it.

A hypothesis is teacher-forced through the model once more with the attention weights returned
(``Transformer.attention_weights``): row ``t`` of the cross-attention is the decoder position
that predicts target token ``t`` (its input is token ``t - 1``, BOS for ``t = 0``), the
attention the search used when it chose that token. Both sides are SentencePiece pieces, EOS
included; the hard alignment links each target piece (EOS excluded) to the source piece (EOS
excluded) with the largest weight averaged over layers and heads, written in the Pharaoh
``i-j`` format (source index - target index, from 0) that fast_align and Moses read.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from flax import nnx

from seq2seq.data.batching import make_batch
from seq2seq.data.tokenizer import TokenizerPair
from seq2seq.decoding import ensemble_size
from seq2seq.translation import Translator, bucket_length


@dataclass(frozen=True)
class Attention:
    """The cross-attention of one (source, hypothesis) pair.

    Attributes:
      source: source pieces, EOS (``</s>``) last; ``S`` of them.
      target: hypothesis pieces, EOS last; ``T`` of them.
      weights: float32 ``[layers, heads, T, S]``; each row a softmax over the source pieces.
    """

    source: tuple[str, ...]
    target: tuple[str, ...]
    weights: np.ndarray

    def mean(self) -> np.ndarray:
        """float32 ``[T, S]``: the weights averaged over layers and heads."""
        return self.weights.mean(axis=(0, 1))

    def hard(self) -> list[tuple[int, int]]:
        """``(source index, target index)`` links: each target piece but EOS to the source
        piece but EOS with the largest mean weight (none for an empty side)."""
        mean = self.mean()[:-1, :-1]  # [T - 1, S - 1]: without the EOS row and column
        if mean.size == 0:
            return []
        return [(int(i), j) for j, i in enumerate(mean.argmax(axis=1))]


def pharaoh(links: Sequence[tuple[int, int]]) -> str:
    """``"0-0 1-2 ..."``: links as Pharaoh ``i-j`` pairs (source index - target index)."""
    return " ".join(f"{i}-{j}" for i, j in links)


@functools.partial(jax.jit, static_argnames=("graphdef", "bos_id"))
def _cross_attention(params, batch, *, graphdef, bos_id):
    model = nnx.merge(graphdef, params)
    return model.attention_weights(batch, bos_id=bos_id)["cross"]


def cross_attention(
    translator: Translator, sources: Sequence[str], targets: Sequence[Sequence[int]]
) -> list[Attention]:
    """Teacher-force each ``targets[k]`` (hypothesis ids without EOS, e.g.
    ``Hypothesis.tokens``) after ``sources[k]`` through ``translator``'s model, one batch.

    The source is tokenized and truncated as ``translator.translate`` does (its first
    ``max_src_len - 1`` pieces and EOS). Pairs are padded to a width of ``BUCKETS`` and a
    power-of-two row count, so few shapes are compiled.

    Returns:
      One ``Attention`` per pair, in order.

    Raises:
      ValueError: ``sources`` and ``targets`` differ in length.
    """
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} sources but {len(targets)} targets")
    if (models := ensemble_size(translator.graphdef)) > 1:
        raise ValueError(
            f"the attention of an ensemble ({models} models) is not defined: "
            "give one run (one --workdir and --step)"
        )
    if not sources:
        return []
    tok = translator.tokenizer
    sides = (tok.source, tok.target) if isinstance(tok, TokenizerPair) else (tok, tok)
    src_side, tgt_side = sides
    src = []
    for x in tok.encode(list(sources)):
        if len(x) > translator.max_src_len:
            x = np.append(x[: translator.max_src_len - 1], tok.eos_id).astype(np.int32)
        src.append(x)
    tgt = [np.append(np.asarray(t, np.int32), tok.eos_id).astype(np.int32) for t in targets]
    longest = max(max(len(x) for x in src), max(len(y) for y in tgt))
    width = bucket_length(longest, max(longest, 512))
    rows = 1 << (len(src) - 1).bit_length()
    batch = make_batch([[k] for k in range(len(src))], src, tgt, rows, width)
    cross = np.asarray(
        _cross_attention(
            translator.params,
            {k: jax.numpy.asarray(v) for k, v in batch.items()},
            graphdef=translator.graphdef,
            bos_id=tok.bos_id,
        ),
        np.float32,
    )  # [layers, rows, heads, width, width]
    return [
        Attention(
            tuple(src_side.id_to_piece(int(t)) for t in x),
            tuple(tgt_side.id_to_piece(int(t)) for t in y),
            cross[:, k, :, : len(y), : len(x)],
        )
        for k, (x, y) in enumerate(zip(src, tgt))
    ]


ALIGNMENT_KINDS = ("hard", "soft")


def alignment_lines(
    translator: Translator,
    sources: Sequence[str],
    hypotheses: Sequence[Sequence[Any]],
    kind: str,
    *,
    chunk: int = 64,
) -> list[str]:
    """One line per hypothesis, in order (line by line, best first), for
    ``seq2seq-translate --alignments``.

    Args:
      sources: the input lines.
      hypotheses: ``Translator.translate``'s result for them (``Hypothesis`` lists).
      kind: ``hard``: Pharaoh ``i-j`` pairs over pieces (see ``Attention.hard``); ``soft``: a
        JSON object with ``line``, ``source`` and ``target`` pieces (EOS last) and
        ``attention``, the ``[T][S]`` weights averaged over layers and heads.
      chunk: pairs per teacher-forced batch.

    Raises:
      ValueError: an unknown ``kind``.
    """
    if kind not in ALIGNMENT_KINDS:
        raise ValueError(f"alignments must be one of {', '.join(ALIGNMENT_KINDS)}, got {kind!r}")
    pairs = [(i, sources[i], h) for i, hyps in enumerate(hypotheses) for h in hyps]
    out = []
    for start in range(0, len(pairs), chunk):
        part = pairs[start : start + chunk]
        found = cross_attention(translator, [p[1] for p in part], [p[2].tokens for p in part])
        for (i, _, _), a in zip(part, found):
            if kind == "hard":
                out.append(pharaoh(a.hard()))
            else:
                record = {
                    "line": i,
                    "source": list(a.source),
                    "target": list(a.target),
                    "attention": a.mean().astype(np.float64).round(5).tolist(),
                }
                out.append(json.dumps(record, ensure_ascii=False))
    return out
