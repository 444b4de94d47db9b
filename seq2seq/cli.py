"""Command-line entry points: ``seq2seq-train``, ``seq2seq-evaluate``, ``seq2seq-translate``,
``seq2seq-score``, ``seq2seq-average`` and ``seq2seq-plot``.

The command line only wires modules together; every option maps to a config key.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from seq2seq.config import ConfigError, choices, config_yaml, load_config


def _setup_logging(workdir: Path | None = None) -> None:
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if workdir is not None:
        workdir.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(workdir / "train.log", encoding="utf-8"))
    logging.basicConfig(
        level=logging.INFO,
        handlers=handlers,
        force=True,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("absl", "jax", "orbax", "datasets", "fsspec", "urllib3", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def _config_from_argv(prog: str, description: str, argv: Sequence[str] | None):
    """Parse ``[--config FILE] [key=value ...]`` into a Config (or exit code 2 on a bad one)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--config", help="YAML config (see configs/)")
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. train.steps=100")
    args = parser.parse_args(argv)
    try:
        return load_config(args.config, args.overrides)
    except ConfigError as e:
        return _fail(str(e))


def train_main(argv: Sequence[str] | None = None) -> int:
    """``seq2seq-train --config FILE [key=value ...]``: train, resume, then report test BLEU."""
    config = _config_from_argv(
        "seq2seq-train",
        "Train (or resume) a Transformer NMT run, then "
        "score the test split with sacreBLEU. Rerun the same command to "
        "resume.",
        argv,
    )
    if isinstance(config, int):
        return config
    from seq2seq.resolve import resolve_config  # heavy imports
    from seq2seq.run import Interrupted, train
    from seq2seq.sharding import initialize_distributed, is_main_process

    initialize_distributed(config.distributed)  # before any device use; no-op for one process
    try:  # every check that needs no data, before the run directory or its log exist (or move)
        run = resolve_config(config)
    except (ValueError, FileNotFoundError) as e:
        return _fail(str(e))
    config = run.config
    try:
        _setup_logging(Path(config.workdir) if is_main_process() else None)  # one train.log
    except OSError as e:  # the workdir is a file, or cannot be created
        return _fail(f"workdir={config.workdir}: cannot hold the run: {e}")
    for note in run.notes:
        logging.getLogger(__name__).info("%s", note)
    logging.getLogger(__name__).info("config:\n%s", config_yaml(config))
    try:
        summary = train(run)
    except Interrupted as e:
        print(str(e), file=sys.stderr)
        return 128 + e.signum  # 130 for SIGINT (Ctrl-C), 143 for SIGTERM
    except KeyboardInterrupt:  # before the training loop (data, tokenizer): nothing to save
        print(
            "interrupted before training started; no checkpoint was written by this run",
            file=sys.stderr,
        )
        return 130
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        return _fail(str(e))
    best = summary["best"]
    status = {
        "finished": "",
        "early_stopping": " (stopped early)",
        "max_seconds": " (train.max_seconds reached)",
    }.get(summary["status"], "")
    value = "–" if best["value"] is None else f"{best['value']:.4g}"
    print(
        f"\nstep {summary['step']}{status}: best dev {best['metric']} {value} "
        f"at step {best['step']}"
    )
    print(
        f"test BLEU {summary['test_bleu']:.2f}, chrF {summary['test_chrf']:.2f} on "
        f"{summary['test_sentences']} sentences (checkpoint of step {summary['test_step']})"
    )
    print(f"  {summary['bleu_signature']}\n  {summary['chrf_signature']}")
    print(
        f"  train {summary['train_seconds'] / 60:.1f} min, dev evaluation "
        f"{summary['eval_seconds'] / 60:.1f} min, test decode {summary['decode_seconds']:.0f} s, "
        f"wall {summary['wall_seconds'] / 60:.1f} min; {summary['tokens_seen']:,} tokens seen"
    )
    print(f"  outputs in {config.workdir} (see summary.md)")
    print("\nexamples:")
    for ex in summary["examples"]:
        print(f"  SRC {ex['source']}\n  REF {ex['reference']}\n  HYP {ex['hypothesis']}\n")
    return 0


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be ≥ 1, got {value}")
    return value


def _nonnegative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be ≥ 0, got {value}")
    return value


def _nonnegative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be ≥ 0, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def _unit_interval(text: str) -> float:
    value = float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {value}")
    return value


def _probability(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value}")
    return value


# command-line option → decode config key (None = keep the run's value)
_DECODE_OPTIONS = {
    "search": "search",
    "beam": "beam_size",
    "alpha": "alpha",
    "min_length": "min_length",
    "max_tokens": "max_tokens",
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "epsilon": "epsilon",
    "seed": "seed",
    "mbr_size": "mbr_size",
    "mbr_candidates": "mbr_candidates",
}
_SAMPLING_ONLY = ("temperature", "top_k", "top_p", "epsilon", "seed")


