"""Corpus-level BLEU and chrF with sacreBLEU (Post 2018) on detokenized text."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import sacrebleu

log = logging.getLogger(__name__)

# SentencePiece's word-boundary mark (U+2581): in a line, a sign that it is still pieces
PIECE_MARK = "\u2581"


@dataclass(frozen=True)
class Scores:
    """sacreBLEU scores with their signatures (print them with every score).

    Attributes:
      bleu, chrf: corpus scores in [0, 100].
      bleu_signature, chrf_signature: sacreBLEU reproducibility signatures.
      num_sentences: number of scored hypothesis/reference pairs.
    """

    bleu: float
    chrf: float
    bleu_signature: str
    chrf_signature: str
    num_sentences: int

    def __str__(self) -> str:
        return (
            f"BLEU = {self.bleu:.2f} ({self.bleu_signature})\n"
            f"chrF = {self.chrf:.2f} ({self.chrf_signature})"
        )


def piece_lines(lines: Sequence[str]) -> list[int]:
    """1-based numbers of the lines that contain SentencePiece's ``▁`` (U+2581), i.e. look
    like pieces (``spm_encode`` output) rather than detokenized text."""
    return [i for i, line in enumerate(lines, 1) if PIECE_MARK in line]


def pieces_message(name: str, lines: Sequence[str]) -> str | None:
    """What ``piece_lines`` found in ``lines`` (called ``name``), or None when nothing."""
    found = piece_lines(lines)
    if not found:
        return None
    return (
        f"{name}: {len(found)} of {len(lines)} lines contain SentencePiece pieces "
        f"('{PIECE_MARK}', first on line {found[0]}); BLEU and chrF are meant for "
        "detokenized text (decode the pieces, e.g. with spm_decode)"
    )


def score(
    hypotheses: Sequence[str],
    references: Sequence[str],
    *,
    names: tuple[str, str] = ("hypotheses", "references"),
) -> Scores:
    """Score detokenized hypotheses against one reference each (sacreBLEU defaults: 13a, cased).

    A side whose lines contain SentencePiece pieces (``piece_lines``) is scored as it is,
    with a warning naming it (``names``: hypotheses' and references' names, e.g. files) and
    the number of such lines.

    Raises:
      ValueError: the two lists differ in length or are empty.
    """
    if len(hypotheses) != len(references) or not hypotheses:
        raise ValueError(
            f"need as many hypotheses as references (> 0): got {len(hypotheses)} "
            f"hypotheses and {len(references)} references"
        )
    for name, lines in zip(names, (hypotheses, references)):
        message = pieces_message(name, lines)
        if message:
            log.warning("%s", message)
    bleu, chrf = sacrebleu.BLEU(), sacrebleu.CHRF()
    b = bleu.corpus_score(list(hypotheses), [list(references)])
    c = chrf.corpus_score(list(hypotheses), [list(references)])
    return Scores(
        bleu=b.score,
        chrf=c.score,
        bleu_signature=str(bleu.get_signature()),
        chrf_signature=str(chrf.get_signature()),
        num_sentences=len(hypotheses),
    )
