"""Tokenized ids cached in the run directory, so a resumed or second run does not re-tokenize.

One file per split and side, ``{cache_dir}/{name}.{key}.npz`` (e.g.
``tokens/train.source.3f2a….npz``), holding two plain arrays and no pickled objects: ``ids``
(int32, every sentence's ids concatenated) and ``offsets`` (int64 ``[n + 1]``; sentence ``i``
is ``ids[offsets[i]:offsets[i + 1]]``). ``key`` is a SHA-256 of the sentences and of the
tokenizer model's bytes, so changed text or a retrained model is tokenized again; an older
file of the same name is then removed. A cache file that cannot be read is tokenized again
(with a warning), never trusted.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from seq2seq.data.tokenizer import Tokenizer

log = logging.getLogger(__name__)

FORMAT_VERSION = 1  # bump when the file layout or what the ids mean changes


def content_key(texts: Sequence[str], tokenizer: Tokenizer, *, add_eos: bool = True) -> str:
    """SHA-256 (hex) identifying the ids of ``texts`` under ``tokenizer``.

    Covers the format version, ``add_eos``, the model file's bytes and the exact list of
    sentences (their lengths and their concatenation, so ``["a b"]`` and ``["a", "b"]`` differ).
    """
    h = hashlib.sha256()
    h.update(f"seq2seq-token-cache v{FORMAT_VERSION} add_eos={add_eos} n={len(texts)}\n".encode())
    h.update(tokenizer.sha256.encode())
    h.update(np.fromiter(map(len, texts), np.int64, len(texts)).tobytes())
    h.update("".join(texts).encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def to_flat(ids: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Ragged ids → (int32 ``[total]`` concatenation, int64 ``[n + 1]`` offsets)."""
    offsets = np.zeros(len(ids) + 1, np.int64)
    np.cumsum([len(x) for x in ids], out=offsets[1:])
    flat = np.concatenate(ids).astype(np.int32, copy=False) if len(ids) else np.zeros(0, np.int32)
    return flat, offsets


def from_flat(flat: np.ndarray, offsets: np.ndarray) -> list[np.ndarray]:
    """Inverse of ``to_flat``: one int32 array (a view of ``flat``) per sentence."""
    if len(offsets) <= 1:
        return []
    return np.split(flat, offsets[1:-1])


def _read(path: Path, n: int) -> list[np.ndarray] | None:
    """The ids stored in ``path`` if it is a complete, consistent cache file for n sentences."""
    try:
        with np.load(path, allow_pickle=False) as f:
            flat, offsets = f["ids"], f["offsets"]
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError) as e:
        log.warning("unreadable token cache %s (%s): tokenizing again", path, e)
        return None
    ok = (
        flat.dtype == np.int32
        and flat.ndim == 1
        and offsets.dtype == np.int64
        and offsets.shape == (n + 1,)
        and offsets[0] == 0
        and offsets[-1] == len(flat)
        and bool(np.all(np.diff(offsets) >= 0))
    )
    if not ok:
        log.warning("inconsistent token cache %s: tokenizing again", path)
        return None
    return from_flat(flat, offsets)


def _write(path: Path, name: str, ids: Sequence[np.ndarray]) -> None:
    flat, offsets = to_flat(ids)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # processes may share the dir
    with open(tmp, "wb") as f:
        np.savez(f, ids=flat, offsets=offsets)
    tmp.replace(path)
    for old in path.parent.glob(f"{name}.*.npz"):
        if old != path:
            old.unlink(missing_ok=True)


def encode_cached(
    tokenizer: Tokenizer, texts: Sequence[str], cache_dir: str | Path | None, name: str
) -> tuple[list[np.ndarray], bool, float]:
    """``tokenizer.encode(texts)`` (EOS appended), read from / written to the cache.

    Args:
      tokenizer: the model to encode with.
      texts: the sentences.
      cache_dir: directory of the cache files; None disables caching.
      name: ``{split}.{side}``, e.g. ``train.source`` (two dot-free parts).

    Returns:
      ``(ids, from_cache, seconds)``: one int32 array per sentence, whether they came from
      the cache, and the seconds spent in ``tokenizer.encode`` (or hashing the text and
      loading the cache file).

    Raises:
      ValueError: ``name`` is not two dot-free parts.
    """
    if len(name.split(".")) != 2 or not all(name.split(".")):
        raise ValueError(f"cache name {name!r} must look like 'split.side'")
    start = time.perf_counter()
    path = None
    if cache_dir is not None:
        path = Path(cache_dir) / f"{name}.{content_key(texts, tokenizer)[:32]}.npz"
        if path.is_file():
            ids = _read(path, len(texts))
            if ids is not None:
                return ids, True, time.perf_counter() - start
    start = time.perf_counter()
    ids = tokenizer.encode(texts)
    seconds = time.perf_counter() - start
    if path is not None:
        _write(path, name, ids)
    return ids, False, seconds