class _Repeatable(argparse.Action):
    """A repeatable option: every value in ``<dest>s`` (a list), the first in ``<dest>``."""

    def __call__(self, parser, namespace, values, option_string=None):
        items = [*(getattr(namespace, self.dest + "s", None) or []), values]
        setattr(namespace, self.dest + "s", items)
        setattr(namespace, self.dest, items[0])


def _add_model_options(parser: argparse.ArgumentParser, workdir_required: bool = True) -> None:
    """``--workdir`` and ``--step``, each repeatable: several make an ensemble."""
    parser.add_argument(
        "--workdir",
        required=workdir_required,
        action=_Repeatable,
        help="run directory written by seq2seq-train; repeat it for an ensemble of the runs "
        "(they must share the SentencePiece model(s) and decode config)",
    )
    parser.add_argument(
        "--step",
        type=int,
        action=_Repeatable,
        help="checkpoint step (default: the one the run's test score used: the best by "
        "train.best_metric, else the latest); repeat it with one --workdir for an ensemble of "
        "that run's checkpoints, or give one per --workdir",
    )
    parser.set_defaults(workdirs=None, steps=None)


# where scores are shown (translate --nbest/--word-scores, score): why they move with the batch
BATCH_NOTE = (
    "With the run's model.matmul_dtype bfloat16 (the shipped preset's) a sentence's "
    "log-probability and score depend slightly (~1e-3, more on long sentences) on the other "
    "sentences of its batch; --matmul-dtype float32 makes them agree to ~1e-5 (the "
    "translations rarely change; docs/design.md, 'Scores and the batch')."
)


def _add_matmul_option(parser: argparse.ArgumentParser) -> None:
    """``--matmul-dtype``: the operand dtype of the projections at inference."""
    parser.add_argument(
        "--matmul-dtype",
        choices=("float32", "bfloat16"),
        help="operand dtype of every projection (default: the run's model.matmul_dtype); "
        "float32 gives scores that do not depend on the batch",
    )


def _decode_parser(
    prog: str, description: str, workdir_required: bool = True
) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    _add_model_options(parser, workdir_required)
    search = parser.add_argument_group("search (defaults: the run's decode config)")
    search.add_argument(
        "--search",
        choices=choices("decode.search"),
        help="decoding method: beam search, greedy search, sampling, or MBR (minimum Bayes "
        "risk: the candidate with the highest mean chrF against the others)",
    )
    search.add_argument(
        "--beam", type=_positive_int, help="beam size of --search beam (1 = greedy search)"
    )
    search.add_argument("--alpha", type=_nonnegative_float, help="length-penalty exponent")
    search.add_argument(
        "--min-length", type=_nonnegative_int, help="at least this many tokens before EOS"
    )
    search.add_argument("--max-tokens", type=_positive_int, help="source tokens per batch")
    sampling = parser.add_argument_group("sampling (--search sampling, or MBR's candidates)")
    sampling.add_argument(
        "--sampling",
        dest="search",
        action="store_const",
        const="sampling",
        help="--search sampling: --nbest N then gives N independent samples per line",
    )
    sampling.add_argument("--temperature", type=_positive_float, help="default 1")
    sampling.add_argument(
        "--top-k", type=_nonnegative_int, help="sample among the K most probable tokens (0 = all)"
    )
    sampling.add_argument(
        "--top-p",
        type=_probability,
        help="nucleus sampling: smallest set with this probability mass",
    )
    sampling.add_argument(
        "--epsilon",
        type=_unit_interval,
        help="epsilon sampling: drop tokens less probable than this (0 = off; default: "
        "0.02 for MBR's sampled candidates, else off)",
    )
    sampling.add_argument(
        "--seed", type=int, help="a line's samples depend on the seed and its line number only"
    )
    mbr = parser.add_argument_group("MBR (--search mbr)")
    mbr.add_argument(
        "--mbr-size", type=_positive_int, help="candidates per sentence, also the references"
    )
    mbr.add_argument(
        "--mbr-candidates",
        choices=choices("decode.mbr_candidates"),
        help="candidates from sampling (the sampling options) or the n-best of a beam of "
        "--mbr-size",
    )
    long = parser.add_argument_group("long inputs")
    long.add_argument(
        "--max-src-tokens",
        type=_positive_int,
        help="source limit in tokens, EOS included (default: max(data.max_len, "
        "256), at most model.max_len with learned positions)",
    )
    long.add_argument(
        "--on-long",
        choices=("truncate", "reject"),
        default="truncate",
        help="truncate a longer line (warning with its line number) or reject the "
        "input (default: truncate)",
    )
    return parser


def _members(args) -> list[tuple[str, int | None]]:
    """The (workdir, step) of each model given by ``--workdir`` and ``--step``
    (``seq2seq.inference.members``)."""
    from seq2seq.inference import members

    workdirs = getattr(args, "workdirs", None) or [args.workdir]
    chosen = members(workdirs, getattr(args, "steps", None))
    return [(str(workdir), step) for workdir, step in chosen]


