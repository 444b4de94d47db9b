"""Shared pieces of the commands: logging, errors, the ``--config`` parser, the flag
types, and the options and loading of the decoding commands (translate, evaluate, score,
serve, plot)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from seq2seq.config import (
    SAMPLING_ONLY,
    ConfigError,
    Range,
    choices,
    key_type,
    load_config,
    range_of,
)

# every command logs as seq2seq.cli (benchmarks/data_scale.py reads its train.log lines)
LOG = logging.getLogger("seq2seq.cli")


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


def _checked(kind: type, bounds: Range | None, name: str) -> Callable[[str], Any]:
    """An argparse type: ``kind(text)``, refused outside ``bounds`` with its rule
    (``argparse.ArgumentTypeError``: ``must be ≥ 1, got 0``); ``name`` is what argparse calls
    it in ``invalid NAME value: 'x'``."""

    def parse(text: str) -> Any:
        value = kind(text)
        problem = bounds.problem(value) if bounds is not None else None
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return value

    parse.__name__ = name
    return parse


def flag_type(key: str) -> Callable[[str], Any]:
    """The argparse type of a flag that sets the config key ``key``: the key's type
    (``seq2seq.config.key_type``) within its ``Range`` (``seq2seq.config.range_of``), refused
    with the rule config validation states (``--top-p 1.5``: ``must be in (0, 1] (1 = off), got
    1.5``, as ``decode.top_p must be in (0, 1] (1 = off), got 1.5``)."""
    kind = key_type(key)
    return _checked(kind, range_of(key), kind.__name__)


# flags that set no config key (counts, limits and ports of the commands themselves)
_positive_int = _checked(int, Range(1), "_positive_int")
_nonnegative_int = _checked(int, Range(0), "_nonnegative_int")
_nonnegative_float = _checked(float, Range(0), "_nonnegative_float")


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
# the options of the keys only a search that samples reads (the schema's Rule.only_for)
_SAMPLING_ONLY = tuple(o for o, k in _DECODE_OPTIONS.items() if f"decode.{k}" in SAMPLING_ONLY)


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
        choices=choices("model.matmul_dtype"),
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
        "--beam",
        type=flag_type("decode.beam_size"),
        help="beam size of --search beam (1 = greedy search)",
    )
    search.add_argument("--alpha", type=flag_type("decode.alpha"), help="length-penalty exponent")
    search.add_argument(
        "--min-length",
        type=flag_type("decode.min_length"),
        help="at least this many tokens before EOS",
    )
    search.add_argument(
        "--max-tokens", type=flag_type("decode.max_tokens"), help="source tokens per batch"
    )
    sampling = parser.add_argument_group("sampling (--search sampling, or MBR's candidates)")
    sampling.add_argument(
        "--sampling",
        dest="search",
        action="store_const",
        const="sampling",
        help="--search sampling: --nbest N then gives N independent samples per line",
    )
    sampling.add_argument("--temperature", type=flag_type("decode.temperature"), help="default 1")
    sampling.add_argument(
        "--top-k",
        type=flag_type("decode.top_k"),
        help="sample among the K most probable tokens (0 = all)",
    )
    sampling.add_argument(
        "--top-p",
        type=flag_type("decode.top_p"),
        help="nucleus sampling: smallest set with this probability mass",
    )
    sampling.add_argument(
        "--epsilon",
        type=flag_type("decode.epsilon"),
        help="epsilon sampling: drop tokens less probable than this (0 = off; default: "
        "0.02 for MBR's sampled candidates, else off)",
    )
    sampling.add_argument(
        "--seed",
        type=flag_type("decode.seed"),
        help="a line's samples depend on the seed and its line number only",
    )
    mbr = parser.add_argument_group("MBR (--search mbr)")
    mbr.add_argument(
        "--mbr-size",
        type=flag_type("decode.mbr_size"),
        help="candidates per sentence, also the references",
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


def _format_words(scored) -> str:
    """``piece=logprob`` of each scored piece (EOS last), space-separated (pieces hold no
    space: SentencePiece writes it as ``▁``)."""
    return " ".join(f"{p}={v:.4f}" for p, v in zip(scored.pieces, scored.token_logprobs))
