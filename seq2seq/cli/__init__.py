"""Command-line entry points, one module per command or group: ``train``, ``translate``
(with bulk translation), ``evaluate`` (and ``score``), ``serve``, ``export`` (and ``import``),
``plan``, and ``tools`` (``params``, ``average``, ``plot``); ``common`` holds the shared
parsers, flag types and logging.

The command line only wires modules together: a flag that sets a config key takes its type,
range and choices from the schema (``seq2seq.config``). ``seq2seq.cli:NAME_main`` is each
console script's entry point (``pyproject.toml``) and ``python -m seq2seq NAME``'s.
"""

from __future__ import annotations

from seq2seq.cli.common import _decode_parser, _load, _translator
from seq2seq.cli.evaluate import evaluate_main, score_main
from seq2seq.cli.export import export_main, import_main
from seq2seq.cli.plan import plan_main
from seq2seq.cli.serve import serve_main
from seq2seq.cli.tools import average_main, params_main, plot_main
from seq2seq.cli.train import train_main
from seq2seq.cli.translate import translate_main

# _decode_parser, _load and _translator: a decoding command's model (tests/test_serve.py)
__all__ = [
    "_decode_parser",
    "_load",
    "_translator",
    "average_main",
    "evaluate_main",
    "export_main",
    "import_main",
    "params_main",
    "plan_main",
    "plot_main",
    "score_main",
    "serve_main",
    "train_main",
    "translate_main",
]
