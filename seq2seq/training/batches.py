"""The training data as the loop feeds it: a step's micro-batches on the host
(``train_batch``, ``HostBatch``), built ahead in a background thread (``Prefetcher``), and,
when the batching changes on resume, the data position remapped by examples
(``remap_position``)."""

from __future__ import annotations

import queue
import threading
from typing import Any

import numpy as np

from seq2seq.config import ConfigError
from seq2seq.data.batching import MixedBatches, PackedBatches


class HostBatch(dict):
    """A step's micro-batches on the host (``train_batch``), with the real tokens of the
    global batch: ``real_tokens`` (both sides) and ``target_tokens``."""

    real_tokens: int = 0
    target_tokens: int = 0


def train_batch(
    batches: PackedBatches | MixedBatches,
    first: int,
    accum: int,
    share: tuple[int, int] = (0, 1),
) -> HostBatch:
    """Micro-batches ``first .. first+accum-1`` stacked as int32 ``[accum, rows, max_len]``.

    Optimizer step k of a run that never changed ``accum`` uses ``first = k · accum``; each
    micro-batch is a function of (seed, index) alone, so resumed runs see the same data.
    ``share``: ``(index, count)`` of ``Partitioner.process_share``: only the rows this
    process feeds are laid out (``[accum, rows // count, max_len]``); the token counts are
    always the global batch's.
    """
    micro = [batches.batch_at(first + i, *share) for i in range(accum)]
    out = HostBatch({k: np.stack([m[k] for m in micro]) for k in micro[0]})
    counts = np.sum([batches.tokens_at(first + i) for i in range(accum)], axis=0)
    out.real_tokens, out.target_tokens = int(counts.sum()), int(counts[1])
    return out


class Prefetcher:
    """The host batches of the next optimizer steps, laid out by a background thread.

    Step k's batch is ``train_batch(batches, first + k·accum, accum, share)`` (a function of
    the position alone, so prefetching changes no value); at most ``depth`` batches wait in
    the queue, and ``get`` returns them in order (the loop logs the share of step time it
    spends blocked in ``get`` as ``data_wait_share``). An exception raised while laying out a
    batch is raised again by the ``get`` of that batch. ``close`` stops the thread (the loop
    uses it as a context manager).
    """

    def __init__(
        self,
        batches: PackedBatches | MixedBatches,
        first: int,
        accum: int,
        share: tuple[int, int] = (0, 1),
        depth: int = 2,
    ):
        self._next = first
        self._accum = accum
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._work, args=(batches, first, accum, share), name="batches", daemon=True
        )
        self._thread.start()

    def _work(self, batches, position: int, accum: int, share: tuple[int, int]) -> None:
        while not self._stop.is_set():
            try:
                item: Any = train_batch(batches, position, accum, share)
            except BaseException as e:  # handed to the consumer
                item = e
            while not self._stop.is_set():
                try:
                    self._queue.put((position, item), timeout=0.1)
                    break
                except queue.Full:
                    continue
            if isinstance(item, BaseException):
                return
            position += accum

    def get(self) -> HostBatch:
        """The next step's batch (blocks until the thread has laid it out)."""
        position, item = self._queue.get()
        if isinstance(item, BaseException):
            raise item
        assert position == self._next, (position, self._next)
        self._next += self._accum
        return item

    def close(self) -> None:
        self._stop.set()
        self._thread.join()

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def remap_position(batches: PackedBatches | MixedBatches, position: int, old: Any) -> int:
    """The micro-batch of ``batches`` that starts where ``position`` micro-batches of the old
    batching (``old``: a ``DataConfig`` with ``max_len``, ``max_tokens``, ``packing``) ended.

    Epoch e shuffles the pairs with ``(seed, e)`` whatever the batching, so the same epoch is
    resumed at the first batch after the same share of its pairs (pairs longer than the old
    ``max_len`` are left out of the old view: the old run dropped them).

    Raises:
      ConfigError: several training corpora (their positions cannot be remapped).
    """
    if isinstance(batches, MixedBatches):
        raise ConfigError(
            "data.max_tokens, data.max_len and data.packing cannot change on resume with "
            "several training corpora (data.train is a list): resume with the saved values"
        )
    keep = np.flatnonzero(
        (batches.src_lengths <= old.max_len) & (batches.tgt_lengths <= old.max_len)
    )
    before = PackedBatches(
        batches.src.select(keep),
        batches.tgt.select(keep),
        max_len=old.max_len,
        rows=old.max_tokens // old.max_len,
        seed=batches.seed,
        packing=old.packing,
    )
    epoch, index = before.locate(position)
    rows = before.epoch_packing(epoch)
    share = int(rows.offsets[min(index * before.rows, len(rows))]) / max(len(keep), 1)
    seen = share * len(batches.src)  # pairs of this epoch already trained on, in the new view
    pairs = batches.epoch_packing(epoch).offsets[1:]  # pairs in the first k+1 rows
    rows_seen = int(np.searchsorted(pairs, seen - 1e-6)) + 1 if seen > 0 else 0
    start = sum(batches.batches_in_epoch(e) for e in range(epoch))
    return start + min(-(-rows_seen // batches.rows), batches.batches_in_epoch(epoch))