def _load(args, chosen=None):
    """The model(s) of ``--workdir``/``--step`` (or ``chosen``: ``(workdir, step)`` of each)
    with the command line's decoding options (``seq2seq.inference.Opened``).

    Raises:
      ValueError: a sampling option without a search that samples, ``--beam`` without beam
        search (MBR's candidate beam is ``--mbr-size``), or as ``open_run``.
    """
    from seq2seq.inference import open_run

    changes = {
        key: getattr(args, opt)
        for opt, key in _DECODE_OPTIONS.items()
        if getattr(args, opt, None) is not None
    }
    opened = open_run(
        chosen or _members(args),
        decode_changes=changes,
        matmul_dtype=getattr(args, "matmul_dtype", None),  # --matmul-dtype (translate, score)
    )
    if not opened.strategy.samples():
        given = [
            f"--{o.replace('_', '-')}" for o in _SAMPLING_ONLY if getattr(args, o, None) is not None
        ]
        if given:
            verb = "applies" if len(given) == 1 else "apply"
            raise ValueError(
                f"{', '.join(given)} only {verb} with --sampling (or --search mbr with "
                "sampled candidates)"
            )
    if getattr(args, "beam", None) is not None and opened.decode.search != "beam":
        raise ValueError(
            f"--beam only applies with --search beam, not {opened.decode.search} (MBR's "
            "candidates with --mbr-candidates beam are the n-best of a beam of --mbr-size)"
        )
    return opened


def _translator(args, opened, partitioner=None):
    """``opened``'s ``Translator`` under ``--max-src-tokens`` and ``--on-long``."""
    return opened.translator(
        max_src_tokens=args.max_src_tokens, on_long=args.on_long, partitioner=partitioner
    )


def _read_lines(path: str | None) -> list[str]:
    """Lines of a file or standard input (None / ``-``), read as the training loaders read
    them (``seq2seq.data.sources.read_lines``: no byte-order mark, CRLF or LF).

    Raises:
      DataError (a ValueError): unreadable file or invalid UTF-8 (names the file and line).
    """
    from seq2seq.data.sources import read_lines

    return read_lines(path)


def _alignments_path(args) -> str | int | None:
    """Where ``--alignments`` go (None: not asked for), or exit status 2 for a bad choice."""
    if args.alignments is None:
        if args.alignments_output:
            return _fail("--alignments-output needs --alignments hard or soft")
        return None
    path = args.alignments_output or (
        args.output and args.output + (".align" if args.alignments == "hard" else ".align.jsonl")
    )
    if not path:
        return _fail("--alignments needs --output or --alignments-output (a file to write)")
    if not Path(path).parent.is_dir():
        return _fail(f"--alignments-output {path}: no directory {Path(path).parent}")
    return path


def _format_words(scored) -> str:
    """``piece=logprob`` of each scored piece (EOS last), space-separated (pieces hold no
    space: SentencePiece writes it as ``▁``)."""
    return " ".join(f"{p}={v:.4f}" for p, v in zip(scored.pieces, scored.token_logprobs))


def _word_scores(translator, lines, results, source) -> list[list[str]]:
    """The ``--word-scores`` field of every hypothesis: its pieces rescored by teacher forcing
    (``Translator.score``), empty for a line that was not decoded (empty, no prefix)."""
    pairs = [(i, j) for i, hyps in enumerate(results) for j, h in enumerate(hyps) if h.decoded]
    scored = translator.score(
        [lines[i] for i, _ in pairs], [results[i][j].tokens for i, j in pairs], source=source
    )
    words = [[""] * len(hyps) for hyps in results]
    for (i, j), sc in zip(pairs, scored):
        words[i][j] = _format_words(sc)
    return words


