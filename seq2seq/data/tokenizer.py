"""SentencePiece subword tokenizers (Kudo & Richardson 2018), trained once per run directory.

Special ids are fixed so that the rest of the code never hard-codes them: the ``Tokenizer``
object exposes ``pad_id`` (0), ``unk_id`` (1), ``bos_id`` (2) and ``eos_id`` (3).

A run has either one joint vocabulary trained on both languages (``spm.model``) or, with
``tokenizer.joint=false``, one model per language trained on its own side
(``spm.{lang}.model``). Each trained model is stored with ``<name>.json`` holding a content
hash of its inputs (training text and training options), so a rerun with the same data and
options reuses it and a changed corpus trains a new one, unless the run has checkpoints: their
embeddings index the model's pieces, so it is never retrained under them (``train_or_load``'s
``on_change``). ``TokenizerPair`` holds the source and target tokenizers of a run (the same
object twice when joint).
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import logging
import os
import re
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
import sentencepiece as spm

from seq2seq.config import TokenizerConfig, choices, range_problems

log = logging.getLogger(__name__)

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
MODEL_TYPES = choices("tokenizer.model_type")  # from the schema (seq2seq/config.py)
NORMALIZATIONS = choices("tokenizer.normalization")
BYTE_PIECES = 256  # what byte_fallback adds to the vocabulary
# a Marian target-language code such as ">>fra<<" at the start of a source text
_LANGUAGE_CODE = re.compile(r"\s*(>>[^<>\s]+<<)\s*")
# The options that change what training produces; the reuse hash covers exactly these, so
# e.g. pointing ``tgt_model_file`` at a file does not retrain the source model.
_TRAINING_OPTIONS = (
    "vocab_size",
    "model_type",
    "character_coverage",
    "input_sentence_size",
    "user_defined_symbols",
)
# Later options, hashed only when not at their default (so older runs keep their models).
_NEWER_OPTIONS = {
    "input_character_size": 50_000_000,
    "normalization": "nmt_nfkc",
    "byte_fallback": False,
    "remove_extra_whitespaces": True,
}


def _options(config: TokenizerConfig) -> dict:
    options = {k: getattr(config, k) for k in _TRAINING_OPTIONS}
    options.update(
        {
            k: getattr(config, k)
            for k, default in _NEWER_OPTIONS.items()
            if getattr(config, k) != default
        }
    )
    return options


class TokenizerError(ValueError):
    """The tokenizer cannot be trained or loaded; the message says why and what to change."""


class Tokenizer:
    """A loaded SentencePiece model with batch encode/decode.

    With ``vocab_file`` (a JSON object piece → id, Marian's ``vocab.json``) the model only
    cuts text into pieces and the map numbers them, as Hugging Face's ``MarianTokenizer``
    does: a piece missing from the map is the map's unknown piece, a ``>>xx<<`` language code
    at the start of a text that is in the map is one token, ``<pad>`` is pad and BOS (Marian's
    decoder start) and ``</s>`` EOS. ``encode_flat`` is the one encoding of every path (the
    token store, in process and in its worker processes, and ``encode``). A Tokenizer pickles
    (SentencePiece's processor does), so worker processes get the same object.

    Args:
      model_file: path of a ``.model`` file.
      vocab_file: path of the piece → id map, or None for SentencePiece's own ids.

    Raises:
      TokenizerError: the file is missing, not a SentencePiece model, or lacks a pad, bos or
        eos piece; the map is not a JSON object of distinct ids 0 … n−1, or lacks ``<pad>``,
        ``</s>`` or the model's unknown piece.
    """

    def __init__(self, model_file: str | Path, vocab_file: str | Path | None = None):
        path = Path(model_file)
        if not path.is_file():
            raise TokenizerError(f"tokenizer model not found: {path}")
        data = path.read_bytes()
        self.sp = spm.SentencePieceProcessor()
        try:
            self.sp.LoadFromSerializedProto(data)
        except (OSError, RuntimeError, TypeError) as e:
            raise TokenizerError(f"{path}: not a SentencePiece model ({e})") from e
        self.path = path
        self.sha256 = hashlib.sha256(data).hexdigest()  # identifies the model in cache keys
        self.piece_ids: dict[str, int] | None = None
        self.pieces: list[str] = []  # model id → piece (with piece_ids only)
        self.vocab_path: Path | None = None
        self._remap, self._codes = np.zeros(0, np.int32), False  # set with a map
        if vocab_file is not None:
            self._load_map(Path(vocab_file))
            return
        self.pad_id = self.sp.pad_id()
        self.unk_id = self.sp.unk_id()
        self.bos_id = self.sp.bos_id()
        self.eos_id = self.sp.eos_id()
        if min(self.pad_id, self.bos_id, self.eos_id) < 0:
            raise TokenizerError(
                f"{path}: the model must define pad, bos and eos pieces "
                f"(has pad={self.pad_id}, bos={self.bos_id}, eos={self.eos_id};"
                " -1 = missing); train it with --pad_id/--bos_id/--eos_id"
            )

    def _load_map(self, path: Path) -> None:
        if not path.is_file():
            raise TokenizerError(f"vocabulary map not found: {path} (tokenizer.vocab_file)")
        raw = path.read_bytes()
        try:
            mapping = json.loads(raw)
        except ValueError as e:
            raise TokenizerError(f"{path}: not JSON ({e})") from e
        if not isinstance(mapping, dict) or not all(
            isinstance(k, str) and isinstance(v, int) for k, v in mapping.items()
        ):
            raise TokenizerError(f"{path}: expected a JSON object of piece → integer id")
        seen: set[int] = set()
        for piece, i in mapping.items():
            if not 0 <= i < len(mapping) or i in seen:
                raise TokenizerError(
                    f"{path}: piece {piece!r} has id {i}; the ids must be distinct and "
                    f"0 … {len(mapping) - 1}"
                )
            seen.add(i)
        pieces = sorted(mapping, key=mapping.__getitem__)
        unk = self.sp.id_to_piece(self.sp.unk_id())
        for name in ("<pad>", "</s>", unk):
            if name not in mapping:
                raise TokenizerError(f"{path}: has no {name!r} piece (pad/EOS/unknown)")
        self.piece_ids, self.pieces, self.vocab_path = mapping, pieces, path
        self.pad_id = self.bos_id = mapping["<pad>"]
        self.eos_id, self.unk_id = mapping["</s>"], mapping[unk]
        # SentencePiece id → map id (``encode_flat``); its unknown id is resolved by piece
        own = [self.sp.id_to_piece(i) for i in range(self.sp.get_piece_size())]
        self._remap = np.array([mapping.get(p, self.unk_id) for p in own], np.int32)
        self._codes = any(_LANGUAGE_CODE.fullmatch(p) for p in mapping)
        # "ids v2": token stores written before the store numbered pieces through the map
        # (2026-12-06) held SentencePiece's ids; a new hash keeps them from being read
        self.sha256 = hashlib.sha256(self.sha256.encode() + raw + b"ids v2").hexdigest()

    @property
    def vocab_size(self) -> int:
        """Number of pieces (model ids), special ids included."""
        return len(self.pieces) if self.piece_ids is not None else self.sp.get_piece_size()

    def id_to_piece(self, i: int) -> str:
        """The piece of model id ``i``."""
        return self.pieces[i] if self.piece_ids is not None else self.sp.id_to_piece(i)

    def piece_to_id(self, piece: str) -> int:
        """The model id of ``piece`` (``unk_id`` for a piece not in the vocabulary)."""
        if self.piece_ids is not None:
            return self.piece_ids.get(piece, self.unk_id)
        return self.sp.piece_to_id(piece)

    def encode(self, texts: Sequence[str], *, add_eos: bool = True) -> list[np.ndarray]:
        """Token ids of each text: int32 arrays ``[len_i]``, ending with EOS when ``add_eos``
        (views of one ``encode_flat`` array)."""
        lengths, flat = self.encode_flat(texts, add_eos=add_eos)
        return np.split(flat, np.cumsum(lengths)[:-1]) if len(lengths) else []

    def encode_flat(
        self, texts: Sequence[str], *, add_eos: bool = True
    ) -> tuple[np.ndarray, np.ndarray]:
        """Token ids of ``texts`` as (int64 ``[n]`` lengths, int32 ``[total]`` concatenation),
        each text's ids ending with EOS when ``add_eos``: the encoding of every path.

        With a map, SentencePiece's ids are renumbered through a lookup array; a text holding
        SentencePiece's unknown id is numbered from its pieces, as ``MarianTokenizer`` does
        (the map may number a piece this model does not know, e.g. one of the other side's
        model); a ``>>xx<<`` code of the map at its start is one id before the rest.
        """
        texts = list(texts)
        if self.piece_ids is None:
            # num_threads=-1: all cores (SentencePiece's wrapper runs 0 as a single thread)
            return flat_ids(self.sp.encode(texts, out_type=int, add_eos=add_eos, num_threads=-1))
        codes = np.full(len(texts), -1, np.int64)
        if self._codes:
            for i, text in enumerate(texts):
                code = _LANGUAGE_CODE.match(text)
                if code and code.group(1) in self.piece_ids:
                    codes[i], texts[i] = self.piece_ids[code.group(1)], text[code.end() :]
        lengths, flat = flat_ids(self.sp.encode(texts, out_type=int, num_threads=-1))
        ends = np.cumsum(lengths)
        starts = ends - lengths
        body = self._remap[flat]  # a copy
        unknown = np.flatnonzero(flat == self.sp.unk_id())
        for i in np.unique(np.searchsorted(ends, unknown, "right")):
            pieces = self.sp.encode(texts[i], out_type=str)
            body[starts[i] : ends[i]] = [self.piece_ids.get(p, self.unk_id) for p in pieces]
        coded = codes >= 0
        out_lengths = lengths + coded + add_eos
        out_starts = np.cumsum(out_lengths) - out_lengths
        out = np.empty(int(out_lengths.sum()), np.int32)
        out[np.arange(len(body)) + np.repeat(out_starts + coded - starts, lengths)] = body
        out[out_starts[coded]] = codes[coded]
        if add_eos:
            out[out_starts + out_lengths - 1] = self.eos_id
        return out_lengths, out

    def decode(self, ids: Iterable[Sequence[int]]) -> list[str]:
        """Detokenized text of each id sequence; stops at the first EOS, drops pad/BOS."""
        out = []
        for seq in ids:
            seq = [int(t) for t in seq]
            if self.eos_id in seq:
                seq = seq[: seq.index(self.eos_id)]
            kept = [t for t in seq if t not in (self.pad_id, self.bos_id)]
            if self.piece_ids is None:
                out.append(self.sp.decode(kept))
            else:  # as MarianTokenizer: a piece this model lacks (the other side's) is copied,
                # its "▁" a space
                text = self.sp.decode_pieces([self.pieces[t] for t in kept])
                out.append(text.replace("\u2581", " ").strip())
        return out


def flat_ids(ids: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Id lists → (int64 ``[n]`` lengths, int32 ``[total]`` concatenation)."""
    lengths = np.fromiter(map(len, ids), np.int64, len(ids))
    return lengths, np.fromiter(itertools.chain.from_iterable(ids), np.int32, int(lengths.sum()))


class TokenizerPair:
    """The source-side and target-side tokenizers of a run.

    It can stand in for a ``Tokenizer`` wherever text goes source → target (the translator):
    ``encode`` uses the source model, ``decode`` the target model, and the special ids are
    the ones both models share. With a joint vocabulary ``source`` and ``target`` are the same
    object, and the pair behaves exactly like that one ``Tokenizer``.

    Args:
      source / target: the loaded models.

    Raises:
      TokenizerError: the two models disagree on the pad, bos or eos id.
    """

    def __init__(self, source: Tokenizer, target: Tokenizer):
        for name in ("pad_id", "bos_id", "eos_id"):
            if getattr(source, name) != getattr(target, name):
                raise TokenizerError(
                    f"{source.path} and {target.path} disagree on {name} "
                    f"({getattr(source, name)} vs {getattr(target, name)}); both sides need the "
                    "same special ids"
                )
        self.source, self.target = source, target
        self.pad_id, self.bos_id, self.eos_id = target.pad_id, target.bos_id, target.eos_id
        self.unk_id = target.unk_id

    @property
    def joint(self) -> bool:
        """True when source and target share one model (one vocabulary)."""
        return self.source is self.target

    @property
    def shared_ids(self) -> bool:
        """True when both sides number pieces in one id space: one model, or two models
        numbered by the same ``vocab_file`` map."""
        s, t = self.source, self.target
        return self.joint or (s.piece_ids is not None and s.piece_ids == t.piece_ids)

    @property
    def vocab_size(self) -> int:
        """Target vocabulary size (``model.vocab_size``: decoder input and output)."""
        return self.target.vocab_size

    @property
    def src_vocab_size(self) -> int:
        """Source vocabulary size (``model.src_vocab_size`` with separate vocabularies)."""
        return self.source.vocab_size

    def encode(self, texts: Sequence[str], *, add_eos: bool = True) -> list[np.ndarray]:
        """Source-side ids of each text (int32 arrays), see ``Tokenizer.encode``."""
        return self.source.encode(texts, add_eos=add_eos)

    def decode(self, ids: Iterable[Sequence[int]]) -> list[str]:
        """Target-side text of each id sequence, see ``Tokenizer.decode``."""
        return self.target.decode(ids)


def check_options(config: TokenizerConfig) -> None:
    """Reject tokenizer options SentencePiece would refuse with an opaque message.

    Raises:
      TokenizerError: naming the key, for an unknown ``model_type`` or ``normalization``,
        a value outside its key's ``Range`` in the schema (``character_coverage`` in
        [0.98, 1], ``input_sentence_size`` and ``input_character_size`` ≥ 0),
        ``input_sentence_size`` in 1…100, ``vocab_size`` not above the 4 special ids plus
        the user-defined symbols (plus 256 byte pieces with ``byte_fallback``), an empty or
        duplicated user-defined symbol, model files that do not fit ``joint``, or ``normalization``/
        ``byte_fallback`` set for models that are all given as files.
    """
    if config.model_type not in MODEL_TYPES:
        raise TokenizerError(
            f"tokenizer.model_type={config.model_type!r}: expected one of {', '.join(MODEL_TYPES)}"
        )
    if config.normalization not in NORMALIZATIONS:
        raise TokenizerError(
            f"tokenizer.normalization={config.normalization!r}: expected one "
            f"of {', '.join(NORMALIZATIONS)}"
        )
    problems = range_problems(config, "tokenizer.")  # each key's Range in the schema
    if problems:
        raise TokenizerError("; ".join(problems))
    if 0 < config.input_sentence_size <= 100:  # the range's gap (≥ 0 is the schema's)
        raise TokenizerError(
            f"tokenizer.input_sentence_size={config.input_sentence_size}: "
            "use 0 (all sentences) or more than 100"
        )
    symbols = list(config.user_defined_symbols)
    if any(not s for s in symbols) or len(set(symbols)) != len(symbols):
        raise TokenizerError(
            f"tokenizer.user_defined_symbols={symbols}: symbols must be non-empty and distinct"
        )
    if config.vocab_size <= 4 + len(symbols):
        raise TokenizerError(
            f"tokenizer.vocab_size={config.vocab_size}: must exceed the 4 "
            f"special ids and {len(symbols)} user-defined symbols"
        )
    if config.byte_fallback and config.vocab_size <= 4 + len(symbols) + BYTE_PIECES:
        raise TokenizerError(
            f"tokenizer.vocab_size={config.vocab_size}: with "
            f"tokenizer.byte_fallback=true it must exceed the 4 special ids, "
            f"{len(symbols)} user-defined symbols and the {BYTE_PIECES} byte "
            "pieces"
        )
    if config.joint and (config.src_model_file or config.tgt_model_file):
        raise TokenizerError(
            "tokenizer.src_model_file/tgt_model_file are for separate "
            "vocabularies (tokenizer.joint=false); use tokenizer.model_file"
        )
    if not config.joint and config.model_file:
        raise TokenizerError(
            "tokenizer.model_file is one joint model but tokenizer.joint is "
            "false; use tokenizer.src_model_file and tokenizer.tgt_model_file"
        )
    ready = config.model_file if config.joint else (config.src_model_file and config.tgt_model_file)
    for key, default in _NEWER_OPTIONS.items():
        if ready and getattr(config, key) != default:
            raise TokenizerError(
                f"tokenizer.{key}={getattr(config, key)!r} applies to models "
                "trained by the run, but the model files are given (they keep "
                "the options they were trained with)"
            )


def model_names(config: TokenizerConfig, src_lang: str, tgt_lang: str) -> tuple[str, str]:
    """File stems of the trained source and target models in the run directory.

    ``("spm", "spm")`` for a joint vocabulary, else ``("spm.{src_lang}", "spm.{tgt_lang}")``
    (so a run and its reverse direction name the same files the same way).
    """
    return ("spm", "spm") if config.joint else (f"spm.{src_lang}", f"spm.{tgt_lang}")


def _fingerprint(texts: Sequence[str], config: TokenizerConfig) -> str:
    h = hashlib.sha256()
    h.update(json.dumps(_options(config), sort_keys=True).encode())
    for t in texts:
        h.update(t.encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


PROBE_SENTENCES = 4096  # sentences measured for the mean length (``sample_size``)


def sample_size(texts: Sequence[str], config: TokenizerConfig) -> int:
    """SentencePiece's ``input_sentence_size`` for ``texts``: ``config.input_sentence_size``
    (0 = all), lowered so that the sample holds about ``config.input_character_size``
    characters at the mean sentence length of ``PROBE_SENTENCES`` sentences spread evenly over
    ``texts`` (never below 101, SentencePiece's floor; 0 when every sentence fits)."""
    size, cap, n = config.input_sentence_size, config.input_character_size, len(texts)
    if not cap or n == 0:
        return size
    step = max(n // PROBE_SENTENCES, 1)
    probe = [len(texts[i]) for i in range(0, n, step)]
    by_chars = max(int(cap / max(sum(probe) / len(probe), 1.0)), 101)
    if by_chars >= n:
        return size
    return by_chars if size == 0 else min(size, by_chars)


def _write_meta(path: Path, meta: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # processes may share the dir
    tmp.write_text(json.dumps(meta, indent=1))
    tmp.replace(path)


class _Joined(Sequence):
    """Two sequences of sentences read one after the other, without copying them."""

    def __init__(self, first: Sequence[str], second: Sequence[str]):
        self.first, self.second = first, second

    def __len__(self) -> int:
        return len(self.first) + len(self.second)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self.first)
        return self.first[i] if i < n else self.second[i - n]

    def __iter__(self) -> Iterator[str]:
        yield from self.first
        yield from self.second


def _explain(message: str, config: TokenizerConfig, what: str) -> str:
    """A SentencePiece training error rewritten as what to change in the config."""
    too_high = re.search(
        r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)", message
    )
    if too_high:
        return (
            f"tokenizer.vocab_size={too_high.group(1)} is more than the {what} supports: "
            f"at most {too_high.group(2)} pieces can be learned from it; set "
            f"tokenizer.vocab_size={too_high.group(2)} or less (or train on more text)"
        )
    too_low = re.search(r"smaller than required_chars\. (\d+) vs (\d+)", message)
    if too_low:
        return (
            f"tokenizer.vocab_size={too_low.group(1)} is too small for the {what}: its "
            f"characters and the special pieces alone need {too_low.group(2)}; set "
            f"tokenizer.vocab_size={too_low.group(2)} or more, or lower "
            f"tokenizer.character_coverage (now {config.character_coverage})"
        )
    return f"SentencePiece training on the {what} failed: {message}"


# What ``train_or_load`` does with a model whose text or options changed: train it again (a run
# without checkpoints), refuse, or keep it for the new text (checkpoints index its pieces).
ON_CHANGE = ("retrain", "refuse", "keep")


def _what_changed(meta: dict, served: dict, what: str) -> tuple[str, bool]:
    """What differs between a model's record ``meta`` and the text and options it is now asked
    to serve (``served``), as a phrase, and whether that includes its options."""
    old, new = meta.get("options"), served["options"]
    if old is not None and old != new:
        value = lambda o, k: o.get(k, _NEWER_OPTIONS.get(k))  # noqa: E731
        keys = [k for k in sorted(set(old) | set(new)) if value(old, k) != value(new, k)]
        listed = ", ".join(f"tokenizer.{k}: {value(old, k)!r} → {value(new, k)!r}" for k in keys)
        return f"its options changed ({listed})", True
    before, now = meta.get("files"), served["files"]
    if before is None or now is None:
        read = f" (read from {', '.join(now)})" if now else ""
        return f"the {what}{read} changed", False
    parts = [
        f"{label} {', '.join(paths)}"
        for label, paths in (
            ("changed:", [p for p in now if p in before and before[p] != now[p]]),
            ("new:", [p for p in now if p not in before]),
            ("no longer read:", [p for p in before if p not in now]),
        )
        if paths
    ]
    if not parts:
        return f"the {what} changed (its files did not: how they are read did)", False
    return f"the {what} changed ({'; '.join(parts)})", False


def _keep_or_refuse(
    model_path: Path, meta_path: Path, meta: dict, served: dict, what: str, on_change: str
) -> Tokenizer:
    """A run with checkpoints whose tokenizer's text or options changed: the model is kept
    for the new text (``keep``, same options) or the run refused, never retrained."""
    change, options = _what_changed(meta, served, what)
    if on_change == "keep" and not options:
        log.warning(
            "%s: %s; kept (train.allow_data_change): the new text is tokenized with it",
            model_path,
            change,
        )
        trained = meta.get("trained_sha256", meta.get("sha256"))
        _write_meta(meta_path, {**meta, **served, "trained_sha256": trained})
        return Tokenizer(model_path)
    how = (
        "Set the options back, or start a new run in another workdir"
        if options
        else "Put the old text back, start a new run in another workdir, or continue on purpose "
        "with train.allow_data_change=true (the model is kept and the new text tokenized "
        "with it)"
    )
    raise TokenizerError(
        f"{model_path} is the tokenizer of the checkpoints in {model_path.parent}, but {change}. "
        f"A run never retrains its tokenizer under its checkpoints (their embeddings index its "
        f"pieces). {how}"
    )


def train_or_load(
    texts: Sequence[str],
    config: TokenizerConfig,
    workdir: str | Path,
    *,
    name: str = "spm",
    what: str = "training text",
    inputs: str | None = None,
    files: dict[str, str] | None = None,
    on_change: str = "retrain",
) -> Tokenizer:
    """Train a SentencePiece model on ``texts`` once, or reuse the one in ``workdir``.

    Args:
      texts: training sentences (both sides together for a joint vocabulary, one side for a
        separate one).
      config: tokenizer options; ``model_file`` set means use that model as is (joint only).
      workdir: run directory; the model is written to ``workdir/{name}.model`` and the hash of
        its inputs to ``workdir/{name}.json``.
      name: file stem, see ``model_names``.
      what: how messages name ``texts`` (e.g. "source (en) side of the training split").
      inputs: a fingerprint of the files ``texts`` are read from (``token_cache.
        file_fingerprint`` and how they are read), stored with the model: when it and the
        options match the stored ones the model is reused without reading ``texts``;
        otherwise the text's hash decides, as without it.
      files: the SHA-256 of each file ``texts`` are read from (path → hex digest), stored with
        the model so that a refusal names the files that changed.
      on_change: what a model whose text or options changed gets (one of ``ON_CHANGE``):
        ``retrain`` (a run without checkpoints); ``refuse`` (the run has checkpoints, whose
        embeddings index this model's pieces: a ``TokenizerError`` names the model, what
        changed and how to go on); ``keep`` (checkpoints and ``train.allow_data_change``: the
        model serves the new text, recorded in ``{name}.json``, where ``trained_sha256``
        keeps the hash of the text it was trained on). A model without its record is then
        kept as it is; a missing one is refused (training one would not match them).

    Returns:
      The loaded Tokenizer.

    Raises:
      TokenizerError: invalid options (see ``check_options``), or training fails; a vocabulary
        larger than the text supports names the largest size that works, one too small for
        the alphabet the smallest; a change refused (``on_change``); under ``keep``, changed
        options (the model cannot be kept for other options).
    """
    check_options(config)
    if config.model_file:
        return Tokenizer(config.model_file)
    workdir = Path(workdir)
    model_path, meta_path = workdir / f"{name}.model", workdir / f"{name}.json"
    options = json.loads(json.dumps(_options(config)))
    if on_change not in ON_CHANGE:
        raise ValueError(f"on_change={on_change!r}: expected one of {', '.join(ON_CHANGE)}")
    if model_path.is_file() and meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        if inputs is not None and meta.get("inputs") == inputs and meta.get("options") == options:
            log.info("reusing tokenizer %s (its input files are unchanged)", model_path)
            return Tokenizer(model_path)
        digest = _fingerprint(texts, config)
        served = {"sha256": digest, "options": options, "inputs": inputs, "files": files}
        if meta.get("sha256") == digest:
            log.info("reusing tokenizer %s", model_path)
            if inputs is not None:  # the next run need not read the text
                _write_meta(meta_path, {**meta, **served})
            return Tokenizer(model_path)
        if on_change != "retrain":
            return _keep_or_refuse(model_path, meta_path, meta, served, what, on_change)
        log.warning("training data or tokenizer options changed: retraining %s", model_path)
    elif on_change != "retrain":  # checkpoints index the pieces of the model in workdir
        if not model_path.is_file():
            raise TokenizerError(
                f"{model_path} is missing, but {workdir} holds checkpoints trained with it: a "
                "tokenizer trained now would not match them. Put the file back, or start a "
                "new run in another workdir"
            )
        log.warning("%s has no record of its text (%s): kept as it is", model_path, meta_path)
        return Tokenizer(model_path)
    else:
        digest = _fingerprint(texts, config)
    start = time.perf_counter()
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(texts),
            model_writer=model,
            vocab_size=config.vocab_size,
            model_type=config.model_type,
            character_coverage=config.character_coverage,
            input_sentence_size=sample_size(texts, config),
            shuffle_input_sentence=True,
            user_defined_symbols=list(config.user_defined_symbols),
            normalization_rule_name=config.normalization,
            byte_fallback=config.byte_fallback,
            remove_extra_whitespaces=config.remove_extra_whitespaces,
            pad_id=PAD_ID,
            unk_id=UNK_ID,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            num_threads=2,
            minloglevel=2,
        )
    except (RuntimeError, ValueError) as e:
        raise TokenizerError(_explain(str(e), config, what)) from e
    workdir.mkdir(parents=True, exist_ok=True)
    tmp = model_path.with_suffix(".tmp")
    tmp.write_bytes(model.getvalue())
    tmp.replace(model_path)
    _write_meta(meta_path, {"sha256": digest, "options": options, "inputs": inputs, "files": files})
    log.info(
        "trained tokenizer %s (%d pieces) on the %s in %.1f s",
        model_path,
        config.vocab_size,
        what,
        time.perf_counter() - start,
    )
    return Tokenizer(model_path)


def train_or_load_pair(
    sources: Sequence[str],
    targets: Sequence[str],
    config: TokenizerConfig,
    workdir: str | Path,
    *,
    src_lang: str,
    tgt_lang: str,
    inputs: str | None = None,
    files: dict[str, str] | None = None,
    on_change: str = "retrain",
) -> TokenizerPair:
    """The run's source and target tokenizers: trained once on the training split, or given.

    Joint (``config.joint``): one model trained on ``sources + targets`` (or
    ``config.model_file``). Separate: a source model trained on ``sources`` only and a
    target model on ``targets`` only (or ``src_model_file`` / ``tgt_model_file``).

    Args:
      sources / targets: the training split's aligned sentences.
      config: tokenizer options.
      workdir: run directory (see ``model_names`` for the file names).
      src_lang / tgt_lang: language codes (file names and messages).
      inputs: the training files' fingerprint (see ``train_or_load``).
      files / on_change: see ``train_or_load``.

    Raises:
      TokenizerError: see ``train_or_load``; messages of separate models name the side.
    """
    check_options(config)
    src_name, tgt_name = model_names(config, src_lang, tgt_lang)
    if config.vocab_file is not None:
        ready = (
            config.model_file if config.joint else config.src_model_file and config.tgt_model_file
        )
        if not ready:
            raise TokenizerError(
                f"tokenizer.vocab_file={config.vocab_file} numbers the pieces of existing "
                "SentencePiece models: give them (tokenizer.model_file, or src_model_file and "
                "tgt_model_file) or start from an imported run (train.init_from)"
            )
        return load_pair(config, workdir, src_lang=src_lang, tgt_lang=tgt_lang)
    if config.joint:
        tok = train_or_load(
            _Joined(sources, targets),
            config,
            workdir,
            name=src_name,
            what="training split (both sides, joint vocabulary)",
            inputs=inputs,
            files=files,
            on_change=on_change,
        )
        return TokenizerPair(tok, tok)
    sides = []
    for texts, given, name, role, lang in (
        (sources, config.src_model_file, src_name, "source", src_lang),
        (targets, config.tgt_model_file, tgt_name, "target", tgt_lang),
    ):
        sides.append(
            Tokenizer(given)
            if given
            else train_or_load(
                texts,
                config,
                workdir,
                name=name,
                what=f"{role} ({lang}) side of the training split",
                inputs=inputs,
                files=files,
                on_change=on_change,
            )
        )
    return TokenizerPair(*sides)


def load_pair(
    config: TokenizerConfig, workdir: str | Path, *, src_lang: str, tgt_lang: str
) -> TokenizerPair:
    """Load a trained run's tokenizers without training (for translation and evaluation).

    Raises:
      TokenizerError: a model file is missing or invalid (the message names it).
    """
    src_name, tgt_name = model_names(config, src_lang, tgt_lang)
    workdir = Path(workdir)
    vocab = vocab_path(config, workdir)
    if config.joint:
        tok = Tokenizer(config.model_file or workdir / f"{src_name}.model", vocab)
        return TokenizerPair(tok, tok)
    return TokenizerPair(
        Tokenizer(config.src_model_file or workdir / f"{src_name}.model", vocab),
        Tokenizer(config.tgt_model_file or workdir / f"{tgt_name}.model", vocab),
    )


def vocab_path(config: TokenizerConfig, workdir: str | Path) -> Path | None:
    """``tokenizer.vocab_file`` resolved in the run directory (None when unset)."""
    return None if config.vocab_file is None else Path(workdir) / config.vocab_file
