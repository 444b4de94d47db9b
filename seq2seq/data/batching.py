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

import json
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from seq2seq.data.token_cache import TokenIds

Batch = dict[str, np.ndarray]
FIELDS = ("src", "src_segments", "src_positions", "tgt", "tgt_segments", "tgt_positions")


def batch_rows(config) -> int:
    """Rows of every batch of a ``DataConfig``: ``max_tokens // max_len``, at least 1."""
    return max(1, config.max_tokens // config.max_len)


class Rows:
    """Packed rows as flat arrays: row ``r`` holds pairs ``members[offsets[r]:offsets[r + 1]]``
    (int32/int64 pair indices in placement order; ``offsets`` int64 ``[rows + 1]``)."""

    def __init__(self, members: np.ndarray, offsets: np.ndarray):
        self.members, self.offsets = members, offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, rows: slice) -> Rows:
        """Rows ``rows`` (a slice with step 1)."""
        first, stop, _ = rows.indices(len(self))
        stop = max(first, stop)
        offsets = self.offsets[first : stop + 1]
        return Rows(self.members[offsets[0] : offsets[-1]], offsets - offsets[0])

    def sizes(self) -> np.ndarray:
        """int64 ``[rows]``: pairs per row."""
        return np.diff(self.offsets)

    def to_lists(self) -> list[list[int]]:
        """One list of pair indices per row."""
        m = self.members.tolist()
        o = self.offsets.tolist()
        return [m[a:b] for a, b in zip(o[:-1], o[1:])]

    @classmethod
    def from_lists(cls, rows: Sequence[Sequence[int]]) -> Rows:
        sizes = np.fromiter(map(len, rows), np.int64, len(rows))
        offsets = np.zeros(len(rows) + 1, np.int64)
        np.cumsum(sizes, out=offsets[1:])
        members = np.fromiter((i for r in rows for i in r), np.int64, int(offsets[-1]))
        return cls(members, offsets)


def pack_rows(
    src_lengths: np.ndarray,
    tgt_lengths: np.ndarray,
    order: np.ndarray,
    max_len: int,
    *,
    packing: bool = True,
    window: int = 16,
) -> Rows:
    """Group pairs into rows whose source and target each fit in ``max_len`` tokens.

    First-fit over a window of open rows: each pair goes into the first open row with room on
    both sides; when ``window`` rows are open the oldest is closed. Rows come in the order
    they are closed (the open ones at the end, oldest first).

    Args:
      src_lengths / tgt_lengths: int ``[num_pairs]`` token counts (each ≤ max_len).
      order: the pair indices in the order to place them.
      max_len: row length in tokens.
      packing: if False every pair gets its own row.
      window: open rows searched per pair.

    Returns:
      the rows as flat arrays (``Rows``); no Python object per pair or row is kept.

    Raises:
      ValueError: a pair is longer than ``max_len`` (filter or truncate first).
    """
    order = np.asarray(order, np.int64)
    if len(order) and max(src_lengths[order].max(), tgt_lengths[order].max()) > max_len:
        raise ValueError(f"a pair is longer than max_len={max_len}; filter or truncate first")
    if not packing:
        return Rows(order, np.arange(len(order) + 1, dtype=np.int64))
    placed = np.empty(len(order), np.int64)  # the (provisional) row of each placed pair
    closed: list[int] = []  # provisional rows in closing order
    open_rows: list[list[int]] = []  # [src_room, tgt_room, provisional row]
    opened = 0
    pairs = zip(src_lengths[order].tolist(), tgt_lengths[order].tolist())
    for k, (a, b) in enumerate(pairs):
        for row in open_rows:
            if row[0] >= a and row[1] >= b:
                row[0] -= a
                row[1] -= b
                placed[k] = row[2]
                break
        else:
            if len(open_rows) == window:
                closed.append(open_rows.pop(0)[2])
            open_rows.append([max_len - a, max_len - b, opened])
            placed[k] = opened
            opened += 1
    closed.extend(row[2] for row in open_rows)
    rank = np.empty(opened, np.int64)
    rank[np.asarray(closed, np.int64)] = np.arange(opened)
    row_of = rank[placed]
    members = order[np.argsort(row_of, kind="stable")]  # stable: placement order within rows
    if len(members) < 2**31:
        members = members.astype(np.int32)  # half the memory of the epoch's packing
    offsets = np.zeros(opened + 1, np.int64)
    np.cumsum(np.bincount(row_of, minlength=opened), out=offsets[1:])
    return Rows(members, offsets)


