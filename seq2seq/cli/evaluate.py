"""``seq2seq-evaluate`` (decode and score, compare systems) and ``seq2seq-score`` (score
given translations)."""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from seq2seq.cli.common import (
    BATCH_NOTE,
    _add_matmul_option,
    _add_model_options,
    _decode_parser,
    _fail,
    _format_words,
    _load,
    _members,
    _positive_int,
    _read_lines,
    _setup_logging,
    _translator,
    flag_type,
)

if TYPE_CHECKING:
    from seq2seq.evaluation import Decoder, Decoding


def evaluate_main(argv: Sequence[str] | None = None) -> int:
    """``seq2seq-evaluate --workdir DIR [--src FILE --ref FILE]``: decode, score (sacreBLEU);
    with several systems (``--hyp`` files, ``--compare``'d runs or checkpoints), paired
    significance tests against the first (``evaluation.compare``). The work is
    ``evaluation.evaluate``'s; this parses the flags, writes the files and prints the report."""
    parser = _decode_parser(
        "seq2seq-evaluate",
        "Decode a source file with a trained run and score "
        "it against a reference file (BLEU, chrF). Default: the run's test split. With several "
        "systems (--hyp files, or --compare with several --workdir or --step), compare them "
        "on one test set: scores, 95%% confidence intervals and paired significance tests "
        "against the first system (sacreBLEU's paired bootstrap resampling and approximate "
        "randomization).",
        workdir_required=False,
    )
    parser.add_argument("--src", help="source file, one sentence per line")
    parser.add_argument("--ref", help="reference file, aligned with --src")
    parser.add_argument("--output", help="write hypotheses here")
    parser.add_argument(
        "--allow-pieces",
        action="store_true",
        help="score a --ref file whose lines contain SentencePiece pieces ('▁') "
        "as it is, with a warning (default: refuse it)",
    )
    _add_evaluate_options(parser)
    args = parser.parse_args(argv)
    if not args.workdir and not args.hyp:
        return _fail("give --workdir (a run to decode with) or --hyp (hypothesis files)")
    if args.workdir and (args.src is None) != (args.ref is None):
        return _fail("give both --src and --ref, or neither (to use the run's test split)")
    from seq2seq import evaluation

    try:
        metrics = evaluation.parse_metrics(args.metrics) if args.metrics else None
    except ValueError as e:
        return _fail(str(e))
    comet = metrics is not None and evaluation.COMET in metrics
    if not args.workdir and not args.ref:
        return _fail("--hyp without --workdir needs --ref")
    if not args.workdir and args.src and not comet:
        return _fail("--src without --workdir is only read by --metrics comet (nothing is decoded)")
    if not args.workdir and comet and not args.src:
        return _fail("--metrics comet needs the sources: give --src")
    _setup_logging()
    try:
        decoders = _evaluate_models(args) if args.workdir else []
        if len(args.hyp or []) + len(decoders) > 1 and args.output:
            return _fail("--output takes one system's hypotheses: use --hyp-dir with several")
        report = evaluation.evaluate(
            args.ref,
            hypotheses=args.hyp or [],
            sources=args.src,
            decoders=decoders,
            metrics=metrics,
            lowercase=args.lowercase,
            allow_pieces=args.allow_pieces,
            comet_model=args.comet_model,
            seed=args.paired_seed,
            bootstrap_samples=args.paired_bs_n,
            ar_trials=args.paired_ar_n,
            output_name=args.output,
        )
        if args.output:
            hyps = report.systems[0][1]
            Path(args.output).write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
        if args.hyp_dir:
            _write_hyp_dir(args.hyp_dir, report.decoded())
        if args.json:
            import json

            text = json.dumps(report.to_json(), indent=2) + "\n"
            Path(args.json).write_text(text, encoding="utf-8")
    except (ValueError, OSError, RuntimeError) as e:
        return _fail(str(e))
    if report.text():
        print(report.text())
    return 0


def _add_evaluate_options(parser: argparse.ArgumentParser) -> None:
    from seq2seq import evaluation

    group = parser.add_argument_group("metrics and systems compared (sacreBLEU)")
    group.add_argument(
        "--metrics",
        help=f"comma-separated, of {','.join(evaluation.METRICS)} and comet (the comet extra; "
        "--comet-model) (default: bleu,chrf for one system, all four sacreBLEU metrics for "
        "several)",
    )
    group.add_argument(
        "--lowercase",
        action="store_true",
        help="case-insensitive BLEU and chrF (sacreBLEU's lowercase, case:lc in the "
        "signature; TER is case-insensitive either way, as in TERCOM)",
    )
    group.add_argument(
        "--hyp",
        action="append",
        help="a system's detokenized hypotheses, aligned with --ref; repeat it for several "
        "systems (the first is the baseline; decoded --workdir systems come after)",
    )
    group.add_argument(
        "--compare",
        action="store_true",
        help="each --workdir, or each --step of one --workdir, is a system of its own "
        "(default: one ensemble of them)",
    )
    group.add_argument(
        "--paired-bs-n",
        type=_positive_int,
        default=evaluation.BOOTSTRAP_SAMPLES,
        help="paired bootstrap resamples (also give the 95%% CIs; default %(default)s)",
    )
    group.add_argument(
        "--paired-ar-n",
        type=_positive_int,
        default=evaluation.AR_TRIALS,
        help="approximate randomization trials (default %(default)s)",
    )
    group.add_argument(
        "--paired-seed",
        type=_positive_int,
        default=evaluation.SEED,
        help="seed of both paired tests (sacreBLEU's SACREBLEU_SEED; default %(default)s)",
    )
    group.add_argument(
        "--comet-model",
        help="--metrics comet: a local COMET checkpoint file (.ckpt; needs the comet extra; "
        "nothing is downloaded)",
    )
    group.add_argument("--json", help="also write the scores (or the comparison) here as JSON")
    group.add_argument(
        "--hyp-dir", help="write each decoded system's hypotheses into this directory"
    )


