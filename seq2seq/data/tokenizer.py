"""SentencePiece subword tokenizer (Kudo & Richardson 2018), trained once per run directory.

Special ids are fixed so that the rest of the code never hard-codes them: the ``Tokenizer``
object exposes ``pad_id`` (0), ``unk_id`` (1), ``bos_id`` (2) and ``eos_id`` (3).
The trained model is stored as ``spm.model`` in the run directory together with
``spm.json`` holding a content hash of its inputs (training text and options), so a rerun with
the same data and options reuses it and a changed corpus trains a new one.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import re
import time
from dataclasses import asdict
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import sentencepiece as spm

from seq2seq.config import TokenizerConfig

log = logging.getLogger(__name__)

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3


class TokenizerError(ValueError):
    """The tokenizer cannot be trained or loaded; the message says why and what to change."""


class Tokenizer:
    """A loaded SentencePiece model with batch encode/decode.

    Args:
      model_file: path of a ``.model`` file.

    Raises:
      TokenizerError: the file is missing or not a SentencePiece model.
    """

    def __init__(self, model_file: str | Path):
        path = Path(model_file)
        if not path.is_file():
            raise TokenizerError(f"tokenizer model not found: {path}")
        try:
            self.sp = spm.SentencePieceProcessor(model_file=str(path))
        except (OSError, RuntimeError) as e:
            raise TokenizerError(f"{path}: not a SentencePiece model ({e})") from e
        self.path = path
        self.pad_id = self.sp.pad_id()
        self.unk_id = self.sp.unk_id()
        self.bos_id = self.sp.bos_id()
        self.eos_id = self.sp.eos_id()
        if min(self.pad_id, self.bos_id, self.eos_id) < 0:
            raise TokenizerError(f"{path}: the model must define pad, bos and eos pieces")

    @property
    def vocab_size(self) -> int:
        """Number of pieces, special ids included."""
        return self.sp.get_piece_size()

    def encode(self, texts: Sequence[str], *, add_eos: bool = True) -> list[np.ndarray]:
        """Token ids of each text (int32 arrays), ending with EOS when ``add_eos``."""
        ids = self.sp.encode(list(texts), out_type=int, add_eos=add_eos, num_threads=0)
        return [np.asarray(x, dtype=np.int32) for x in ids]

    def decode(self, ids: Iterable[Sequence[int]]) -> list[str]:
        """Detokenized text of each id sequence; stops at the first EOS, drops pad/BOS."""
        out = []
        for seq in ids:
            seq = [int(t) for t in seq]
            if self.eos_id in seq:
                seq = seq[: seq.index(self.eos_id)]
            out.append(self.sp.decode([t for t in seq if t not in (self.pad_id, self.bos_id)]))
        return out


def _fingerprint(texts: Sequence[str], config: TokenizerConfig) -> str:
    h = hashlib.sha256()
    h.update(json.dumps(asdict(config), sort_keys=True).encode())
    for t in texts:
        h.update(t.encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


def train_or_load(texts: Sequence[str], config: TokenizerConfig, workdir: str | Path) -> Tokenizer:
    """Train a joint SentencePiece model on ``texts`` once, or reuse the one in ``workdir``.

    Args:
      texts: training sentences (source and target sides together for a joint vocabulary).
      config: tokenizer options; ``model_file`` set means use that model as is.
      workdir: run directory; the model is written to ``workdir/spm.model``.

    Returns:
      The loaded Tokenizer.

    Raises:
      TokenizerError: training fails, e.g. the vocabulary is larger than the corpus supports
        (the message suggests the largest size SentencePiece reported as possible).
    """
    if config.model_file:
        return Tokenizer(config.model_file)
    workdir = Path(workdir)
    model_path, meta_path = workdir / "spm.model", workdir / "spm.json"
    digest = _fingerprint(texts, config)
    if model_path.is_file() and meta_path.is_file():
        if json.loads(meta_path.read_text()).get("sha256") == digest:
            log.info("reusing tokenizer %s", model_path)
            return Tokenizer(model_path)
        log.warning("training data or tokenizer options changed: retraining %s", model_path)
    start = time.perf_counter()
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(texts), model_writer=model,
            vocab_size=config.vocab_size, model_type=config.model_type,
            character_coverage=config.character_coverage,
            input_sentence_size=config.input_sentence_size, shuffle_input_sentence=True,
            user_defined_symbols=list(config.user_defined_symbols),
            pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
            num_threads=2, minloglevel=2)
    except RuntimeError as e:
        msg = str(e)
        m = re.search(r"<= (\d+)", msg)
        hint = f"; try tokenizer.vocab_size={m.group(1)} or less" if m else ""
        raise TokenizerError(f"SentencePiece training failed: {msg}{hint}") from e
    workdir.mkdir(parents=True, exist_ok=True)
    tmp = model_path.with_suffix(".tmp")
    tmp.write_bytes(model.getvalue())
    tmp.replace(model_path)
    meta_path.write_text(json.dumps({"sha256": digest, "config": asdict(config)}, indent=1))
    log.info("trained tokenizer (%d pieces) in %.1f s", config.vocab_size, time.perf_counter() - start)
    return Tokenizer(model_path)
