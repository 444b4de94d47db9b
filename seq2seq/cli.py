"""Command-line entry points: ``seq2seq-train``, ``seq2seq-evaluate``, ``seq2seq-translate``.

The command line only wires modules together; every option maps to a config key.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import Sequence

from seq2seq.config import ConfigError, DecodeConfig, load_config, replace, to_dict


def _setup_logging(workdir: Path | None = None) -> None:
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if workdir is not None:
        workdir.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(workdir / "train.log", encoding="utf-8"))
    logging.basicConfig(level=logging.INFO, handlers=handlers, force=True,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("absl", "jax", "orbax", "datasets", "fsspec", "urllib3", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def train_main(argv: Sequence[str] | None = None) -> int:
    """``seq2seq-train --config FILE [key=value ...]``: train, resume, then report test BLEU."""
    parser = argparse.ArgumentParser(
        prog="seq2seq-train", description="Train (or resume) a Transformer NMT run, then score "
        "the test split with sacreBLEU. Rerun the same command to resume.")
    parser.add_argument("--config", help="YAML config (see configs/)")
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. train.steps=100")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config, args.overrides)
    except ConfigError as e:
        return _fail(str(e))
    from seq2seq.sharding import initialize_distributed, is_main_process
    from seq2seq.training.loop import Interrupted, train  # heavy imports after arg checks

    initialize_distributed(config.distributed)  # before any device use; no-op for one process
    _setup_logging(Path(config.workdir) if is_main_process() else None)  # one train.log
    logging.getLogger(__name__).info("config:\n%s", _yaml(config))
    try:
        summary = train(config)
    except Interrupted as e:
        print(str(e), file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        return _fail(str(e))
    print(f"\nstep {summary['step']}: test BLEU {summary['test_bleu']:.2f}, chrF "
          f"{summary['test_chrf']:.2f} on {summary['test_sentences']} sentences")
    print(f"  {summary['bleu_signature']}\n  {summary['chrf_signature']}")
    print(f"  train {summary['train_seconds'] / 60:.1f} min, decode {summary['decode_seconds']:.0f} s, "
          f"total {summary['wall_seconds'] / 60:.1f} min; outputs in {config.workdir}")
    print("\nexamples:")
    for ex in summary["examples"]:
        print(f"  SRC {ex['source']}\n  REF {ex['reference']}\n  HYP {ex['hypothesis']}\n")
    return 0


def _yaml(config) -> str:
    import yaml

    return yaml.safe_dump(to_dict(config), sort_keys=False)


def _decode_parser(prog: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--workdir", required=True, help="run directory written by seq2seq-train")
    parser.add_argument("--step", type=int, help="checkpoint step (default: latest)")
    parser.add_argument("--beam", type=int, help="beam size (default: from the run's config)")
    parser.add_argument("--alpha", type=float, help="length-penalty exponent")
    parser.add_argument("--max-tokens", type=int, help="source tokens per decoding batch")
    return parser


def _load(args) -> tuple:
    from seq2seq.workdir import load_trained

    config, tokenizer, graphdef, params = load_trained(args.workdir, args.step)
    changes = {k: v for k, v in (("beam_size", args.beam), ("alpha", args.alpha),
                                 ("max_tokens", args.max_tokens)) if v is not None}
    decode: DecodeConfig = replace(config.decode, **changes)
    return config, tokenizer, graphdef, params, decode


def _read_lines(path: str | None) -> list[str]:
    if path in (None, "-"):
        data = sys.stdin.buffer.read()
        name = "<stdin>"
    else:
        data = Path(path).read_bytes()
        name = path
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    out = []
    for i, raw in enumerate(lines, start=1):
        try:
            out.append(raw.decode("utf-8").removesuffix("\r"))
        except UnicodeDecodeError as e:
            raise ValueError(f"{name}, line {i}: not valid UTF-8 ({e.reason})") from e
    return out


def translate_main(argv: Sequence[str] | None = None) -> int:
    """``seq2seq-translate --workdir DIR [--input FILE] [--output FILE]``: one sentence per line."""
    parser = _decode_parser("seq2seq-translate", "Translate sentences (one per line) from a file "
                            "or standard input with a trained run; output keeps the input order.")
    parser.add_argument("--input", help="input file (default: standard input)")
    parser.add_argument("--output", help="output file (default: standard output)")
    parser.add_argument("--nbest", type=int, default=1,
                        help="print the N best hypotheses as 'index ||| text ||| logprob ||| score'")
    args = parser.parse_args(argv)
    _setup_logging()
    from seq2seq.translation import Translator

    try:
        lines = _read_lines(args.input)
        config, tokenizer, graphdef, params, decode = _load(args)
        translator = Translator(graphdef, params, tokenizer, decode,
                                max_src_len=max(config.data.max_len, 256))
        results = translator.translate(lines, nbest=args.nbest, progress=args.input is not None)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        return _fail(str(e))
    out = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout
    try:
        for i, hyps in enumerate(results):
            if args.nbest == 1:
                out.write(hyps[0].text + "\n")
            else:
                for h in hyps:
                    out.write(f"{i} ||| {h.text} ||| {h.logprob:.4f} ||| {h.score:.4f}\n")
    finally:
        if out is not sys.stdout:
            out.close()
    return 0


def evaluate_main(argv: Sequence[str] | None = None) -> int:
    """``seq2seq-evaluate --workdir DIR [--src FILE --ref FILE]``: decode and score with sacreBLEU."""
    parser = _decode_parser("seq2seq-evaluate", "Decode a source file with a trained run and score "
                            "it against a reference file (BLEU, chrF). Default: the run's test split.")
    parser.add_argument("--src", help="source file, one sentence per line")
    parser.add_argument("--ref", help="reference file, aligned with --src")
    parser.add_argument("--output", help="write hypotheses here")
    args = parser.parse_args(argv)
    if (args.src is None) != (args.ref is None):
        return _fail("give both --src and --ref, or neither (to use the run's test split)")
    _setup_logging()
    from seq2seq import evaluation
    from seq2seq.data.sources import load_parallel
    from seq2seq.translation import Translator

    try:
        config, tokenizer, graphdef, params, decode = _load(args)
        if args.src:
            sources, refs = _read_lines(args.src), _read_lines(args.ref)
            if len(sources) != len(refs):
                return _fail(f"{args.src} has {len(sources)} lines but {args.ref} has {len(refs)}")
        else:
            ds = load_parallel(config.data.test, config.data.src_lang, config.data.tgt_lang,
                               skip_empty=config.data.skip_empty, split_name="test")
            sources, refs = list(ds["source"]), list(ds["target"])
        translator = Translator(graphdef, params, tokenizer, decode,
                                max_src_len=max(config.data.max_len, 256))
        start = time.perf_counter()
        hyps = [h[0].text for h in translator.translate(sources, progress=True)]
        seconds = time.perf_counter() - start
        scores = evaluation.score(hyps, refs)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        return _fail(str(e))
    if args.output:
        Path(args.output).write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    print(scores)
    print(f"{len(hyps)} sentences in {seconds:.1f} s ({len(hyps) / seconds:.1f} sentences/s), "
          f"beam {decode.beam_size}, alpha {decode.alpha}")
    return 0
