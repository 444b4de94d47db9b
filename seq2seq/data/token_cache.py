"""The token store: each split side's ids written once as flat arrays, memory-mapped on reading.

One store per split and side in the cache directory (``{workdir}/tokens/``), three files
named ``{name}.{key}.*`` (e.g. ``train.source.3f2a….ids``):

* ``.ids``: every sentence's ids concatenated, raw ``uint16`` when the vocabulary has at most
  65,536 pieces, else ``int32`` (native byte order);
* ``.offsets``: raw int64 ``[n + 1]``; sentence ``i`` is ``ids[offsets[i]:offsets[i + 1]]``;
* ``.json``: format version, dtype, counts and whatever the caller stores with it (``meta``);
  written last, so a store without it is incomplete and never read.

Readers map ``.ids`` and ``.offsets`` with ``np.memmap``: every process of a host shares the
same pages through the page cache, and nothing per sentence is ever a Python object
(``TokenIds`` indexes the flat arrays). ``key`` is a SHA-256 of the sentences (or of a
fingerprint of the files they come from, see ``file_fingerprint``) and of the tokenizer
model's bytes, so changed text or a retrained model is tokenized again; older stores of the
same name are then removed. A store that cannot be read is tokenized again (with a warning),
never trusted.

Tokenizing streams the text in blocks of ``BLOCK`` sentences and appends each block's ids
to the file, so neither the text nor the ids are ever all in memory. Every block is encoded
by ``Tokenizer.encode_flat`` (the encoding of ``Tokenizer.encode``: a ``vocab_file`` map's
numbering and EOS included). A text of more than a few blocks is encoded by one worker
process per core (``encode_blocks``: SentencePiece's own threads, ``num_threads=-1``, stop
scaling at the Python lists of ids it returns, which a worker turns into an array); a short
one in this process.
"""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing
import os
import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from seq2seq.data.sources import file_identity
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.data.tokenizer import flat_ids as _flatten

log = logging.getLogger(__name__)

FORMAT_VERSION = 2  # bump when the file layout or what the ids mean changes
BLOCK = 65_536  # sentences tokenized (and hashed) at a time
UINT16_VOCAB = 1 << 16  # the largest vocabulary stored as uint16


class TokenIds(Sequence):
    """Ragged token ids: ``n`` sentences over one flat array, optionally a selection of them.

    Args:
      flat: ids of all sentences concatenated (uint16 or int32 ``[total]``, may be a memmap).
      offsets: int64 ``[N + 1]``: sentence ``j`` of the flat array is
        ``flat[offsets[j]:offsets[j + 1]]``.
      index: int64 ``[n]``, the flat array's sentences this object holds, in order (None: all
        ``N``). Selecting (``select``) composes indices and copies no ids.

    ``ids[i]`` is an int32 array (a copy of sentence ``index[i]``); ``lengths`` is int32
    ``[n]``. Nothing per sentence is kept as a Python object, and beyond the flat arrays only
    ``index`` and ``lengths`` (12 bytes per selected sentence).
    """

    def __init__(self, flat: np.ndarray, offsets: np.ndarray, index: np.ndarray | None = None):
        self.flat, self.offsets, self.selection = flat, offsets, index
        starts, ends = offsets[:-1], offsets[1:]
        if index is not None:
            starts, ends = starts[index], ends[index]
        self.lengths = (np.asarray(ends) - np.asarray(starts)).astype(np.int32)

    def starts(self, which: np.ndarray) -> np.ndarray:
        """int64: where sentences ``which`` (indices into this object) start in ``flat``."""
        base = which if self.selection is None else self.selection[which]
        return np.asarray(self.offsets[base], np.int64)

    @classmethod
    def from_list(cls, ids: Sequence[np.ndarray]) -> TokenIds:
        """Ragged ids from one int array per sentence (copied into one flat int32 array)."""
        if isinstance(ids, TokenIds):
            return ids
        flat, offsets = to_flat(ids)
        return cls(flat, offsets)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return self.select(np.arange(len(self))[i])
        i = int(i)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"sentence {i} of {len(self)}")
        start = int(self.starts(np.array([i]))[0])
        return np.asarray(self.flat[start : start + int(self.lengths[i])], np.int32)

    def __iter__(self) -> Iterator[np.ndarray]:
        for i in range(len(self)):
            yield self[i]

    def select(self, which: np.ndarray) -> TokenIds:
        """The sentences ``which`` (int indices into this object), without copying ids."""
        which = np.asarray(which, np.int64)
        index = which if self.selection is None else self.selection[which]
        return TokenIds(self.flat, self.offsets, index)

    def gather(self, which: np.ndarray) -> np.ndarray:
        """int32 ``[lengths[which].sum()]``: the ids of sentences ``which``, concatenated."""
        which = np.asarray(which, np.int64)
        lengths = self.lengths[which].astype(np.int64)
        total = int(lengths.sum())
        if total == 0:
            return np.zeros(0, np.int32)
        ends = np.cumsum(lengths)
        shift = np.repeat(self.starts(which) - (ends - lengths), lengths)
        return np.asarray(self.flat[np.arange(total, dtype=np.int64) + shift], np.int32)

    def count(self, value: int) -> int:
        """How many ids over all held sentences equal ``value`` (read in blocks)."""
        if self.selection is None or (
            2 * len(self.selection) > len(self.offsets) - 1
            and bool(np.all(np.diff(self.selection) > 0))
        ):  # all (or most) sentences, each once: the flat array minus the ones left out
            total = 0
            for first in range(0, len(self.flat), 1 << 24):
                total += int(np.count_nonzero(self.flat[first : first + (1 << 24)] == value))
            if self.selection is not None:
                left_out = np.setdiff1d(
                    np.arange(len(self.offsets) - 1), self.selection, assume_unique=True
                )
                total -= TokenIds(self.flat, self.offsets, left_out).count(value)
            return total
        total = 0
        for first in range(0, len(self), BLOCK):
            which = np.arange(first, min(first + BLOCK, len(self)))
            total += int(np.count_nonzero(self.gather(which) == value))
        return total

    def to_list(self) -> list[np.ndarray]:
        """One int32 array per sentence (for small splits and code that needs a list)."""
        return list(self)


