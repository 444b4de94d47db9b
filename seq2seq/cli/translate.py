"""``seq2seq-translate``: translate lines of a file or standard input, and large files in
resumable chunks (``--output-dir``, ``seq2seq.bulk``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from seq2seq.cli.common import (
    BATCH_NOTE,
    _add_matmul_option,
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
    bulk.add_argument(
        "--num-processes",
        type=flag_type("distributed.num_processes"),
        help="processes of the job",
    )
    bulk.add_argument(
        "--process-id", type=flag_type("distributed.process_id"), help="this process's index"
    )


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
