"""MBR decoding (minimum Bayes risk; Freitag et al. 2023) against the run's beam search on one
test set, with the Python API that ``seq2seq-evaluate`` runs (see README.md beside this file).

    python examples/mbr/run.py --workdir RUN --src test.en --ref test.es [--mbr-size 16]

Writes ``OUT/beam.txt`` and ``OUT/mbr.txt`` (one translation per source line) and
``OUT/compare.json`` (the scores, 95% confidence intervals and paired significance tests
against beam search, as ``seq2seq-evaluate --json`` writes them), and prints the table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from seq2seq.evaluation import evaluate
from seq2seq.inference import decoder


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="MBR decoding against beam search")
    parser.add_argument("--workdir", required=True, help="a trained run directory")
    parser.add_argument("--src", required=True, help="source sentences, one per line")
    parser.add_argument("--ref", required=True, help="references, aligned with --src")
    parser.add_argument("--mbr-size", type=int, default=16, help="candidates per sentence (16)")
    parser.add_argument(
        "--candidates", choices=("sampling", "beam"), default="sampling", help="MBR's candidates"
    )
    parser.add_argument("--out", default="runs/mbr_example", help="where the files go")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    mbr = {"search": "mbr", "mbr_size": args.mbr_size, "mbr_candidates": args.candidates}
    systems = [
        decoder(args.workdir, name="beam"),  # the run's own search (beam 4 in the presets)
        decoder(args.workdir, decode_changes=mbr, name="mbr"),  # chrF utility, ε = 0.02 samples
    ]
    report = evaluate(args.ref, sources=args.src, decoders=systems)
    for name, hypotheses in report.systems:
        (out / f"{name}.txt").write_text("".join(h + "\n" for h in hypotheses), encoding="utf-8")
    (out / "compare.json").write_text(json.dumps(report.to_json(), indent=1), encoding="utf-8")
    print(report.text())


if __name__ == "__main__":
    main()