def pack(
    src_lengths: np.ndarray,
    tgt_lengths: np.ndarray,
    order: np.ndarray,
    max_len: int,
    *,
    packing: bool = True,
    window: int = 16,
) -> list[list[int]]:
    """``pack_rows`` as one list of pair indices per row (for tests and small inputs)."""
    return pack_rows(
        src_lengths, tgt_lengths, order, max_len, packing=packing, window=window
    ).to_lists()


def make_batch(
    rows: Rows | Sequence[Sequence[int]],
    src: TokenIds | Sequence[np.ndarray],
    tgt: TokenIds | Sequence[np.ndarray],
    num_rows: int,
    max_len: int,
) -> Batch:
    """Lay out packed rows as int32 arrays ``[num_rows, max_len]`` (missing rows are padding).

    ``rows``: ``Rows`` or one list of pair indices per row; ``src`` / ``tgt``: the pairs' ids
    (``TokenIds``, or one int array per pair). Vectorised over the batch's tokens.

    Returns a dict with ``src``, ``src_segments``, ``src_positions``, ``tgt``, ``tgt_segments``,
    ``tgt_positions``; segment ids count from 1 within each row, 0 = padding.
    """
    if not isinstance(rows, Rows):
        rows = Rows.from_lists(rows)
    out = {k: np.zeros((num_rows, max_len), np.int32) for k in FIELDS}
    members, offsets = rows.members, rows.offsets
    if len(members) == 0:
        return out
    sizes = np.diff(offsets)
    row_of = np.repeat(np.arange(len(sizes)), sizes)  # [pairs] the row of each member
    segment = np.arange(len(members)) - np.repeat(offsets[:-1], sizes) + 1
    for side, seqs in (("src", src), ("tgt", tgt)):
        if isinstance(seqs, TokenIds):
            ids, which = seqs, members
        else:  # a list: only the members' sequences are flattened
            ids, which = TokenIds.from_list([seqs[i] for i in members]), np.arange(len(members))
        lengths = ids.lengths[which]
        begin = np.cumsum(lengths) - lengths  # each member's start in the concatenation
        column0 = begin - begin[offsets[:-1]][row_of]  # its first column in its row
        token_row = np.repeat(row_of, lengths)
        position = np.arange(int(lengths.sum())) - np.repeat(begin, lengths)
        column = np.repeat(column0, lengths) + position
        out[side][token_row, column] = ids.gather(which)
        out[f"{side}_segments"][token_row, column] = np.repeat(segment, lengths)
        out[f"{side}_positions"][token_row, column] = position
    return out


def real_token_share(batch: Batch) -> float:
    """Share of non-padding tokens over both sides of a batch, in [0, 1]."""
    real = (batch["src_segments"] > 0).sum() + (batch["tgt_segments"] > 0).sum()
    return float(real) / (batch["src"].size + batch["tgt"].size)


