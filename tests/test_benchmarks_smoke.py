"""Tiny runs of the experiments and tools that no other test runs, each as its command
(``python -m benchmarks.NAME``, ``tools/NAME.sh``), checking a figure of its output.

The others run elsewhere: benchmark (test_benchmark), long_inputs, compare, compare_quality and
profile_step (test_compare), export_check (test_export), plan_shipped (test_plan), workflows,
gpu_check, load_test (test_serve) and serve_screenshot. Not run by any test (each trains or
times real runs for minutes): ab_speed, data_scale, lora_adapt, marian_peer, mbr_vs_beam.
quickstart (the README's first command in a fresh clone) runs here in a tiny mode.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from tiny_run import ROOT, cli_env, random_run, shipped_pairs, xla_flags


def _run(*command: str, env: dict[str, str] | None = None, timeout: int = 300) -> str:
    proc = subprocess.run(
        command, cwd=ROOT, env=env or cli_env(), capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout


def _row(stdout: str, first: str) -> list[str]:
    """The cells of the Markdown table row of ``stdout`` whose first cell starts ``first``."""
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0].startswith(first):
            return cells
    raise AssertionError(f"no row {first!r} in:\n{stdout}")


def _number(cell: str) -> float:
    """The number a cell starts with (``63,082,496``, ``481.28 MiB``, ``0.47%``)."""
    found = re.match(r"[\d,.]+", cell)
    assert found, cell
    return float(found.group().replace(",", ""))


def test_lora_memory_counts_what_each_setting_trains():
    out = _run(sys.executable, "-m", "benchmarks.lora_memory", "--rank", "4", timeout=120)
    full = _row(out, "full fine-tuning")
    lora = _row(out, "LoRA r=4, attention")
    both = _row(out, "LoRA r=4, attention + ffn")
    assert full[1] == full[2] and full[3] == "100.00%"  # full fine-tuning trains every weight
    assert 0 < _number(lora[2]) < _number(both[2]) < _number(full[2]) / 50
    # Adam's two float32 moments of each trained weight: 8 bytes a parameter
    assert _number(full[4]) == pytest.approx(8 * _number(full[2]) / 2**20, rel=1e-3)
    assert _number(lora[5]) < _number(full[5])  # the state of a LoRA run is smaller


def test_get_tatoeba_verifies_the_shipped_corpus():
    out = _run("bash", str(ROOT / "tools" / "get_tatoeba.sh"), "--verify", timeout=60)
    assert "shipped files match SHA256SUMS" in out
    assert {f"{s}.{x}" for s in ("train", "dev", "test") for x in ("en", "es")} <= {
        line.split()[1] for line in out.splitlines() if line.startswith("OK")
    }


@pytest.mark.slow  # ~16 s on 2 cores: one compile of the preset's step on 8 fake devices
def test_comm_cost_reads_the_collectives_of_a_mesh():
    env = cli_env(XLA_FLAGS=xla_flags(8))
    out = _run(
        sys.executable, "-m", "benchmarks.comm_cost", "--preset", "tatoeba", "--mesh", "2,2,2",
        env=env,
    )  # fmt: skip
    cells = _row(out, "tatoeba")
    assert cells[1] == "(2, 2, 2)"
    # gradients are all-reduced over the data axis; fsdp gathers the parameters
    reduced, gathered = (re.fullmatch(r"([\d.]+) \((\d+)\)", c) for c in cells[2:4])
    assert reduced and float(reduced[1]) > 0 and int(reduced[2]) > 0
    assert gathered and int(gathered[2]) > 0
    assert _number(cells[7]) == pytest.approx(sum(_number(c) for c in cells[2:7] if c != "—"), 0.01)
    assert 5 < _number(cells[9]) < 100  # 7.6M parameters: the per-device state in MiB


@pytest.mark.slow  # ~40 s: two rounds of two translate commands (model load, compile, decode)
def test_bulk_speed_times_both_commands_on_the_same_output(tmp_path):
    run = random_run(tmp_path / "run")
    source = tmp_path / "in.en"
    source.write_text("".join(en + "\n" for en, _ in shipped_pairs(0, 12)), encoding="utf-8")
    report = tmp_path / "bulk.json"
    _run(
        sys.executable, "-m", "benchmarks.bulk_speed", "--workdir", str(run), "--input",
        str(source), "--lines", "12", "--chunk-lines", "6", "--repeats", "1", "--json",
        str(report),
    )  # fmt: skip
    rows = json.loads(report.read_text())["rows"]
    bulk = [r for r in rows if r["command"].startswith("--output-dir")]
    assert bulk and all(r["same_output"] for r in bulk)  # line for line the plain output
    assert all(r["seconds"] > 0 for r in rows) and len(rows) > len(bulk)
    assert all(r["decode_sentences_per_s"] > 0 for r in bulk)


@pytest.mark.slow
def test_quickstart_records_a_fresh_clone_run_and_writes_its_table(tmp_path):
    """``benchmarks.quickstart --smoke``: a clone of this checkout trains a tiny model; the
    record holds the clone's commit, the run's test.json figures and a translation, and the
    page's marked block is the record's table."""
    readme = tmp_path / "README.md"
    readme.write_text(
        "# x\n<!-- quickstart.py table: begin -->\nold\n<!-- quickstart.py table: end -->\nend\n"
    )
    record = tmp_path / "quickstart.json"
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    _run(
        sys.executable, "-m", "benchmarks.quickstart", "--smoke", "--out", str(tmp_path / "q"),
        "--record", str(record), "--readme", str(readme), timeout=600,
    )  # fmt: skip
    entry = json.loads(record.read_text())["default"]
    assert entry["commit"] == head and entry["steps"] == 4 and entry["test_sentences"] == 8
    assert 0 <= entry["test_bleu"] <= 100 and entry["example"]["translation"]
    from benchmarks.quickstart import BEGIN, END, load_record, table

    text = readme.read_text()
    assert text.split(BEGIN)[1].split(END)[0].strip() == table(load_record(record))
    assert text.startswith("# x\n") and text.endswith("\nend\n")
