"""Corpus-level BLEU, chrF, chrF++ and TER with sacreBLEU (Post 2018) on detokenized text, and
paired significance tests between systems with sacreBLEU's own implementations (paired
bootstrap resampling, Koehn 2004; approximate randomization, Riezler & Maxwell 2005)."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import sacrebleu
from sacrebleu.metrics.base import Metric

from seq2seq.config import Config

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


def _check_pair(
    hypotheses: Sequence[str], references: Sequence[str], names: tuple[str, str]
) -> None:
    """Raise ValueError unless the sides have the same length (> 0); warn about pieces."""
    if len(hypotheses) != len(references) or not hypotheses:
        raise ValueError(
            f"need as many hypotheses as references (> 0): got {len(hypotheses)} "
            f"hypotheses and {len(references)} references"
        )
    for name, lines in zip(names, (hypotheses, references)):
        message = pieces_message(name, lines)
        if message:
            log.warning("%s", message)


def score(
    hypotheses: Sequence[str],
    references: Sequence[str],
    *,
    names: tuple[str, str] = ("hypotheses", "references"),
    lowercase: bool = False,
) -> Scores:
    """Score detokenized hypotheses against one reference each (sacreBLEU defaults: 13a, cased;
    ``lowercase``: case-insensitive, ``case:lc`` in the signatures).

    A side whose lines contain SentencePiece pieces (``piece_lines``) is scored as it is,
    with a warning naming it (``names``: hypotheses' and references' names, e.g. files) and
    the number of such lines.

    Raises:
      ValueError: the two lists differ in length or are empty.
    """
    _check_pair(hypotheses, references, names)
    bleu, chrf = sacrebleu.BLEU(lowercase=lowercase), sacrebleu.CHRF(lowercase=lowercase)
    b = bleu.corpus_score(list(hypotheses), [list(references)])
    c = chrf.corpus_score(list(hypotheses), [list(references)])
    return Scores(
        bleu=b.score,
        chrf=c.score,
        bleu_signature=str(bleu.get_signature()),
        chrf_signature=str(chrf.get_signature()),
        num_sentences=len(hypotheses),
    )


# -- several metrics, several systems -----------------------------------------------------------

METRICS = ("bleu", "chrf", "chrf++", "ter")
LABELS = {"bleu": "BLEU", "chrf": "chrF", "chrf++": "chrF++", "ter": "TER"}
# sacreBLEU's defaults for its command line's paired tests (--paired-bs-n, --paired-ar-n, and
# the SACREBLEU_SEED it reads)
BOOTSTRAP_SAMPLES, AR_TRIALS, SEED = 1000, 10000, 12345


COMET = "comet"  # optional (the comet extra), scored outside sacreBLEU: ``comet_scores``


def parse_metrics(text: str) -> tuple[str, ...]:
    """``"bleu,chrf++"`` → ``("bleu", "chrf++")`` (lowercased, duplicates dropped, in order).

    Raises:
      ValueError: an empty list or a name not in ``METRICS`` or ``COMET``.
    """
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in (*METRICS, COMET)]
    if unknown or not names:
        raise ValueError(
            f"--metrics {text!r}: unknown metric {unknown[0] if unknown else '(none)'!r}; "
            f"choose from {','.join((*METRICS, COMET))}"
        )
    return tuple(dict.fromkeys(names))


def load_comet(path: str | None) -> Any:
    """A COMET model (Rei et al. 2020; ``unbabel-comet``'s ``load_from_checkpoint``) from a
    local checkpoint file, e.g. ``checkpoints/model.ckpt`` of a downloaded
    ``Unbabel/wmt22-comet-da``; nothing is downloaded (``local_files_only``: the encoder's
    tokenizer must be in the Hugging Face cache too).

    Raises:
      ValueError: no path given, or no file there.
      RuntimeError: the ``comet`` extra (``unbabel-comet``) is not installed.
    """
    if not path:
        raise ValueError(
            "--metrics comet needs --comet-model PATH: a local COMET checkpoint (.ckpt), e.g. "
            "checkpoints/model.ckpt of a downloaded Unbabel/wmt22-comet-da; nothing is "
            "downloaded"
        )
    if not os.path.isfile(path):
        raise ValueError(f"--comet-model {path}: no such file (a COMET checkpoint, .ckpt)")
    try:
        from comet import load_from_checkpoint
    except ImportError as e:
        raise RuntimeError(
            "--metrics comet needs the comet extra: pip install -e '.[comet]' "
            "(unbabel-comet, with PyTorch)"
        ) from e
    return load_from_checkpoint(path, local_files_only=True)


def comet_scores(
    model: Any,
    systems: Sequence[Sequence[str]],
    sources: Sequence[str],
    references: Sequence[str],
    *,
    batch_size: int = 16,
) -> list[float]:
    """System-level COMET of each system (``model`` from ``load_comet``): COMET's
    ``system_score``, the mean of its segment scores over (source, hypothesis, reference)
    triples, on the CPU. No confidence interval or paired test (sacreBLEU's do not apply).

    Raises:
      ValueError: a system, the sources and the references differ in length.
    """
    out = []
    for hyps in systems:
        if not len(hyps) == len(sources) == len(references):
            raise ValueError(
                f"COMET needs one source and reference per hypothesis: got {len(hyps)} "
                f"hypotheses, {len(sources)} sources, {len(references)} references"
            )
        data = [{"src": s, "mt": h, "ref": r} for s, h, r in zip(sources, hyps, references)]
        result = model.predict(data, batch_size=batch_size, gpus=0, progress_bar=False)
        out.append(float(result.system_score))
    return out


def make_metric(
    name: str, *, lowercase: bool = False, references: Sequence[str] | None = None
) -> Metric:
    """sacreBLEU's metric object for ``name`` (one of ``METRICS``) with its defaults: BLEU
    (13a, exp smoothing), chrF (nc:6, nw:0), chrF++ (chrF with word bigrams, nw:2), TER
    (TERCOM's defaults, which are case-insensitive: ``case:lc`` with or without
    ``lowercase``). ``lowercase`` makes BLEU and chrF case-insensitive (``case:lc``).
    ``references`` (one per hypothesis), if given, are cached in the object.

    Raises:
      ValueError: an unknown name.
    """
    refs = None if references is None else [list(references)]
    if name == "bleu":
        return sacrebleu.BLEU(lowercase=lowercase, references=refs)
    if name in ("chrf", "chrf++"):
        return sacrebleu.CHRF(
            word_order=2 if name == "chrf++" else 0, lowercase=lowercase, references=refs
        )
    if name == "ter":
        return sacrebleu.TER(references=refs)
    raise ValueError(f"unknown metric {name!r}; choose from {','.join(METRICS)}")


@dataclass(frozen=True)
class MetricScore:
    """One corpus score: ``metric`` (a ``METRICS`` name), ``score`` (in [0, 100]; TER can
    exceed 100, lower is better), sacreBLEU's ``signature``."""

    metric: str
    score: float
    signature: str

    def __str__(self) -> str:
        return f"{LABELS[self.metric]} = {self.score:.2f} ({self.signature})"


def score_metrics(
    hypotheses: Sequence[str],
    references: Sequence[str],
    metrics: Sequence[str] = METRICS,
    *,
    names: tuple[str, str] = ("hypotheses", "references"),
    lowercase: bool = False,
) -> list[MetricScore]:
    """Corpus scores of one system for each of ``metrics`` (``make_metric``), in order.

    Raises:
      ValueError: the sides differ in length or are empty; an unknown metric.
    """
    _check_pair(hypotheses, references, names)
    out = []
    for name in metrics:
        metric = make_metric(name, lowercase=lowercase)
        result = metric.corpus_score(list(hypotheses), [list(references)])
        out.append(MetricScore(name, result.score, str(metric.get_signature())))
    return out


@dataclass(frozen=True)
class SystemResult:
    """One system of a ``Comparison``, by metric name: its ``scores``; the ``mean`` and the
    half-width ``ci`` of the 95% confidence interval of the score over the paired-bootstrap
    resamples (sacreBLEU's ``estimate_ci``: the 2.5th and 97.5th percentiles); the p-values
    against the baseline of paired bootstrap resampling (``p_bootstrap``) and approximate
    randomization (``p_ar``), empty for the baseline."""

    name: str
    scores: dict[str, float]
    mean: dict[str, float]
    ci: dict[str, float]
    p_bootstrap: dict[str, float] = field(default_factory=dict)
    p_ar: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Comparison:
    """Systems scored on one test set, the first the baseline (``compare``).

    Attributes:
      metrics: metric names (``METRICS``), in the order asked.
      systems: one ``SystemResult`` per system, the baseline first.
      signatures_bootstrap, signatures_ar: sacreBLEU's signature of each metric in each
        test (its own, plus ``seed`` and ``bs`` or ``ar``: the resamples or trials).
      seed, bootstrap_samples, ar_trials: the tests' settings.
      num_sentences: test sentences.
    """

    metrics: tuple[str, ...]
    systems: list[SystemResult]
    signatures_bootstrap: dict[str, str]
    signatures_ar: dict[str, str]
    seed: int
    bootstrap_samples: int
    ar_trials: int
    num_sentences: int

    def table(self) -> str:
        """A text table: per metric, each system's score, bootstrap mean ± 95% CI and the two
        p-values against the baseline (``*``: p ≤ 0.05, as sacreBLEU marks them), then the
        signatures."""
        width = max(len(s.name) for s in self.systems) + len("baseline: ")
        head = f"{'':<{width}}  {'score':>7}  {'mean ± 95% CI':>15}  {'p (bs)':>8}  {'p (ar)':>8}"
        lines = [
            f"{self.num_sentences} sentences; paired bootstrap resampling "
            f"({self.bootstrap_samples} resamples) and approximate randomization "
            f"({self.ar_trials} trials) against the baseline, seed {self.seed}",
        ]
        for m in self.metrics:
            lines += ["", f"{LABELS[m]:<{width}}" + head[width:]]
            for i, s in enumerate(self.systems):
                name = f"baseline: {s.name}" if i == 0 else s.name
                ci = f"{s.mean[m]:.2f} ± {s.ci[m]:.2f}"
                ps = [
                    f"{p[m]:.4f}" + ("*" if p[m] <= 0.05 else " ") if m in p else ""
                    for p in (s.p_bootstrap, s.p_ar)
                ]
                row = f"{name:<{width}}  {s.scores[m]:>7.2f}  {ci:>15}  {ps[0]:>8}  {ps[1]:>8}"
                lines.append(row.rstrip())
        lines += ["", "signatures (paired bootstrap; approximate randomization):"]
        for m in self.metrics:
            lines.append(f"  {LABELS[m]:<7} {self.signatures_bootstrap[m]}")
            lines.append(f"  {'':<7} {self.signatures_ar[m]}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        """The comparison as JSON-ready values (floats unrounded)."""
        return {
            "num_sentences": self.num_sentences,
            "seed": self.seed,
            "bootstrap_samples": self.bootstrap_samples,
            "ar_trials": self.ar_trials,
            "baseline": self.systems[0].name,
            "signatures": {
                LABELS[m]: {"bootstrap": self.signatures_bootstrap[m], "ar": self.signatures_ar[m]}
                for m in self.metrics
            },
            "systems": [
                {
                    "name": s.name,
                    "baseline": i == 0,
                    **{
                        LABELS[m]: {
                            "score": s.scores[m],
                            "mean": s.mean[m],
                            "ci95": s.ci[m],
                            "p_bootstrap": s.p_bootstrap.get(m),
                            "p_ar": s.p_ar.get(m),
                        }
                        for m in self.metrics
                    },
                }
                for i, s in enumerate(self.systems)
            ],
        }


@contextlib.contextmanager
def _sacrebleu_seed(seed: int) -> Iterator[None]:
    """sacreBLEU's paired tests read their seed from ``SACREBLEU_SEED`` when built: set it."""
    old = os.environ.get("SACREBLEU_SEED")
    os.environ["SACREBLEU_SEED"] = str(seed)
    try:
        yield
    finally:
        if old is None:
            del os.environ["SACREBLEU_SEED"]
        else:
            os.environ["SACREBLEU_SEED"] = old


@contextlib.contextmanager
def _quiet(name: str) -> Iterator[None]:
    """Logger ``name`` at WARNING for the duration."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


def compare(
    systems: Sequence[tuple[str, Sequence[str]]],
    references: Sequence[str],
    metrics: Sequence[str] = METRICS,
    *,
    lowercase: bool = False,
    seed: int = SEED,
    bootstrap_samples: int = BOOTSTRAP_SAMPLES,
    ar_trials: int = AR_TRIALS,
    reference_name: str = "references",
) -> Comparison:
    """Score ``systems`` ((name, hypotheses), the first the baseline) on one test set and
    test each against the baseline with sacreBLEU's ``PairedTest``: paired bootstrap
    resampling (``bootstrap_samples`` resamples, which also give every system's 95% CI) and
    approximate randomization (``ar_trials`` trials), both seeded with ``seed`` as
    ``SACREBLEU_SEED=seed sacrebleu REF -i SYS... --paired-bs`` (``--paired-ar``) is.

    Raises:
      ValueError: fewer than two systems, repeated names, a system whose line count differs
        from the references', an unknown metric, seed < 1 (sacreBLEU leaves a seed of 0
        unfixed for the systems) or a sample count < 1.
    """
    from sacrebleu.significance import PairedTest

    if len(systems) < 2:
        raise ValueError(f"a comparison needs at least two systems, got {len(systems)}")
    names = [n for n, _ in systems]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"system names must differ: {repeated[0]!r} is given twice")
    if seed < 1:
        raise ValueError(f"the paired tests' seed must be >= 1, got {seed}")
    if bootstrap_samples < 1 or ar_trials < 1:
        raise ValueError(
            f"need >= 1 bootstrap resamples and AR trials, got {bootstrap_samples}, {ar_trials}"
        )
    for name, hyps in systems:
        if len(hyps) != len(references):
            raise ValueError(
                f"{name} has {len(hyps)} lines but {reference_name} has {len(references)}"
            )
        _check_pair(hyps, references, (name, reference_name))
    objects = {m: make_metric(m, lowercase=lowercase, references=references) for m in metrics}
    named: list[tuple[str, Sequence[str]]] = [(n, list(h)) for n, h in systems]
    runs: dict[str, Any] = {}
    for test, n in (("bs", bootstrap_samples), ("ar", ar_trials)):
        with _sacrebleu_seed(seed), _quiet("sacrebleu"):  # its INFO lines: one per metric
            paired = PairedTest(named, dict(objects), None, test_type=test, n_samples=n)
            signatures, results = paired()
        # PairedTest keys by sacreBLEU's score names (BLEU, chrF2, chrF2++, TER), in order
        keys = [k for k in results if k != "System"]
        runs[test] = (
            {m: str(signatures[k]) for m, k in zip(metrics, keys)},
            {m: results[k] for m, k in zip(metrics, keys)},
        )
    (sig_bs, res_bs), (sig_ar, res_ar) = runs["bs"], runs["ar"]
    out = []
    for i, name in enumerate(names):
        out.append(
            SystemResult(
                name=name,
                scores={m: float(res_bs[m][i].score) for m in metrics},
                mean={m: float(res_bs[m][i].mean) for m in metrics},
                ci={m: float(res_bs[m][i].ci) for m in metrics},
                p_bootstrap={m: float(res_bs[m][i].p_value) for m in metrics} if i else {},
                p_ar={m: float(res_ar[m][i].p_value) for m in metrics} if i else {},
            )
        )
    return Comparison(
        metrics=tuple(metrics),
        systems=out,
        signatures_bootstrap=sig_bs,
        signatures_ar=sig_ar,
        seed=seed,
        bootstrap_samples=bootstrap_samples,
        ar_trials=ar_trials,
        num_sentences=len(references),
    )


class Decoding(NamedTuple):
    """An opened system of ``evaluate``: its run ``config`` (whose ``data.test`` is the test set
    when no references are given), a ``translator`` (``translate(lines, progress=,
    source=)``: hypotheses per line, best first, as ``seq2seq.translation.Translator``) and
    ``search``, the search as reports name it (``seq2seq.search.Strategy.describe``)."""

    config: Config
    translator: Any
    search: str


@dataclass(frozen=True)
class Decoder:
    """A system ``evaluate`` decodes: its ``name`` and ``open``, which loads it; it is called
    when the system's turn comes, so one model is in memory at a time."""

    name: str
    open: Callable[[], Decoding]


@dataclass(frozen=True)
class Timing:
    """How long a decoded system took: ``sentences`` in ``seconds`` with ``search``."""

    system: str
    sentences: int
    seconds: float
    search: str

    def __str__(self) -> str:
        return (
            f"{self.sentences} sentences in {self.seconds:.1f} s "
            f"({self.sentences / self.seconds:.1f} sentences/s), {self.search}"
        )


@dataclass(frozen=True)
class Report:
    """What ``evaluate`` found.

    Attributes:
      systems: every system's (name, hypotheses): the hypothesis files first, then the decoded.
      scores: one system's ``Scores`` (bleu and chrF by default) or ``MetricScore`` list, the
        ``Comparison`` of several, or None (several systems scored by COMET alone).
      comet: COMET score by system name (empty without COMET); ``comet_model`` its checkpoint.
      timings: one per decoded system, in order.
    """

    systems: list[tuple[str, list[str]]]
    scores: Scores | list[MetricScore] | Comparison | None
    comet: dict[str, float] = field(default_factory=dict)
    comet_model: str | None = None
    timings: list[Timing] = field(default_factory=list)

    def decoded(self) -> list[tuple[str, list[str]]]:
        """The (name, hypotheses) of the systems that were decoded (not read)."""
        names = {t.system for t in self.timings}
        return [s for s in self.systems if s[0] in names]

    def to_json(self) -> dict[str, Any]:
        """The report as ``seq2seq-evaluate --json`` writes it: one system's scores with
        their signatures (``{"system": ..., "BLEU": {"score", "signature"}, ...}``) or the
        comparison (``Comparison.to_json``), and ``COMET`` (model and scores) when scored."""
        out: dict[str, Any] = {}
        scores = self.scores
        if len(self.systems) == 1:
            if isinstance(scores, Scores):
                listed = [
                    MetricScore("bleu", scores.bleu, scores.bleu_signature),
                    MetricScore("chrf", scores.chrf, scores.chrf_signature),
                ]
            else:
                listed = scores if isinstance(scores, list) else []
            out = {
                "system": self.systems[0][0],
                **{LABELS[s.metric]: {"score": s.score, "signature": s.signature} for s in listed},
            }
        elif isinstance(scores, Comparison):
            out = scores.to_json()
        if self.comet:
            out["COMET"] = {"model": self.comet_model, "scores": dict(self.comet)}
        return out

    def text(self) -> str:
        """The lines ``seq2seq-evaluate`` prints: the scores (or the comparison's table),
        COMET, and each decoded system's time."""
        blocks = []
        if isinstance(self.scores, list):
            if self.scores:  # none: COMET alone
                blocks.append("\n".join(str(s) for s in self.scores))
        elif isinstance(self.scores, Comparison):
            blocks.append(self.scores.table())
        elif self.scores is not None:
            blocks.append(str(self.scores))
        several = len(self.systems) > 1
        for name, value in self.comet.items():
            where = f"{name}; " if several else ""
            blocks.append(f"COMET = {value:.4f} ({where}model {self.comet_model})")
        for t in self.timings:
            blocks.append((f"{t.system}: " if len(self.timings) > 1 else "") + str(t))
        return "\n".join(blocks)


def evaluate(
    references: str | None,
    *,
    hypotheses: Sequence[str] = (),
    sources: str | None = None,
    decoders: Sequence[Decoder] = (),
    metrics: Sequence[str] | None = None,
    lowercase: bool = False,
    allow_pieces: bool = False,
    comet_model: str | None = None,
    seed: int = SEED,
    bootstrap_samples: int = BOOTSTRAP_SAMPLES,
    ar_trials: int = AR_TRIALS,
    output_name: str | None = None,
) -> Report:
    """Score systems on one test set: the work of ``seq2seq-evaluate``.

    The systems are the hypothesis files ``hypotheses`` (in order) and then the ``decoders``,
    each opened in turn and run on ``sources`` (without ``references``: on its run's test
    split, every test corpus with its tag). One system gets its scores (``score``, or
    ``score_metrics`` with ``metrics``); several are compared (``compare``: paired
    significance tests against the first, seeded with ``seed``). COMET in ``metrics`` scores
    each system with the checkpoint ``comet_model`` (``comet_scores``), besides the others.

    Args:
      references: the reference file, aligned with ``sources`` (None: the run's test split).
      hypotheses: files of detokenized hypotheses, one system each.
      sources: the source file (decoded, and read by COMET).
      decoders: the systems to decode.
      metrics: parsed (``parse_metrics``); None: BLEU and chrF for one system, all four
        sacreBLEU metrics for several.
      lowercase: case-insensitive BLEU and chrF.
      allow_pieces: score references that hold SentencePiece pieces (with a warning).
      output_name: where one decoded system's translations are written, as the warning about
        pieces in them names it (default: ``the translations of NAME``).

    Returns:
      the ``Report``.

    Raises:
      ValueError: a file is unreadable text, ``sources`` and ``references`` differ in length,
        the references hold pieces without ``allow_pieces``, a system's line count differs
        from the references', or as ``open`` of a decoder, ``score_metrics`` and ``compare``.
      OSError: a file cannot be read.
    """
    from seq2seq.data.pipeline import split_text
    from seq2seq.data.sources import read_lines

    comet = metrics is not None and COMET in metrics
    comet_checkpoint = load_comet(comet_model) if comet else None
    sacre = [m for m in metrics or () if m != COMET]
    systems = [(path, read_lines(path)) for path in hypotheses]
    refs: list[str] = []
    source_lines: list[str] = []
    if references:
        refs = read_lines(references)
        if sources:
            source_lines = read_lines(sources)
            if len(source_lines) != len(refs):
                raise ValueError(
                    f"{sources} has {len(source_lines)} lines but {references} has {len(refs)}"
                )
        pieces = pieces_message(references, refs)
        if pieces and not allow_pieces:
            raise ValueError(f"{pieces}; or pass --allow-pieces to score them as they are")
    timings = []
    for decoder in decoders:
        opened = decoder.open()
        if not references:
            test = split_text(opened.config, "test")  # every test corpus, with its tag
            source_lines, refs = test.sources, test.targets
        start = time.perf_counter()
        hyps = [
            h[0].text
            for h in opened.translator.translate(source_lines, progress=True, source=sources)
        ]
        seconds = max(time.perf_counter() - start, 1e-9)
        timings.append(Timing(decoder.name, len(hyps), seconds, opened.search))
        systems.append((decoder.name, hyps))
    ref_name = references or "test references"
    scores: Scores | list[MetricScore] | Comparison | None = None
    if len(systems) == 1:
        name = systems[0][0]
        # the warning about pieces names the file (a hypothesis file, or the translations')
        names = (name if hypotheses else output_name or f"the translations of {name}", ref_name)
        hyps = systems[0][1]
        if metrics is None:
            scores = score(hyps, refs, names=names, lowercase=lowercase)
        else:
            scores = score_metrics(hyps, refs, sacre, names=names, lowercase=lowercase)
    elif metrics is None or sacre:
        scores = compare(
            systems,
            refs,
            sacre or METRICS,
            lowercase=lowercase,
            seed=seed,
            bootstrap_samples=bootstrap_samples,
            ar_trials=ar_trials,
            reference_name=ref_name,
        )
    comet_found = {}
    if comet_checkpoint is not None:
        values = comet_scores(comet_checkpoint, [h for _, h in systems], source_lines, refs)
        comet_found = {name: value for (name, _), value in zip(systems, values)}
    return Report(systems, scores, comet_found, comet_model, timings)
