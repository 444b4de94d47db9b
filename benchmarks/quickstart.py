"""The README's first command as a new user meets it, recorded: a fresh clone of this checkout
and a new virtual environment, ``pip install -e .``, then ``seq2seq-train --config
configs/tatoeba_en_es.yaml`` (with ``--set key=value`` overrides, e.g. ``train.time_budget=0``
for the step-exact variant), timed, its ``test.json`` and one translation kept in a dated
record (``docs/data/quickstart.json``: one entry per variant, with the machine and the
commit). The README's results table is written from the record alone, between its
``quickstart.py table`` markers; a test checks that the README equals what the record gives.

Usage::

    python -m benchmarks.quickstart                              # the command as written
    python -m benchmarks.quickstart --set train.time_budget=0    # the step-exact variant
    python -m benchmarks.quickstart --table-only                 # the README from the record
    python -m benchmarks.quickstart --smoke --out /tmp/q         # tiny, no install (a test)

Run it on a quiet machine: the default variant trains for a time budget, so its steps and
score depend on what else runs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import ROOT, cpu_name, write_docs

RECORD = ROOT / "docs" / "data" / "quickstart.json"
README = ROOT / "README.md"
BEGIN, END = "<!-- quickstart.py table: begin -->", "<!-- quickstart.py table: end -->"
CONFIG = "configs/tatoeba_en_es.yaml"
EXAMPLE = "I can't eat chicken."
# --smoke: a model of a few steps on a slice of the corpus (the plumbing, not the figures)
SMOKE = [
    "data.max_tokens=512",
    "tokenizer.vocab_size=300",
    "model.d_model=32",
    "model.num_heads=2",
    "model.d_ff=64",
    "model.num_encoder_layers=1",
    "model.num_decoder_layers=1",
    "train.time_budget=0",
    "train.steps=4",
    "train.warmup_steps=2",
    "train.eval_every=4",
    "train.bleu_subset=8",
    "decode.test_limit=8",
]


def variant(overrides: list[str]) -> str:
    """The record's key of a run: ``default`` or its overrides joined (``train.time_budget=0``)."""
    return " ".join(overrides) or "default"


def _timed(command: list[str], cwd: Path, log: Path, **kwargs: Any) -> float:
    """Run ``command`` in ``cwd`` (its output to ``log``); its wall seconds. Raises
    SystemExit with the log's tail when it fails."""
    print("$", shlex.join(command), flush=True)
    start = time.perf_counter()
    with log.open("a", encoding="utf-8") as out:
        proc = subprocess.run(command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, **kwargs)
    if proc.returncode:
        tail = log.read_text(encoding="utf-8")[-3000:]
        raise SystemExit(f"{shlex.join(command)} failed ({proc.returncode}):\n{tail}")
    return time.perf_counter() - start


def run(out: Path, overrides: list[str], smoke: bool) -> dict[str, Any]:
    """Clone, install (not with ``smoke``: this interpreter), train and translate in ``out``;
    the record's entry."""
    clone, log = out / "seq2seq", out / "quickstart.log"
    out.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0]  # what else ran: the times (not a step-exact score) depend on it
    _timed(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(clone)], out, log)
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=clone, capture_output=True, text=True, check=True
    ).stdout.strip()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    if smoke:  # no install: this interpreter imports the clone
        python, install = sys.executable, 0.0
        env["PYTHONPATH"] = str(clone)
        train = [python, "-m", "seq2seq", "train"]
        translate = [python, "-m", "seq2seq", "translate"]
    else:
        python = str(clone / ".venv" / "bin" / "python")
        install = _timed([sys.executable, "-m", "venv", ".venv"], clone, log)
        install += _timed([python, "-m", "pip", "install", "-q", "-e", "."], clone, log, env=env)
        train = [str(clone / ".venv" / "bin" / "seq2seq-train")]
        translate = [str(clone / ".venv" / "bin" / "seq2seq-translate")]
    train_seconds = _timed(
        [*train, "--config", CONFIG, *(SMOKE if smoke else []), *overrides], clone, log, env=env
    )
    workdir = clone / "runs" / "tatoeba_en_es"
    summary = json.loads((workdir / "test.json").read_text(encoding="utf-8"))
    example = subprocess.run(
        [*translate, "--workdir", str(workdir)],
        cwd=clone,
        input=EXAMPLE + "\n",
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout.strip()
    keep = ("steps", "test_bleu", "test_chrf", "bleu_signature", "chrf_signature")
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "load_average_start": load},
        "commit": commit,
        "command": shlex.join(["seq2seq-train", "--config", CONFIG, *overrides]),
        "install_seconds": round(install, 1),
        "train_command_seconds": round(train_seconds, 1),
        **{k: summary[k] for k in keep},
        "test_sentences": summary["test_sentences"],
        "train_seconds": round(summary["train_seconds"], 1),
        "decode_seconds": round(summary["decode_seconds"], 1),
        "training_pairs": summary["data"].get("train_pairs"),
        "example": {"source": EXAMPLE, "translation": example},
    }


def table(record: dict[str, dict[str, Any]]) -> str:
    """The README's results table: one row per variant of the record."""
    rows = [
        "| command | when, machine, commit | steps | test BLEU / chrF | time |",
        "|---|---|---|---|---|",
    ]
    for r in record.values():
        m = r["machine"]
        rows.append(
            f"| `{r['command']}` | {r['date']}, {m['cpu']} ({m['cores']} cores, load "
            f"{m['load_average_start']:.1f} at the start), "
            f"`{r['commit'][:7]}` | {r['steps']:,} | **{r['test_bleu']:.2f} / "
            f"{r['test_chrf']:.2f}** ({r['test_sentences']:,} sentences) | "
            f"install {r['install_seconds'] / 60:.1f} min, training "
            f"{r['train_seconds'] / 60:.1f} min, whole command "
            f"{(r['install_seconds'] + r['train_command_seconds']) / 60:.1f} min |"
        )
    first = next(iter(record.values()), None)
    if first is not None:
        ex = first["example"]
        rows += [
            "",
            f'`echo "{ex["source"]}" | seq2seq-translate --workdir runs/tatoeba_en_es` → '
            f"`{ex['translation']}`. Signatures: `{first['bleu_signature']}`, "
            f"`{first['chrf_signature']}`.",
        ]
    return "\n".join(rows)


def load_record(path: Path = RECORD) -> dict[str, dict[str, Any]]:
    """The record's variants (none: empty)."""
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", action="append", default=[], help="key=value for the command")
    parser.add_argument("--out", help="where to clone and train (default: a temp directory)")
    parser.add_argument("--record", default=str(RECORD), help="the JSON record")
    parser.add_argument("--readme", default=str(README), help="the page with the table")
    parser.add_argument("--table-only", action="store_true", help="write the table, run nothing")
    parser.add_argument("--smoke", action="store_true", help="tiny model, no install")
    args = parser.parse_args(argv)
    record_path = Path(args.record)
    record = load_record(record_path)
    if not args.table_only:
        with tempfile.TemporaryDirectory(prefix="quickstart_") as tmp:
            entry = run(Path(args.out or tmp), args.set, args.smoke)
        record[variant(args.set)] = entry
        record_path.parent.mkdir(parents=True, exist_ok=True)
        record_path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
        print(json.dumps(entry, indent=1, ensure_ascii=False))
    text = table(record)
    write_docs(Path(args.readme), text, BEGIN, END)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
