"""``python -m seq2seq COMMAND [ARGS]``: the same commands as the ``seq2seq-*`` console scripts.

``python -m seq2seq train --config configs/tatoeba_en_es.yaml`` is ``seq2seq-train --config
configs/tatoeba_en_es.yaml``; ``python -m seq2seq --help`` lists the commands.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from seq2seq import cli

COMMANDS = {
    "train": cli.train_main,
    "translate": cli.translate_main,
    "evaluate": cli.evaluate_main,
    "score": cli.score_main,
    "average": cli.average_main,
    "plot": cli.plot_main,
    "export": cli.export_main,
    "params": cli.params_main,
    "serve": cli.serve_main,
    "import": cli.import_main,
    "plan": cli.plan_main,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch ``argv[0]`` to its command; exit status 2 for an unknown one."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(
            "usage: python -m seq2seq {" + ",".join(COMMANDS) + "} [ARGS]\n\n"
            "The same commands as the seq2seq-<command> scripts; "
            "'python -m seq2seq COMMAND --help' describes one."
        )
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(
            f"error: unknown command {command!r}; choose one of {', '.join(COMMANDS)}",
            file=sys.stderr,
        )
        return 2
    return COMMANDS[command](rest)


if __name__ == "__main__":
    sys.exit(main())
