"""``seq2seq-export`` (CTranslate2 or safetensors) and ``seq2seq-import`` (a Marian / OPUS-MT
directory as a run)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from seq2seq.cli.common import _fail, _nonnegative_int, _setup_logging


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
        "--step",
        "--checkpoint",
        dest="step",
        type=_nonnegative_int,
        help="checkpoint step, as in the other commands (default: the one the run's test score "
        "used); --checkpoint is the same",
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
            step=args.step,
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