class PackedBatches:
    """Deterministic, endlessly repeating packed training batches.

    Args:
      src, tgt: token ids per pair (``TokenIds``, or one int32 array per pair; each ending
        in EOS and ≤ ``max_len``).
      max_len: row length in tokens.
      rows: rows per batch (``max_tokens // max_len``).
      seed: shuffling seed; epoch ``e`` uses ``default_rng((seed, e))``.
      packing: pack several pairs per row.
      shuffle: shuffle each epoch (False: corpus order, for evaluation).
      sizes_file: a JSON file that keeps the batch count of every epoch packed so far (for
        these pairs and settings: the caller names it by them), so that locating a step in
        a late epoch does not pack every earlier epoch again; None: not kept.

    Raises:
      ValueError: no pairs, or a pair longer than ``max_len``.
    """

    def __init__(
        self,
        src: TokenIds | Sequence[np.ndarray],
        tgt: TokenIds | Sequence[np.ndarray],
        *,
        max_len: int,
        rows: int,
        seed: int = 0,
        packing: bool = True,
        shuffle: bool = True,
        sizes_file: str | Path | None = None,
    ):
        if len(src) == 0 or len(src) != len(tgt):
            raise ValueError(
                f"need equally many (>0) sources and targets, got {len(src)}, {len(tgt)}"
            )
        self.src, self.tgt = TokenIds.from_list(src), TokenIds.from_list(tgt)
        self.src_lengths, self.tgt_lengths = self.src.lengths, self.tgt.lengths
        self.max_len, self.rows, self.seed = max_len, rows, seed
        self.packing, self.shuffle = packing, shuffle
        self._epoch_rows: dict[int, Rows] = {}
        # the loop's batch thread and the main thread (checkpoint metadata) share the memos
        self._lock = threading.RLock()
        self._sizes_file = Path(sizes_file) if sizes_file is not None else None
        self._epoch_sizes: list[int] = self._read_sizes()

    def _read_sizes(self) -> list[int]:
        if self._sizes_file is None or not self._sizes_file.is_file():
            return []
        try:
            sizes = json.loads(self._sizes_file.read_text())
        except (OSError, ValueError):
            return []
        ok = isinstance(sizes, list) and all(isinstance(n, int) and n > 0 for n in sizes)
        return sizes if ok else []

    def _write_sizes(self) -> None:
        if self._sizes_file is None:
            return
        path = self._sizes_file
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # processes may share it
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(self._epoch_sizes))
            tmp.replace(path)
        except OSError:
            pass  # only a speed-up: recomputed next time

    def epoch_packing(self, epoch: int) -> Rows:
        """Packed rows of one epoch (the two most recently packed epochs are memoised)."""
        with self._lock:
            return self._epoch_packing(epoch)

    def _epoch_packing(self, epoch: int) -> Rows:
        if epoch not in self._epoch_rows:
            n = len(self.src)
            order = (
                np.random.default_rng((self.seed, epoch)).permutation(n)
                if self.shuffle
                else np.arange(n)
            )
            self._epoch_rows[epoch] = pack_rows(
                self.src_lengths, self.tgt_lengths, order, self.max_len, packing=self.packing
            )
            while len(self._epoch_rows) > 2:  # dicts keep insertion order: drop the oldest
                del self._epoch_rows[next(iter(self._epoch_rows))]
        return self._epoch_rows[epoch]

    def epoch_rows(self, epoch: int) -> list[list[int]]:
        """Packed rows of one epoch as lists of pair indices (for tests and tools)."""
        return self.epoch_packing(epoch).to_lists()

    def batches_in_epoch(self, epoch: int) -> int:
        """Number of batches in ``epoch`` (the last one may be partly padding rows)."""
        with self._lock:
            if len(self._epoch_sizes) <= epoch:
                while len(self._epoch_sizes) <= epoch:
                    rows = self._epoch_packing(len(self._epoch_sizes))
                    self._epoch_sizes.append(-(-len(rows) // self.rows))
                self._write_sizes()
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
        rows = self.epoch_packing(epoch)[first : first + share]
        return make_batch(rows, self.src, self.tgt, share, self.max_len)

    def tokens_at(self, step: int) -> np.ndarray:
        """int64 ``[2]``: the real (source, target) tokens of the global batch at ``step``,
        from the packed lengths (nothing laid out)."""
        epoch, index = self.locate(step)
        members = self.epoch_packing(epoch)[index * self.rows : (index + 1) * self.rows].members
        return np.array([self.src_lengths[members].sum(), self.tgt_lengths[members].sum()])

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
            rows = self.epoch_packing(epoch)[index * self.rows : (index + 1) * self.rows]
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
        self._lock = threading.Lock()  # see PackedBatches

    def _block(self, block: int) -> tuple[np.ndarray, np.ndarray]:
        """(corpus of each batch of ``block``, int ``[MIX_BLOCK]``; counts before it)."""
        with self._lock:
            return self._block_locked(block)

    def _block_locked(self, block: int) -> tuple[np.ndarray, np.ndarray]:
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

    def tokens_at(self, step: int) -> np.ndarray:
        """The real (source, target) tokens of batch ``step``, see ``PackedBatches``."""
        corpus, index = self.corpus_at(step)
        return self.corpora[corpus].tokens_at(index)

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
