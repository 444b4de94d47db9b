"""Pseudo-documents: consecutive sentence pairs concatenated into long pairs (long inputs).

Tatoeba holds single sentences; ``data.concat_pairs_to_tokens`` joins runs of consecutive
training pairs into one source/target pair of up to that many tokens per side, so a model can
be trained and measured on inputs of 1,000-2,000 tokens (``model.attention=chunked``,
``configs/tatoeba_long.yaml``). A pair is never split, and the i-th document's target is the
translation of exactly the i-th document's source (the same pairs, in order).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def document_groups(
    src_lengths: Sequence[int], tgt_lengths: Sequence[int], max_tokens: int
) -> list[list[int]]:
    """Greedy runs of consecutive pairs whose joined length stays within ``max_tokens``.

    Joining drops every EOS but the last, so a run of pairs with lengths l_1..l_k (EOS
    included) is Σ l_i − (k − 1) tokens long. A run grows while both sides fit; a pair longer
    than ``max_tokens`` on its own forms a run of one.

    Args:
      src_lengths / tgt_lengths: tokens per pair and side, EOS included (same count).
      max_tokens: the limit per side (≥ 1).

    Returns:
      Index runs ``[[0, 1, 2], [3, 4], ...]`` covering ``0 .. n-1`` in order.

    Raises:
      ValueError: the two sides differ in count, or ``max_tokens`` < 1.
    """
    if len(src_lengths) != len(tgt_lengths):
        raise ValueError(f"{len(src_lengths)} sources but {len(tgt_lengths)} targets")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    groups: list[list[int]] = []
    src_total = tgt_total = 0
    for i, (s, t) in enumerate(zip(src_lengths, tgt_lengths)):
        if groups and src_total + s - 1 <= max_tokens and tgt_total + t - 1 <= max_tokens:
            groups[-1].append(i)
            src_total += s - 1
            tgt_total += t - 1
        else:
            groups.append([i])
            src_total, tgt_total = s, t
    return groups


def concat_pairs(
    src: Sequence[np.ndarray], tgt: Sequence[np.ndarray], max_tokens: int, eos_id: int
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Consecutive pairs joined into documents of at most ``max_tokens`` tokens per side.

    Args:
      src / tgt: int32 token ids per pair, each ending in ``eos_id``.
      max_tokens: the limit per side (see ``document_groups``).
      eos_id: the EOS id; inner EOS tokens are dropped, each document ends in one.

    Returns:
      ``(sources, targets)``: int32 arrays, one per document.
    """
    groups = document_groups([len(x) for x in src], [len(y) for y in tgt], max_tokens)

    def join(side: Sequence[np.ndarray], group: list[int]) -> np.ndarray:
        body = [side[i][:-1] for i in group]
        return np.concatenate([*body, [eos_id]]).astype(np.int32)

    return [join(src, g) for g in groups], [join(tgt, g) for g in groups]
