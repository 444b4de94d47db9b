"""Small tools over a config or a run: ``seq2seq-params``, ``seq2seq-average`` and
``seq2seq-plot``."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from seq2seq.cli.common import (
    _config_from_argv,
    _decode_parser,
    _fail,
    _load,
    _nonnegative_int,
    _setup_logging,
    _translator,
)


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