def translate_main(argv: Sequence[str] | None = None) -> int:
    """``seq2seq-translate --workdir DIR [--input FILE] [--output FILE]``: one sentence per line."""
    parser = _decode_parser(
        "seq2seq-translate",
        "Translate sentences (one per line) from a file "
        "or standard input with a trained run; output keeps the input order. " + BATCH_NOTE,
    )
    _add_matmul_option(parser)
    parser.add_argument("--input", help="input file (default or '-': standard input)")
    parser.add_argument("--output", help="output file (default: standard output)")
    parser.add_argument(
        "--nbest",
        type=_positive_int,
        default=1,
        help="print the N best hypotheses (samples with --sampling) of each line "
        "as 'line ||| text ||| logprob ||| score', line numbers from 0",
    )
    parser.add_argument(
        "--alignments",
        choices=("hard", "soft"),
        help="also write each hypothesis's alignment from the cross-attention (one line per "
        "output line): hard = Pharaoh 'i-j' (source piece - target piece), soft = JSON lines",
    )
    parser.add_argument(
        "--alignments-output",
        help="alignment file (default: OUTPUT.align for hard, OUTPUT.align.jsonl for soft)",
    )
    parser.add_argument(
        "--prefix-file",
        help="target prefixes, one per input line (an empty line: none): each translation "
        "starts with its prefix's pieces, which count in its log-probability and score",
    )
    parser.add_argument(
        "--word-scores",
        action="store_true",
        help="print the n-best format with a last field of 'piece=logprob' per output piece, "
        "EOS included (the numbers seq2seq-score prints for that pair)",
    )
    _add_bulk_options(parser)
    args = parser.parse_args(argv)
    _setup_logging()
    if args.output and not Path(args.output).parent.is_dir():  # before, not after, decoding
        return _fail(f"--output {args.output}: no directory {Path(args.output).parent}")
    if args.output_dir or _BULK_ONLY & {k for k, v in vars(args).items() if v is not None}:
        return _translate_bulk(args)
    align_path = _alignments_path(args)
    if isinstance(align_path, int):
        return align_path
    stdin = args.input in (None, "-")
    try:  # a file is read first (a bad path fails at once); standard input after the run loads
        if not stdin:
            lines = _read_lines(args.input)
        prefixes = None if args.prefix_file is None else _read_lines(args.prefix_file)
        opened = _load(args)
        if align_path and opened.models > 1:
            raise ValueError("--alignments needs one model, not an ensemble")
        if stdin:
            lines = _read_lines(args.input)
        translator = _translator(args, opened)
        source = args.input if args.input not in (None, "-") else "<stdin>"
        translator.log_unknown_rate(lines, source)
        forced = {} if prefixes is None else dict(prefixes=prefixes, prefix_source=args.prefix_file)
        results = translator.translate(
            lines, nbest=args.nbest, progress=args.input not in (None, "-"), source=source, **forced
        )
        words = _word_scores(translator, lines, results, source) if args.word_scores else None
        if align_path:
            from seq2seq.alignment import alignment_lines

            aligned = alignment_lines(translator, lines, results, args.alignments)
            Path(align_path).write_text("".join(a + "\n" for a in aligned), encoding="utf-8")
    except (ValueError, OSError, RuntimeError) as e:
        return _fail(str(e))
    if words is not None:
        text = "".join(
            f"{i} ||| {h.text} ||| {h.logprob:.4f} ||| {h.score:.4f} ||| {w}\n"
            for i, (hyps, line_words) in enumerate(zip(results, words))
            for h, w in zip(hyps, line_words)
        )
    elif args.nbest == 1:
        text = "".join(hyps[0].text + "\n" for hyps in results)
    else:
        text = "".join(
            f"{i} ||| {h.text} ||| {h.logprob:.4f} ||| {h.score:.4f}\n"
            for i, hyps in enumerate(results)
            for h in hyps
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


def _add_bulk_options(parser: argparse.ArgumentParser) -> None:
    bulk = parser.add_argument_group(
        "bulk translation (resumable: rerun the same command after an interruption)"
    )
    bulk.add_argument(
        "--output-dir",
        help="translate --input in chunks written here (skipped on rerun), then merge them "
        "into --output (default OUTPUT_DIR/translations.txt); see seq2seq/bulk.py",
    )
    bulk.add_argument("--chunk-lines", type=_positive_int, help="lines per chunk (default 10000)")
    bulk.add_argument(
        "--coordinator-address",
        help="host:port of process 0 for a multi-process job (jax.distributed, as "
        "distributed.* in training); each process decodes its share of the chunks",
    )
    bulk.add_argument("--num-processes", type=_positive_int, help="processes of the job")
    bulk.add_argument("--process-id", type=_nonnegative_int, help="this process's index")


_BULK_ONLY = {"chunk_lines", "coordinator_address", "num_processes", "process_id"}


def _translate_bulk(args) -> int:
    """``seq2seq-translate --output-dir DIR``: ``seq2seq.bulk.translate_file`` on this
    process's share of the chunks; process 0 merges them and prints the report."""
    if not args.output_dir:
        given = sorted(k for k in _BULK_ONLY if getattr(args, k) is not None)
        return _fail(f"--{', --'.join(given).replace('_', '-')} only apply with --output-dir")
    unsupported = [
        name
        for name, given in (
            ("--nbest", args.nbest != 1),
            ("--alignments", args.alignments),
            ("--prefix-file", args.prefix_file),
            ("--word-scores", args.word_scores),
        )
        if given
    ]
    if unsupported:
        return _fail(
            f"--output-dir does not take {', '.join(unsupported)}: one line out per line in"
        )
    if args.input in (None, "-"):
        return _fail("--output-dir needs --input FILE (a rerun must find the same input)")
    from seq2seq import bulk
    from seq2seq.config import DistributedConfig
    from seq2seq.sharding import initialize_distributed

    initialize_distributed(
        DistributedConfig(args.coordinator_address, args.num_processes, args.process_id)
    )
    try:
        lines = _read_lines(args.input)
        chosen = bulk.resolve_members(_members(args))  # the default checkpoint, fixed now
        opened = _load(args, chosen)
        translator = _translator(args, opened, bulk.local_partitioner(opened.config))
        chunk_lines = args.chunk_lines or 10000
        job = bulk.job_record(
            args.input, len(lines), chunk_lines, chosen, opened.configs, translator
        )
        report = bulk.translate_file(
            translator, lines, job, args.output_dir, args.output, source=args.input
        )
    except KeyboardInterrupt:  # Ctrl-C: every chunk written so far is complete and kept
        print(
            f"interrupted; the finished chunks are kept in {args.output_dir}: rerun the same "
            "command to resume",
            file=sys.stderr,
        )
        return 130
    except (ValueError, OSError, RuntimeError) as e:
        return _fail(str(e))
    if "totals" in report:
        t, run = report["totals"], report["run"]
        print(
            f"{t['lines']} lines in {report['chunks']} chunks → {report['output']}: "
            f"{t['empty']} empty, {t['truncated']} over the source limit (truncated), "
            f"{t['empty_outputs']} empty translations, {t['line_breaks']} line breaks in "
            "translations replaced by spaces",
            file=sys.stderr,
        )
        print(
            f"this run: {run['chunks']} chunks decoded ({run['skipped']} done before), "
            f"{run['lines']} sentences in {run['seconds']:.1f} s: "
            f"{run['sentences_per_s']:.1f} sentences/s, {run['tokens_per_s']:.1f} tokens/s "
            f"on {report['processes']} process(es)",
            file=sys.stderr,
        )
    return 0


def evaluate_main(argv: Sequence[str] | None = None) -> int:
    """``seq2seq-evaluate --workdir DIR [--src FILE --ref FILE]``: decode, score (sacreBLEU);
    with several systems (``--hyp`` files, ``--compare``'d runs or checkpoints), paired
    significance tests against the first (``evaluation.compare``)."""
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
    from seq2seq.data.pipeline import split_text

    try:
        comet_model = evaluation.load_comet(args.comet_model) if comet else None
        sacre = [m for m in metrics or () if m != evaluation.COMET]
        systems = [(path, _read_lines(path)) for path in args.hyp or []]
        if args.ref:
            refs = _read_lines(args.ref)
            if args.src:
                sources = _read_lines(args.src)
                if len(sources) != len(refs):
                    return _fail(
                        f"{args.src} has {len(sources)} lines but {args.ref} has {len(refs)}"
                    )
            pieces = evaluation.pieces_message(args.ref, refs)
            if pieces and not args.allow_pieces:
                return _fail(f"{pieces}; or pass --allow-pieces to score them as they are")
        models = _evaluate_models(args) if args.workdir else []
        if len(systems) + len(models) > 1 and args.output:
            return _fail("--output takes one system's hypotheses: use --hyp-dir with several")
        timings = []
        for name, model_args in models:
            opened = _load(model_args)
            if not args.ref:
                test = split_text(opened.config, "test")  # every test corpus, with its tag
                sources, refs = test.sources, test.targets
            translator = _translator(model_args, opened)
            start = time.perf_counter()
            hyps = [
                h[0].text for h in translator.translate(sources, progress=True, source=args.src)
            ]
            seconds = max(time.perf_counter() - start, 1e-9)
            timings.append((name, len(hyps), seconds, opened.strategy.describe()))
            systems.append((name, hyps))
        ref_name = args.ref or "test references"
        scores: object = None
        report: dict = {}
        if len(systems) == 1:
            hyps = systems[0][1]
            # the warning about pieces names the file (a --hyp, or where the translations go)
            name = systems[0][0]
            names = (name if args.hyp else args.output or f"the translations of {name}", ref_name)
            if metrics is None:
                scores = evaluation.score(hyps, refs, names=names, lowercase=args.lowercase)
            else:
                scores = evaluation.score_metrics(
                    hyps, refs, sacre, names=names, lowercase=args.lowercase
                )
            report = _single_json(systems[0][0], scores)
        elif metrics is None or sacre:
            scores = evaluation.compare(
                systems,
                refs,
                sacre or evaluation.METRICS,
                lowercase=args.lowercase,
                seed=args.paired_seed,
                bootstrap_samples=args.paired_bs_n,
                ar_trials=args.paired_ar_n,
                reference_name=ref_name,
            )
            report = scores.to_json()
        comet_lines = []
        if comet_model is not None:
            values = evaluation.comet_scores(comet_model, [h for _, h in systems], sources, refs)
            report["COMET"] = {"model": args.comet_model, "scores": {}}
            for (name, _), value in zip(systems, values):
                report["COMET"]["scores"][name] = value
                where = f"{name}; " if len(systems) > 1 else ""
                comet_lines.append(f"COMET = {value:.4f} ({where}model {args.comet_model})")
        if args.output:
            Path(args.output).write_text("".join(h + "\n" for h in systems[0][1]), encoding="utf-8")
        if args.hyp_dir:
            _write_hyp_dir(args.hyp_dir, [s for s in systems if s[0] in {t[0] for t in timings}])
        if args.json:
            import json

            Path(args.json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    except (ValueError, OSError, RuntimeError) as e:
        return _fail(str(e))
    if isinstance(scores, list):
        if scores:  # none: --metrics comet alone
            print("\n".join(str(s) for s in scores))
    elif isinstance(scores, evaluation.Comparison):
        print(scores.table())
    elif scores is not None:
        print(scores)
    if comet_lines:
        print("\n".join(comet_lines))
    for name, count, seconds, search in timings:
        prefix = f"{name}: " if len(timings) > 1 else ""
        print(
            f"{prefix}{count} sentences in {seconds:.1f} s ({count / seconds:.1f} "
            f"sentences/s), {search}"
        )
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


def _evaluate_models(args) -> list[tuple[str, argparse.Namespace]]:
    """(name, arguments for ``_load``) of each decoded system: one (a model or an ensemble),
    or with ``--compare`` one per member of ``_members``, named ``DIR`` or ``DIR@STEP``."""
    if not args.compare:
        names = [f"{w}@{s}" if s is not None else w for w, s in _members(args)]
        return [(" + ".join(names), args)]
    out = []
    for w, s in _members(args):
        one = argparse.Namespace(**vars(args))
        one.workdir, one.workdirs = w, [w]
        one.step, one.steps = s, None if s is None else [s]
        out.append((w if s is None else f"{w}@{s}", one))
    return out


def _single_json(name: str, scores) -> dict:
    """One system's scores (``evaluation.Scores`` or a list of ``MetricScore``) as JSON."""
    from seq2seq import evaluation

    if isinstance(scores, evaluation.Scores):
        scores = [
            evaluation.MetricScore("bleu", scores.bleu, scores.bleu_signature),
            evaluation.MetricScore("chrf", scores.chrf, scores.chrf_signature),
        ]
    return {
        "system": name,
        **{
            evaluation.LABELS[s.metric]: {"score": s.score, "signature": s.signature}
            for s in scores
        },
    }


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
    parser.add_argument("--alpha", type=_nonnegative_float, help="length-penalty exponent")
    parser.add_argument("--max-tokens", type=_positive_int, help="tokens per batch")
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


def params_main(argv: Sequence[str] | None = None) -> int:
    """``seq2seq-params --config FILE [key=value ...]``: parameter counts per model component.

    Builds the model abstractly (``nnx.eval_shape``: nothing allocated, so the big presets are
    instant). ``model.vocab_size`` 0 (fill from the tokenizer) is read as ``tokenizer.vocab_size``.
    """
    config = _config_from_argv(
        "seq2seq-params",
        "Print the model's parameter counts per "
        "component (embeddings, attention, FFN, norms, positions) without "
        "allocating it.",
        argv,
    )
    if isinstance(config, int):
        return config
    from seq2seq.model.report import abstract_model, format_report, parameter_counts
    from seq2seq.resolve import resolve_config

    try:
        model_config = resolve_config(config, validate=False).config.model
    except (ValueError, FileNotFoundError) as e:
        return _fail(str(e))
    try:
        counts = parameter_counts(abstract_model(model_config))
    except ValueError as e:
        return _fail(str(e))
    print(format_report(model_config, counts))
    return 0


def average_main(argv: Sequence[str] | None = None) -> int:
    """``seq2seq-average --workdir DIR (--last N | --steps a,b,c) [--output OUT]``.

    Averages checkpoint parameters into a new run directory usable by translate/evaluate.
    """
    parser = argparse.ArgumentParser(
        prog="seq2seq-average",
        description="Average the parameters of several checkpoints of a "
        "run into a new run directory (use it with seq2seq-translate/evaluate --workdir OUT).",
    )
    parser.add_argument("--workdir", required=True, help="run directory written by seq2seq-train")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--last", type=int, help="average the newest N checkpoints")
    which.add_argument("--steps", help="comma-separated checkpoint steps, e.g. 1000,1500,2000")
    parser.add_argument("--output", help="new run directory (default: WORKDIR/average)")
    parser.add_argument("--overwrite", action="store_true", help="replace checkpoints in --output")
    args = parser.parse_args(argv)
    try:
        steps = None if args.steps is None else [int(s) for s in args.steps.split(",") if s.strip()]
    except ValueError:
        return _fail(f"--steps must be comma-separated integers, got {args.steps!r}")
    _setup_logging()
    from seq2seq.trained import average_checkpoints

    output = args.output or str(Path(args.workdir) / "average")
    try:
        out, used = average_checkpoints(
            args.workdir, output, steps=steps, last=args.last, overwrite=args.overwrite
        )
    except (ValueError, FileNotFoundError, FileExistsError, RuntimeError) as e:
        return _fail(str(e))
    print(f"averaged checkpoints {used} of {args.workdir} into {out}")
    print(f"  use it with: seq2seq-evaluate --workdir {out}")
    return 0


def plot_main(argv: Sequence[str] | None = None) -> int:
    """``seq2seq-plot --workdir DIR [--output FILE]``: draw the run's curves to a PNG."""
    parser = argparse.ArgumentParser(
        prog="seq2seq-plot",
        description="Plot a run's train/dev loss, dev BLEU, learning rate "
        "and gradient norm from metrics.jsonl to a PNG.",
    )
    parser.add_argument("--workdir", required=True, help="run directory written by seq2seq-train")
    parser.add_argument(
        "--output", help="PNG file (default: WORKDIR/curves.png, or WORKDIR/attention.png)"
    )
    parser.add_argument(
        "--attention",
        metavar="SENTENCE",
        help="instead: translate SENTENCE with the run (its decode config) and draw the "
        "cross-attention as a source × target heatmap, hard alignment marked",
    )
    parser.add_argument(
        "--layer", type=_nonnegative_int, help="with --attention: one decoder layer (default: mean)"
    )
    parser.add_argument(
        "--head", type=_nonnegative_int, help="with --attention: one head (default: mean)"
    )
    args = parser.parse_args(argv)
    if args.attention is None:
        if args.layer is not None or args.head is not None:
            return _fail("--layer and --head apply with --attention only")
        from seq2seq.plots import plot_run

        try:
            path = plot_run(args.workdir, args.output)
        except (ValueError, FileNotFoundError) as e:
            return _fail(str(e))
        print(f"wrote {path}")
        return 0
    if not args.attention.strip():
        return _fail("--attention needs a non-empty sentence")
    _setup_logging()
    from seq2seq.alignment import cross_attention, pharaoh
    from seq2seq.plots import plot_attention

    try:
        targs = _decode_parser("seq2seq-plot", "").parse_args(["--workdir", args.workdir])
        translator = _translator(targs, _load(targs))
        hyp = translator.translate([args.attention])[0][0]
        found = cross_attention(translator, [args.attention], [hyp.tokens])[0]
        output = args.output or str(Path(args.workdir) / "attention.png")
        path = plot_attention(found, output, layer=args.layer, head=args.head, title=hyp.text)
    except (ValueError, FileNotFoundError, OSError, RuntimeError) as e:
        return _fail(str(e))
    print(f"{hyp.text}\nalignment {pharaoh(found.hard())}\nwrote {path}")
    return 0


def serve_main(argv: Sequence[str] | None = None) -> int:
    """``seq2seq-serve --workdir DIR [--host 127.0.0.1] [--port 8000]``: an HTTP server."""
    parser = _decode_parser(
        "seq2seq-serve",
        "Serve a trained run over HTTP: POST /translate (LibreTranslate-compatible), "
        "POST /attention, GET /health, and a web page at /.",
    )
    net = parser.add_argument_group("server")
    net.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    net.add_argument("--port", type=_nonnegative_int, default=8000, help="default 8000")
    net.add_argument(
        "--batch-window-ms",
        type=_nonnegative_float,
        default=10.0,
        help="wait this long after a request for others to share its decode (default 10)",
    )
    net.add_argument(
        "--max-batch", type=_positive_int, default=64, help="sentences per decode (default 64)"
    )
    net.add_argument(
        "--max-sentences",
        type=_positive_int,
        default=64,
        help="sentences per request (default 64; more: 413)",
    )
    net.add_argument(
        "--max-body-bytes",
        type=_positive_int,
        default=1_000_000,
        help="request body size (default 1000000; more: 413)",
    )
    net.add_argument(
        "--max-nbest",
        type=_positive_int,
        default=8,
        help="hypotheses per sentence a request may ask for (default 8, at most the beam)",
    )
    net.add_argument(
        "--warmup",
        action="store_true",
        help="before serving, compile the search for every batch shape of sentences up to 64 "
        "tokens (1, 2, 4, ... rows up to --max-batch): no first-request compile pauses",
    )
    args = parser.parse_args(argv)
    _setup_logging()
    from seq2seq.serve import Limits, Service, make_app, serve, warm_up

    try:
        opened = _load(args)
        translator = _translator(args, opened)
        config = opened.config
        start = time.perf_counter()
        if args.warmup:
            shapes = warm_up(translator, args.max_batch)
            logging.getLogger(__name__).info(
                "warm-up: %d batch shapes compiled in %.1f s", shapes, time.perf_counter() - start
            )
        else:
            translator.translate(["Hello."])  # compile the one-sentence search at least
    except (ValueError, OSError, RuntimeError) as e:
        return _fail(str(e))
    service = Service(
        translator,
        config.data.src_lang,
        config.data.tgt_lang,
        limits=Limits(args.max_sentences, args.max_body_bytes, args.max_nbest),
        window_ms=args.batch_window_ms,
        max_batch=args.max_batch,
        info={"workdir": args.workdir},
    )
    print(f"serving {args.workdir} on http://{args.host}:{args.port}/", file=sys.stderr)
    serve(make_app(service), args.host, args.port)
    return 0


def export_main(argv: Sequence[str] | None = None) -> int:
    """``seq2seq-export --workdir DIR --to {ctranslate2,safetensors} OUT [--push REPO]``."""
    from seq2seq.export import FORMATS

    parser = argparse.ArgumentParser(
        prog="seq2seq-export",
        description="Export a trained run: a CTranslate2 model or safetensors weights, with the "
        "SentencePiece model(s), the config and a README carrying the run's test BLEU.",
    )
    parser.add_argument("--workdir", required=True, help="run directory written by seq2seq-train")
    parser.add_argument(
        "--to",
        nargs=2,
        required=True,
        metavar=("FORMAT", "OUT"),
        help=f"format ({', '.join(FORMATS)}) and the new output directory",
    )
    parser.add_argument(
        "--checkpoint",
        type=_nonnegative_int,
        help="checkpoint step (default: the one the run's test score used)",
    )
    parser.add_argument(
        "--quantization",
        help="CTranslate2 weight type at conversion (e.g. int8, float16; default float32)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing OUT")
    parser.add_argument(
        "--push", metavar="REPO", help="upload OUT to this Hugging Face hub model repository"
    )
    args = parser.parse_args(argv)
    to, out = args.to
    _setup_logging()
    from seq2seq.export import export_run, push_to_hub

    try:
        path = export_run(
            args.workdir,
            to,
            out,
            step=args.checkpoint,
            quantization=args.quantization,
            overwrite=args.overwrite,
        )
        print(f"exported {args.workdir} as {to} to {path}")
        if args.push:
            print(f"pushed to {args.push}: {push_to_hub(path, args.push)}")
    except (ValueError, OSError, RuntimeError) as e:
        return _fail(str(e))
    return 0


def import_main(argv: Sequence[str] | None = None) -> int:
    """``seq2seq-import --from marian DIR OUT [--src-lang L] [--tgt-lang L] [--overwrite]``."""
    parser = argparse.ArgumentParser(
        prog="seq2seq-import",
        description="Turn a local Hugging Face Marian / OPUS-MT directory (config.json, weights, "
        "source.spm, target.spm, vocab.json) into a run directory that every command reads.",
    )
    parser.add_argument(
        "--from", dest="kind", required=True, choices=["marian"], help="checkpoint format"
    )
    parser.add_argument("directory", help="the Hugging Face model directory (local)")
    parser.add_argument("out", help="the new run directory")
    parser.add_argument("--src-lang", help="source language code (default: from the directory)")
    parser.add_argument("--tgt-lang", help="target language code (default: from the directory)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing OUT")
    args = parser.parse_args(argv)
    _setup_logging()
    from seq2seq.marian import import_marian

    try:
        path = import_marian(
            args.directory,
            args.out,
            src_lang=args.src_lang,
            tgt_lang=args.tgt_lang,
            overwrite=args.overwrite,
        )
    except (ValueError, OSError, RuntimeError) as e:
        return _fail(str(e))
    print(f"imported {args.directory} into {path}")
    return 0


def plan_main(argv: Sequence[str] | None = None) -> int:
    """``seq2seq-plan --config FILE [key=value ...] --target T [--search] [--json FILE]``:
    compile the train step and a decode chunk for an accelerator this machine lacks and
    report memory, FLOPs, collectives and a roofline step time (``seq2seq.plan``)."""
    import os

    # the compilers come from libtpu / the CUDA plugin; the host's default backend stays the
    # CPU. Set before jax is imported (seq2seq.plan imports it), which reads it then: set
    # later, the CUDA plugin starts on a machine without a driver and registers no topology
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from seq2seq.plan import TARGETS

    parser = argparse.ArgumentParser(
        prog="seq2seq-plan",
        description="Compile the train step seq2seq-train would run, and a chunk of its test "
        "decode, for a TPU or GPU target without the device (jax.experimental.topologies), and "
        "print per-device memory against the device's, FLOPs (XLA and analytic), collectives, "
        "the attention kernel and a roofline step time (a lower bound).",
    )
    parser.add_argument("--config", help="YAML config (see configs/)")
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. mesh.fsdp=8")
    parser.add_argument("--target", required=True, choices=list(TARGETS), help="what to plan for")
    parser.add_argument(
        "--search",
        action="store_true",
        help="try every (data, fsdp, tensor) mesh of the target and the micro-batch splits the "
        "batch allows; rank those that fit by predicted step time",
    )
    parser.add_argument("--json", help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    _setup_logging()
    import json

    from seq2seq import plan
    from seq2seq.resolve import check_run_config, resolve_config

    try:
        config = load_config(args.config, args.overrides)
        config = resolve_config(config, validate=False).config
        check_run_config(config, mesh=False)
    except (ValueError, FileNotFoundError) as e:
        return _fail(str(e))
    record: dict = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join(["seq2seq-plan", *(argv if argv is not None else sys.argv[1:])]),
        "config": args.config,
        "overrides": args.overrides,
    }
    try:
        if args.search:
            found = plan.search(config, args.target, progress=print)
            print(plan.format_search(found))
            record["search"] = [
                {**p.to_json(), "data.max_tokens": c.data.max_tokens} for c, p in found.ranked
            ]
            record["fits"] = bool(found.ranked)
            record["default"] = None if found.default is None else found.default.to_json()
            if found.ranked:
                cfg, best = found.ranked[0]
                print("\n" + plan.format_plan(best, cfg))
                record["plan"] = best.to_json()
        else:
            p = plan.plan(config, args.target)
            print(plan.format_plan(p, config))
            record["plan"] = p.to_json()
            record["fits"] = p.fits
    except (ValueError, RuntimeError) as e:
        return _fail(str(e))
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1, default=str), encoding="utf-8")
    return 0
