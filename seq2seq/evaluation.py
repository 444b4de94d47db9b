"""Corpus-level BLEU and chrF with sacreBLEU (Post 2018) on detokenized text."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import sacrebleu


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
        return (f"BLEU = {self.bleu:.2f} ({self.bleu_signature})\n"
                f"chrF = {self.chrf:.2f} ({self.chrf_signature})")


def score(hypotheses: Sequence[str], references: Sequence[str]) -> Scores:
    """Score detokenized hypotheses against one reference each (sacreBLEU defaults: 13a, cased).

    Raises:
      ValueError: the two lists differ in length or are empty.
    """
    if len(hypotheses) != len(references) or not hypotheses:
        raise ValueError(f"need as many hypotheses as references (> 0): got {len(hypotheses)} "
                         f"hypotheses and {len(references)} references")
    bleu, chrf = sacrebleu.BLEU(), sacrebleu.CHRF()
    b = bleu.corpus_score(list(hypotheses), [list(references)])
    c = chrf.corpus_score(list(hypotheses), [list(references)])
    return Scores(bleu=b.score, chrf=c.score, bleu_signature=str(bleu.get_signature()),
                  chrf_signature=str(chrf.get_signature()), num_sentences=len(hypotheses))