def _evaluate_models(args) -> list[Decoder]:
    """The ``evaluation.Decoder`` of each decoded system: one (a model or an ensemble), or
    with ``--compare`` one per member of ``_members``, named ``DIR`` or ``DIR@STEP``; each
    opens with the command line's decoding options (``_load``)."""
    from seq2seq.evaluation import Decoder

    if not args.compare:
        names = [f"{w}@{s}" if s is not None else w for w, s in _members(args)]
        return [Decoder(" + ".join(names), lambda: _open(args))]
    out = []
    for w, s in _members(args):
        one = argparse.Namespace(**vars(args))
        one.workdir, one.workdirs = w, [w]
        one.step, one.steps = s, None if s is None else [s]
        out.append(Decoder(w if s is None else f"{w}@{s}", functools.partial(_open, one)))
    return out


def _open(args) -> Decoding:
    """``evaluation.Decoding`` of the model of ``args`` (``--workdir``/``--step`` and the
    decoding options)."""
    from seq2seq.evaluation import Decoding

    opened = _load(args)
    return Decoding(opened.config, _translator(args, opened), opened.strategy.describe())


def _write_hyp_dir(directory: str, systems: list[tuple[str, list[str]]]) -> None:
    """Each system's hypotheses as ``DIR/<name>.txt`` (``/`` and ``@`` in names become ``_``)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    for name, hyps in systems:
        safe = name.strip("/").replace("/", "_").replace("@", "_").replace(" + ", "+")
        (out / f"{safe}.txt").write_text("".join(h + "\n" for h in hyps), encoding="utf-8")


def score_main(argv: Sequence[str] | None = None) -> int:
    """``seq2seq-score --workdir DIR --src FILE --tgt FILE``: log-probability of each given
    translation under the run (teacher forcing)."""
    parser = argparse.ArgumentParser(
        prog="seq2seq-score",
        description="Score given translations with a trained run (or an ensemble): one line "
        "per pair, 'line ||| logprob ||| logprob per token ||| score', where the score is "
        "normalised by the run's length penalty as beam search ranks hypotheses; EOS counts. "
        + BATCH_NOTE,
    )
    _add_model_options(parser)
    _add_matmul_option(parser)
    parser.add_argument("--src", required=True, help="source file, one sentence per line")
    parser.add_argument("--tgt", required=True, help="translations, aligned with --src")
    parser.add_argument("--output", help="output file (default: standard output)")
    parser.add_argument(
        "--word-scores",
        action="store_true",
        help="add a last field of 'piece=logprob' per target piece, EOS included",
    )
    parser.add_argument("--alpha", type=flag_type("decode.alpha"), help="length-penalty exponent")
    parser.add_argument(
        "--max-tokens", type=flag_type("decode.max_tokens"), help="tokens per batch"
    )
    parser.add_argument(
        "--max-src-tokens",
        type=_positive_int,
        help="source limit in tokens, EOS included (as seq2seq-translate)",
    )
    parser.add_argument(
        "--on-long",
        choices=("truncate", "reject"),
        default="truncate",
        help="truncate a longer source (warning with its line number) or reject the input",
    )
    args = parser.parse_args(argv)
    _setup_logging()
    if args.output and not Path(args.output).parent.is_dir():
        return _fail(f"--output {args.output}: no directory {Path(args.output).parent}")
    try:
        sources, targets = _read_lines(args.src), _read_lines(args.tgt)
        if len(sources) != len(targets):
            longer, shorter = (
                (args.src, args.tgt)
                if len(sources) > len(targets)
                else (
                    args.tgt,
                    args.src,
                )
            )
            n = min(len(sources), len(targets))
            return _fail(
                f"{args.src} has {len(sources)} lines but {args.tgt} has {len(targets)}: "
                f"{longer}:{n + 1} has no line in {shorter} to pair with"
            )
        translator = _translator(args, _load(args))
        scored = translator.score(sources, targets, source=args.src)
    except (ValueError, OSError, RuntimeError) as e:
        return _fail(str(e))
    text = "".join(
        f"{i} ||| {sc.logprob:.4f} ||| {sc.per_token:.4f} ||| {sc.score:.4f}"
        + (f" ||| {_format_words(sc)}" if args.word_scores else "")
        + "\n"
        for i, sc in enumerate(scored)
    )
    if args.output:
        try:
            Path(args.output).write_text(text, encoding="utf-8")
        except OSError as e:
            return _fail(str(e))
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
    return 0
