"""``seq2seq-serve``: an HTTP server over a trained run (``seq2seq.serve``)."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

from seq2seq.cli.common import (
    LOG,
    _decode_parser,
    _fail,
    _load,
    _nonnegative_float,
    _nonnegative_int,
    _positive_int,
    _setup_logging,
    _translator,
)


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
            LOG.info(
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