def to_flat(ids: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Ragged ids → (int32 ``[total]`` concatenation, int64 ``[n + 1]`` offsets)."""
    offsets = np.zeros(len(ids) + 1, np.int64)
    np.cumsum([len(x) for x in ids], out=offsets[1:])
    flat = np.concatenate(ids).astype(np.int32, copy=False) if len(ids) else np.zeros(0, np.int32)
    return flat, offsets


def from_flat(flat: np.ndarray, offsets: np.ndarray) -> list[np.ndarray]:
    """Inverse of ``to_flat``: one int32 array per sentence."""
    return TokenIds(flat, offsets).to_list()


def _blocks(texts: Sequence[str]) -> Iterator[list[str]]:
    """``texts`` in lists of at most ``BLOCK`` sentences (slices: a column is read in blocks)."""
    for first in range(0, len(texts), BLOCK):
        yield list(texts[first : first + BLOCK])


def text_digest(texts: Sequence[str]) -> str:
    """SHA-256 (hex) of a list of sentences: their lengths and their concatenation (so
    ``["a b"]`` and ``["a", "b"]`` differ), read in blocks."""
    h = hashlib.sha256(f"n={len(texts)}\n".encode())
    for block in _blocks(texts):
        h.update(np.fromiter(map(len, block), np.int64, len(block)).tobytes())
        h.update("".join(block).encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def content_key(
    texts: Sequence[str] | None,
    tokenizer: Tokenizer,
    *,
    add_eos: bool = True,
    inputs: str | None = None,
) -> str:
    """SHA-256 (hex) identifying the ids of ``texts`` under ``tokenizer``.

    Covers the format version, ``add_eos``, the model file's bytes and either the exact list
    of sentences (``text_digest``) or, when given, ``inputs``: a fingerprint of what the
    sentences are read from (``file_fingerprint`` plus how they are read), which a resume
    computes without reading the text.
    """
    h = hashlib.sha256()
    h.update(f"seq2seq-token-cache v{FORMAT_VERSION} add_eos={add_eos}\n".encode())
    h.update(tokenizer.sha256.encode())
    if inputs is not None:
        h.update(f"inputs {inputs}".encode())
    else:
        assert texts is not None
        h.update(text_digest(texts).encode())
    return h.hexdigest()


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def file_digests(paths: Sequence[str | Path], registry: str | Path | None) -> list[str]:
    """SHA-256 (hex) of each file's contents, in order, reading a file whole only when its
    entry in ``registry`` does not vouch for it.

    ``registry`` (a JSON file, e.g. ``tokens/files.json``) remembers each file's
    ``file_identity`` (size, inode, modification and change times, a hash of sampled blocks)
    and its content hash. A file whose identity matches its entry is not read whole; any
    other is hashed (streamed) and its entry updated. So a check costs a ``stat`` and at most
    1 MiB read per file, and a rewrite with other content is detected as ``file_identity``
    says: when it went through the file system (even with the modification time put back),
    replaced the file or touched a sampled block.

    Raises:
      OSError: a file cannot be read.
    """
    known: dict[str, Any] = {}
    if registry is not None and Path(registry).is_file():
        try:
            known = json.loads(Path(registry).read_text())
        except (OSError, ValueError):
            known = {}
    changed = False
    digests = []
    for p in paths:
        path = Path(p).resolve()
        seen = file_identity(path)
        entry = known.get(str(path))
        if isinstance(entry, dict) and all(entry.get(k) == v for k, v in seen.items()):
            digest = entry["sha256"]
        else:  # new, changed, or an entry of the older [size, mtime, sha256] form
            digest = _file_sha256(path)
            known[str(path)] = {**seen, "sha256": digest}
            changed = True
        digests.append(digest)
    if changed and registry is not None:
        _write_bytes(Path(registry), json.dumps(known, indent=1).encode())
    return digests


def file_fingerprint(paths: Sequence[str | Path], registry: str | Path | None) -> str:
    """SHA-256 (hex) of the contents of ``paths``: ``combine_digests`` of their
    ``file_digests`` (same registry, same cost), so equal contents give equal fingerprints
    whatever their stat says.

    Raises:
      OSError: a file cannot be read.
    """
    return combine_digests(file_digests(paths, registry))


def combine_digests(digests: Sequence[str]) -> str:
    """SHA-256 (hex) of file digests in order (``file_fingerprint`` of the files)."""
    return hashlib.sha256("".join(f"{d}\n" for d in digests).encode()).hexdigest()


def _write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # processes may share the dir
    tmp.write_bytes(data)
    tmp.replace(path)


def _paths(cache_dir: Path, stem: str) -> tuple[Path, Path, Path]:
    return (cache_dir / f"{stem}.ids", cache_dir / f"{stem}.offsets", cache_dir / f"{stem}.json")


def read_store(cache_dir: str | Path, name: str, key: str) -> tuple[TokenIds, dict] | None:
    """The ids and ``meta`` of store ``{name}.{key}`` if it is complete and consistent, else
    None (with a warning when files exist but cannot be trusted)."""
    ids_path, off_path, meta_path = _paths(Path(cache_dir), f"{name}.{key[:32]}")
    if not meta_path.is_file():
        return None
    try:
        meta = json.loads(meta_path.read_text())
        dtype = np.dtype(meta["dtype"])
        n, total = int(meta["sentences"]), int(meta["tokens"])
        ok = (
            meta.get("version") == FORMAT_VERSION
            and dtype in (np.uint16, np.int32)
            and ids_path.stat().st_size == total * dtype.itemsize
            and off_path.stat().st_size == (n + 1) * 8
        )
        if ok:
            offsets = np.memmap(off_path, np.int64, mode="r", shape=(n + 1,))
            flat = (
                np.memmap(ids_path, dtype, mode="r", shape=(total,))
                if total
                else np.zeros(0, dtype)
            )
            ok = offsets[0] == 0 and offsets[-1] == total and bool(np.all(np.diff(offsets) >= 0))
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("unreadable token store %s (%s): tokenizing again", meta_path, e)
        return None
    if not ok:
        log.warning("inconsistent token store %s: tokenizing again", meta_path)
        return None
    return TokenIds(flat, offsets), dict(meta.get("meta", {}))


def write_store(
    cache_dir: str | Path,
    name: str,
    key: str,
    blocks: Iterator[list[list[int]] | tuple[np.ndarray, np.ndarray]],
    vocab_size: int,
    meta: dict | None = None,
) -> TokenIds:
    """Write the ids of ``blocks`` (each a list of id lists, or ``encode_blocks``' (lengths,
    ids) arrays) as store ``{name}.{key}``, remove
    older stores of ``name``, and return the store mapped back."""
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    dtype = np.dtype(np.uint16 if vocab_size <= UINT16_VOCAB else np.int32)
    stem = f"{name}.{key[:32]}"
    ids_path, off_path, meta_path = _paths(cache_dir, stem)
    tmp = [p.with_name(f".{p.name}.{os.getpid()}.tmp") for p in (ids_path, off_path)]
    n = total = 0
    with open(tmp[0], "wb") as ids_file, open(tmp[1], "wb") as off_file:
        off_file.write(np.zeros(1, np.int64).tobytes())
        for block in blocks:
            lengths, ids = block if isinstance(block, tuple) else _flatten(block)
            flat = ids.astype(dtype, copy=False)
            ids_file.write(flat.tobytes())
            off_file.write((total + np.cumsum(lengths)).tobytes())
            n, total = n + len(lengths), total + int(lengths.sum())
    for t, p in zip(tmp, (ids_path, off_path)):
        t.replace(p)
    record = {
        "version": FORMAT_VERSION,
        "dtype": dtype.str,
        "sentences": n,
        "tokens": total,
        "meta": meta or {},
    }
    _write_bytes(meta_path, json.dumps(record).encode())
    for old in cache_dir.glob(f"{name}.*.json"):
        if old != meta_path and len(old.name.split(".")) == 4:
            for p in _paths(cache_dir, old.name.removesuffix(".json")):
                p.unlink(missing_ok=True)
    stored = read_store(cache_dir, name, key)
    assert stored is not None, f"token store {meta_path} unreadable right after writing"
    return stored[0]


_WORKER_TOKENIZER: Any = None  # a worker process's copy of the tokenizer (``_start_worker``)


def _start_worker(tokenizer: Tokenizer) -> None:
    global _WORKER_TOKENIZER
    _WORKER_TOKENIZER = tokenizer


def _encode_in_worker(block: list[str]) -> tuple[np.ndarray, np.ndarray]:
    return _WORKER_TOKENIZER.encode_flat(block)


def worker_count() -> int:
    """The cores this process may run on (``os.sched_getaffinity``, else ``os.cpu_count``)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def encode_blocks(
    tokenizer: Tokenizer, texts: Sequence[str], workers: int | None = None
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``tokenizer.encode_flat``'s ids (EOS appended) of ``texts`` a block of ``BLOCK``
    sentences at a time, in order. With ``workers`` (default: ``worker_count()``)
    above 1 and more than two blocks, the blocks are encoded by that many worker processes
    (spawned: this process may run JAX threads), at most two blocks per worker in flight."""
    workers = worker_count() if workers is None else workers
    if workers < 2 or len(texts) <= 2 * BLOCK:
        for block in _blocks(texts):
            yield tokenizer.encode_flat(block)
        return
    log.info("tokenizing %d sentences in %d worker processes", len(texts), workers)
    with ProcessPoolExecutor(
        workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_start_worker,
        initargs=(tokenizer,),  # pickled: its SentencePiece model and map
    ) as pool:
        pending: deque[Future] = deque()
        for block in _blocks(texts):
            pending.append(pool.submit(_encode_in_worker, block))
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def encode_cached(
    tokenizer: Tokenizer,
    texts: Sequence[str],
    cache_dir: str | Path | None,
    name: str,
    *,
    inputs: str | None = None,
) -> tuple[TokenIds, bool, float]:
    """``tokenizer.encode(texts)`` (EOS appended), read from / written to the token store.

    Args:
      tokenizer: the model to encode with.
      texts: the sentences (any sequence whose slices are lists of str: read in blocks).
      cache_dir: directory of the stores; None disables caching.
      name: ``{split}.{side}``, e.g. ``train.source`` (two dot-free parts).
      inputs: a fingerprint of what ``texts`` are read from (see ``content_key``); None: the
        store is keyed by the text itself.

    Returns:
      ``(ids, from_cache, seconds)``: the ids (``TokenIds``, mapped from the store when
      cached), whether they came from the store, and the seconds spent tokenizing (or
      hashing the text and mapping the store).

    Raises:
      ValueError: ``name`` is not two dot-free parts.
    """
    if len(name.split(".")) != 2 or not all(name.split(".")):
        raise ValueError(f"cache name {name!r} must look like 'split.side'")
    start = time.perf_counter()
    if cache_dir is None:
        blocks = list(encode_blocks(tokenizer, texts))
        lengths = np.concatenate([b[0] for b in blocks]) if blocks else np.zeros(0, np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        flat = np.concatenate([b[1] for b in blocks]) if blocks else np.zeros(0, np.int32)
        return TokenIds(flat, offsets), False, time.perf_counter() - start
    key = content_key(texts, tokenizer, inputs=inputs)
    stored = read_store(cache_dir, name, key)
    if stored is not None:
        return stored[0], True, time.perf_counter() - start
    start = time.perf_counter()
    ids = write_store(cache_dir, name, key, encode_blocks(tokenizer, texts), tokenizer.vocab_size)
    return ids, False, time.perf_counter() - start
