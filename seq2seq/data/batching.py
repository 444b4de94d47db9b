"""Token-budget batches of packed rows with segment ids, in a reproducible order.

Every batch has the same shape ``[rows, max_len]`` (``rows = max_tokens // max_len``), so the
train step compiles once. Several sentence pairs share a row ("packing", as in T5): each pair
gets its own segment id (1, 2, ...; 0 = padding) and positions restarting at 0, and the model's
masks keep attention inside a segment. Tatoeba pairs average ~10 subword tokens, so packing
raises the share of real tokens from ~30% (one pair per 32-token row) to over 90%.

The batch at step ``k`` is a function of ``(seed, k)`` alone: epoch ``e`` shuffles the pairs
with ``default_rng((seed, e))`` and packs them greedily, so a resumed run sees exactly the
batches an uninterrupted run would have seen, with no iterator state to checkpoint. With
several processes (hosts), process ``i`` of ``n`` lays out only rows
``[i·rows/n, (i+1)·rows/n)`` of each global batch: the shares are disjoint and together are
exactly the global batch.

We do not use ``grain``: its packing (``FirstFitPackIterDataset``) is an iterator whose
position must be checkpointed and restored, whereas ``batch_at(step)`` needs nothing but the
step already in the checkpoint and random access to any step, without a new dependency.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

Batch = dict[str, np.ndarray]
FIELDS = ("src", "src_segments", "src_positions", "tgt", "tgt_segments", "tgt_positions")


def pack(
    src_lengths: np.ndarray,
    tgt_lengths: np.ndarray,
    order: np.ndarray,
    max_len: int,
    *,
    packing: bool = True,
    window: int = 16,
) -> list[list[int]]:
    """Group pairs into rows whose source and target each fit in ``max_len`` tokens.

    First-fit over a window of open rows: each pair goes into the first open row with room on
    both sides; when ``window`` rows are open the oldest is closed.

    Args:
      src_lengths / tgt_lengths: int ``[num_pairs]`` token counts (each ≤ max_len).
      order: the pair indices in the order to place them.
      max_len: row length in tokens.
      packing: if False every pair gets its own row.
      window: open rows searched per pair.

    Returns:
      rows, each a list of pair indices in placement order.

    Raises:
      ValueError: a pair is longer than ``max_len`` (filter or truncate first).
    """
    if len(order) and max(src_lengths[order].max(), tgt_lengths[order].max()) > max_len:
        raise ValueError(f"a pair is longer than max_len={max_len}; filter or truncate first")
    if not packing:
        return [[int(i)] for i in order]
    rows: list[list[int]] = []
    open_rows: list[list] = []  # [src_room, tgt_room, members]
    for i in order.tolist():
        a, b = int(src_lengths[i]), int(tgt_lengths[i])
        for row in open_rows:
            if row[0] >= a and row[1] >= b:
                row[0] -= a
                row[1] -= b
                row[2].append(i)
                break
        else:
            if len(open_rows) == window:
                rows.append(open_rows.pop(0)[2])
            open_rows.append([max_len - a, max_len - b, [i]])
    rows.extend(row[2] for row in open_rows)
    return rows


def make_batch(
    rows: Sequence[Sequence[int]],
    src: Sequence[np.ndarray],
    tgt: Sequence[np.ndarray],
    num_rows: int,
    max_len: int,
) -> Batch:
    """Lay out packed rows as int32 arrays ``[num_rows, max_len]`` (missing rows are padding).

    Returns a dict with ``src``, ``src_segments``, ``src_positions``, ``tgt``, ``tgt_segments``,
    ``tgt_positions``; segment ids count from 1 within each row, 0 = padding.
    """
    out = {k: np.zeros((num_rows, max_len), np.int32) for k in FIELDS}
    for r, members in enumerate(rows):
        for side, seqs in (("src", src), ("tgt", tgt)):
            pos = 0
            for seg, i in enumerate(members, start=1):
                ids = seqs[i]
                n = len(ids)
                out[side][r, pos : pos + n] = ids
                out[f"{side}_segments"][r, pos : pos + n] = seg
                out[f"{side}_positions"][r, pos : pos + n] = np.arange(n)
                pos += n
    return out


def real_token_share(batch: Batch) -> float:
    """Share of non-padding tokens over both sides of a batch, in [0, 1]."""
    real = (batch["src_segments"] > 0).sum() + (batch["tgt_segments"] > 0).sum()
    return float(real) / (batch["src"].size + batch["tgt"].size)


class PackedBatches:
    """Deterministic, endlessly repeating packed training batches.

    Args:
      src, tgt: token ids per pair (int32 arrays ending in EOS, each ≤ ``max_len``).
      max_len: row length in tokens.
      rows: rows per batch (``max_tokens // max_len``).
      seed: shuffling seed; epoch ``e`` uses ``default_rng((seed, e))``.
      packing: pack several pairs per row.
      shuffle: shuffle each epoch (False: corpus order, for evaluation).

    Raises:
      ValueError: no pairs, or a pair longer than ``max_len``.
    """

    def __init__(
        self,
        src: Sequence[np.ndarray],
        tgt: Sequence[np.ndarray],
        *,
        max_len: int,
        rows: int,
        seed: int = 0,
        packing: bool = True,
        shuffle: bool = True,
    ):
        if len(src) == 0 or len(src) != len(tgt):
            raise ValueError(
                f"need equally many (>0) sources and targets, got {len(src)}, {len(tgt)}"
            )
        self.src, self.tgt = src, tgt
        self.src_lengths = np.array([len(x) for x in src])
        self.tgt_lengths = np.array([len(x) for x in tgt])
        self.max_len, self.rows, self.seed = max_len, rows, seed
        self.packing, self.shuffle = packing, shuffle
        self._epoch_rows: dict[int, list[list[int]]] = {}
        self._epoch_sizes: list[int] = []

    def epoch_rows(self, epoch: int) -> list[list[int]]:
        """Packed rows of one epoch (the two most recently packed epochs are memoised)."""
        if epoch not in self._epoch_rows:
            n = len(self.src)
            order = (
                np.random.default_rng((self.seed, epoch)).permutation(n)
                if self.shuffle
                else np.arange(n)
            )
            self._epoch_rows[epoch] = pack(
                self.src_lengths, self.tgt_lengths, order, self.max_len, packing=self.packing
            )
            while len(self._epoch_rows) > 2:  # dicts keep insertion order: drop the oldest
                del self._epoch_rows[next(iter(self._epoch_rows))]
        return self._epoch_rows[epoch]

    def batches_in_epoch(self, epoch: int) -> int:
        """Number of batches in ``epoch`` (the last one may be partly padding rows)."""
        while len(self._epoch_sizes) <= epoch:
            rows = self.epoch_rows(len(self._epoch_sizes))
            self._epoch_sizes.append(-(-len(rows) // self.rows))
        return self._epoch_sizes[epoch]

    def locate(self, step: int) -> tuple[int, int]:
        """(epoch, batch index within the epoch) of global ``step`` (0-based)."""
        epoch = 0
        while step >= self.batches_in_epoch(epoch):
            step -= self.batches_in_epoch(epoch)
            epoch += 1
        return epoch, step

    def batch_at(self, step: int, process_index: int = 0, process_count: int = 1) -> Batch:
        """The batch used at ``step`` (0-based): a function of (seed, step) alone.

        Args:
          step: global training step.
          process_index / process_count: this process's place among the processes that share
            each global batch (``jax.process_index()`` / ``jax.process_count()``).

        Returns:
          This process's contiguous share of the global batch: int32 arrays
          ``[rows // process_count, max_len]`` holding global rows
          ``[process_index · rows/process_count, (process_index + 1) · rows/process_count)``
          (the whole batch for one process). Only those rows are laid out.

        Raises:
          ValueError: ``rows`` is not divisible by ``process_count``, or ``process_index`` is
            outside ``[0, process_count)``.
        """
        if process_count < 1 or not 0 <= process_index < process_count:
            raise ValueError(
                f"process_index={process_index} must be in [0, process_count={process_count})"
            )
        if self.rows % process_count:
            raise ValueError(
                f"{self.rows} rows per batch cannot be split evenly over "
                f"{process_count} processes; choose data.max_tokens so that "
                "max_tokens // max_len is a multiple of the process count"
            )
        share = self.rows // process_count
        epoch, index = self.locate(step)
        first = index * self.rows + process_index * share
        rows = self.epoch_rows(epoch)[first : first + share]
        return make_batch(rows, self.src, self.tgt, share, self.max_len)

    def real_token_share(self, epoch: int = 0) -> float:
        """Share of real (non-padding) tokens over all batches of ``epoch``, both sides, in [0, 1].

        Computed from the packed lengths, without laying out the batches; the epoch's last,
        partly filled batch counts with its padding rows.
        """
        real = self.src_lengths.sum() + self.tgt_lengths.sum()
        return float(real) / (2 * self.batches_in_epoch(epoch) * self.rows * self.max_len)

    def epoch(self, epoch: int = 0) -> Iterator[Batch]:
        """All batches of one epoch, in order (used for evaluation)."""
        for index in range(self.batches_in_epoch(epoch)):
            rows = self.epoch_rows(epoch)[index * self.rows : (index + 1) * self.rows]
            yield make_batch(rows, self.src, self.tgt, self.rows, self.max_len)


# Batches per block of the mixture schedule, and the stream tag of its within-block shuffles.
MIX_BLOCK = 100
_MIX_STREAM = 0x6D6978


class MixedBatches:
    """Batches drawn from several corpora with sampling weights, in a reproducible order.

    Batch ``k`` comes from corpus ``c_k``: the corpus counts are those of the largest-deficit
    rule (``c_t = argmax_c (w_c·(t+1) - n_c(t))``, ties to the lower index, so after any
    ``T`` batches each corpus has had ``w_c·T`` batches to within one), shuffled within
    blocks of ``MIX_BLOCK`` batches with ``default_rng((seed, _MIX_STREAM, block))``. Corpus
    ``c`` serves its own batches in order (``PackedBatches.batch_at(j)`` for its j-th turn),
    so batch k is a function of (seed, k) alone, like ``PackedBatches``.

    Args:
      corpora: one ``PackedBatches`` per corpus (equal ``rows`` and ``max_len``).
      weights: sampling weights, ≥ 0 with a positive sum (normalised here).
      seed: the shuffling seed (``train.seed``).

    Raises:
      ValueError: no corpora, weights of another length, a negative or non-finite weight, a
        sum that is not positive, or corpora with different batch shapes.
    """

    def __init__(self, corpora: Sequence[PackedBatches], weights: Sequence[float], *, seed: int):
        w = np.asarray(list(weights), np.float64)
        if not corpora or len(w) != len(corpora):
            raise ValueError(f"need one weight per corpus, got {len(w)} for {len(corpora)}")
        if not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
            raise ValueError(f"corpus weights must be >= 0 with a positive sum, got {list(w)}")
        if len({(c.rows, c.max_len) for c in corpora}) != 1:
            raise ValueError("all corpora must have the same rows and max_len per batch")
        self.corpora, self.weights, self.seed = list(corpora), w / w.sum(), seed
        self.rows, self.max_len = corpora[0].rows, corpora[0].max_len
        # _starts[b]: int64 [corpora] batches each corpus served before block b
        self._starts = [np.zeros(len(corpora), np.int64)]
        self._orders: dict[int, np.ndarray] = {}

    def _block(self, block: int) -> tuple[np.ndarray, np.ndarray]:
        """(corpus of each batch of ``block``, int ``[MIX_BLOCK]``; counts before it)."""
        while len(self._starts) <= block + 1:
            b = len(self._starts) - 1
            counts = self._starts[b].copy()
            for t in range(b * MIX_BLOCK, (b + 1) * MIX_BLOCK):
                counts[int(np.argmax(self.weights * (t + 1) - counts))] += 1
            self._starts.append(counts)
        if block not in self._orders:
            per = self._starts[block + 1] - self._starts[block]
            order = np.repeat(np.arange(len(self.corpora)), per)
            rng = np.random.default_rng((self.seed, _MIX_STREAM, block))
            self._orders[block] = rng.permutation(order)
            while len(self._orders) > 4:  # keep the newest few blocks
                del self._orders[next(iter(self._orders))]
        return self._orders[block], self._starts[block]

    def corpus_at(self, step: int) -> tuple[int, int]:
        """(corpus index, that corpus's own batch index) of global batch ``step``."""
        block, i = divmod(step, MIX_BLOCK)
        order, start = self._block(block)
        corpus = int(order[i])
        return corpus, int(start[corpus] + np.sum(order[:i] == corpus))

    def counts(self, n: int) -> np.ndarray:
        """int64 ``[corpora]``: batches each corpus served among the first ``n``."""
        block, i = divmod(n, MIX_BLOCK)
        order, start = self._block(block)
        return start + np.bincount(order[:i], minlength=len(self.corpora))

    def batch_at(self, step: int, process_index: int = 0, process_count: int = 1) -> Batch:
        """The batch used at ``step``, as ``PackedBatches.batch_at`` (same shape and split)."""
        corpus, index = self.corpus_at(step)
        return self.corpora[corpus].batch_at(index, process_index, process_count)

    def locate(self, step: int) -> tuple[int, int]:
        """(epoch, batch within the epoch) of the corpus that batch ``step`` comes from."""
        corpus, index = self.corpus_at(step)
        return self.corpora[corpus].locate(index)

    def batches_in_epoch(self, epoch: int) -> int:
        """Batches in ``epoch`` of all corpora together (for messages)."""
        return sum(c.batches_in_epoch(epoch) for c in self.corpora)

    def real_token_share(self, epoch: int = 0) -> float:
        """The corpora's real-token shares of ``epoch``, weighted by the sampling weights."""
        return float(sum(w * c.real_token_share(epoch) for w, c in zip(self.weights, self.corpora)))
