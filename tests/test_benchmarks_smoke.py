"""Tiny runs of the experiments and tools that no other test runs, each as its command
(``python -m benchmarks.NAME``, ``tools/NAME.sh``), checking a figure of its output.

The others run elsewhere: benchmark (test_benchmark), long_inputs, compare, compare_quality and
profile_step (test_compare), export_check (test_export), plan_shipped (test_plan), workflows,
gpu_check, load_test (test_serve) and serve_screenshot. Those that train or time real runs
for minutes run here in a tiny mode (``--smoke`` or small sizes), writing to a temporary
directory, never to the committed docs/ pages or records: quickstart (the README's first
command in a fresh clone), ab_speed, data_scale, lora_adapt, marian_peer and mbr_vs_beam.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

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


@pytest.mark.slow  # ~22 s: two runs of the benchmark's smoke preset (each its own process)
def test_ab_speed_times_both_checkouts_in_each_round():
    proc = subprocess.run(
        [
            sys.executable, "-m", "benchmarks.ab_speed", "--a", str(ROOT), "--b", ".",
            "--rounds", "1", "--steps", "2", "--warmup", "1", "--smoke",
        ],
        cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rounds = re.findall(r"^round 1 ([AB]): ([\d.]+) s/step$", proc.stderr, re.M)
    assert [name for name, _ in rounds] == ["A", "B"]  # A then B, once each
    medians = {}
    for name, checkout in (("A", str(ROOT)), ("B", ".")):
        line = re.search(
            rf"^{name} = (.+): ([\d., ]+) s/step \(median ([\d.]+)\)$", proc.stdout, re.M
        )
        assert line and line[1] == checkout, proc.stdout
        times = [float(t) for t in line[2].split(", ")]
        assert len(times) == 1 and times[0] == float(dict(rounds)[name]) > 0
        medians[name] = float(line[3])
        assert medians[name] == times[0]  # the median of one round is that round
    ratio = re.search(r"^B / A = ([\d.]+)$", proc.stdout, re.M)
    assert ratio, proc.stdout
    # B / A is of the unrounded medians, printed to the millisecond (within 0.5 ms)
    a, b, h = medians["A"], medians["B"], 5e-4
    low, high = (b - h) / (a + h), (b + h) / (a - h) if a > h else math.inf
    assert low - 1e-3 <= float(ratio[1]) <= high + 1e-3
    assert re.search(
        r"^\d{4}-\d\d-\d\d \d\d:\d\d UTC, .+, load average at the end", proc.stdout, re.M
    )


@pytest.mark.slow  # ~25 s: two train commands (a first run and its resume), each stopped by SIGTERM
def test_data_scale_records_a_first_run_and_its_resume(tmp_path):
    stdout = _run(
        sys.executable, "-m", "benchmarks.data_scale", "--smoke", "--pairs", "300",
        "--out", str(tmp_path), "--timeout", "240",
    )  # fmt: skip
    record = json.loads((tmp_path / "data_scale_300.json").read_text())
    assert json.loads(stdout) == record
    assert (record["smoke"], record["pairs"], record["join"], record["processes"]) == (
        True,
        300,
        1,
        1,
    )
    for lang in ("en", "es"):  # the synthetic corpus: 300 lines of one shipped pair each
        assert len((tmp_path / "corpus" / f"train300x1.{lang}").read_text().splitlines()) == 300
    from benchmarks.data_scale import PHASES

    for name in ("first_run", "resume"):
        run = record[name]
        assert run["returncode"] == 143  # the loop saved a checkpoint on SIGTERM and exited
        first, ready = run["seconds_to_first_step"], run["phases"]["seconds_to_data_ready"]
        assert math.isfinite(first) and 0 < ready < first <= run["seconds_total"]
        assert set(PHASES) <= set(run["phases"]) and run["phases"]["prepare_seconds"] >= 0
        assert 0 < run["peak_rss_anon_mb"] <= run["peak_rss_anon_with_workers_mb"]
        assert run["peak_rss_anon_mb"] < run["peak_rss_mb"] < 8192
    resumed = re.search(r"resumed from step (\d+)", Path(record["resume"]["log"]).read_text())
    assert resumed and int(resumed[1]) >= 1  # the resume started from the SIGTERM checkpoint
    assert record["resume"]["log"].endswith(f".{resumed[1]}.log")  # timed past that step
    steps = [
        json.loads(x)["step"]
        for x in (tmp_path / "run300x1" / "metrics.jsonl").read_text().splitlines()
    ]
    assert max(steps) > int(resumed[1])
    loader = record["loader"]
    assert loader["batches"] == 20 and loader["batch_shape"][1] == 128  # data.max_len=128
    assert loader["ms_per_batch"] > 0 and loader["target_tokens_per_second"] > 0


@pytest.mark.slow  # ~65 s loaded (~45 s quiet): six seq2seq commands, ~6 s of imports each
def test_lora_adapt_writes_the_table_of_both_adaptations(tmp_path):
    stdout = _run(sys.executable, "-m", "benchmarks.lora_adapt", "--smoke", "--out", str(tmp_path))
    doc = (tmp_path / "smoke" / "lora_adaptation.md").read_text()
    assert doc.strip() in stdout
    assert f"python -m benchmarks.lora_adapt --smoke --out {tmp_path}" in doc
    assert ", 2 steps each," in doc
    before = _row(doc, "before (the base run)")
    full = _row(doc, "full fine-tuning")
    lora = _row(doc, "LoRA r=2, α=4, attention")
    for row in (before, full, lora):
        assert 0 <= float(row[1]) <= 100 and 0 <= float(row[2]) <= 100  # BLEU, chrF
    assert before[3:] == ["–"] * 4  # the base run is only evaluated
    trained = [re.fullmatch(r"([\d,]+) of ([\d,]+) \(([\d.]+)%\)", r[3]) for r in (full, lora)]
    assert trained[0] and trained[1]
    (f_trained, f_all, f_share), (l_trained, l_all, l_share) = (
        (_number(m[1]), _number(m[2]), float(m[3])) for m in trained
    )
    assert f_trained == f_all and f_share == 100.0  # full fine-tuning trains every weight
    # LoRA trains only its rank-2 factors; its model counts them on top of the frozen weights
    assert 0 < l_trained < f_trained and l_all == f_all + l_trained
    assert l_share == pytest.approx(100 * l_trained / l_all, abs=0.01)
    assert _number(lora[4]) < _number(full[4])  # Adam moments: 8 bytes a trained weight
    assert _number(full[4]) == pytest.approx(8 * f_trained / 2**20, abs=0.006)
    assert all(_number(r[5]) > 0 and _number(r[6]) >= 0 for r in (full, lora))  # MiB, s


@pytest.mark.slow  # ~20-30 s: torch training for 2 s, the import, 3 decodes of 4 sentences
def test_marian_peer_compares_generate_with_the_imported_run(tmp_path):
    pytest.importorskip("torch", reason="torch comes with the optional extra 'compare'")
    pytest.importorskip("transformers", reason="it comes with the optional extra 'compare'")
    stdout = _run(sys.executable, "-m", "benchmarks.marian_peer", "--smoke", "--out", str(tmp_path))
    result = json.loads((tmp_path / "result.json").read_text())
    assert '"sentences": 4' in stdout
    assert result["sentences"] == 4 and result["peer_steps"] > 0
    assert 0 < result["peer_train_seconds"] < 30
    hf = tmp_path / "hf"
    assert json.loads((hf / "config.json").read_text())["d_model"] == 16  # the tiny Marian
    assert (tmp_path / "run" / "config.yaml").is_file()  # seq2seq-import's run directory
    assert 0 <= result["bleu_ours"] <= 100 and result["bleu_signature"].startswith("nrefs:1|")
    for name in ("our_eos_rule", "hf_forced_eos"):
        rule = result[name]
        assert 0 <= rule["identical"] <= 4 and rule["identical_share"] == rule["identical"] / 4
        assert len(rule["differences"]) == 4 - rule["identical"]
        assert all(d["ours"] != d["generate"] for d in rule["differences"])
        assert 0 <= rule["generate_outputs_at_the_limit"] <= 4
        assert 0 <= rule["bleu_generate"] <= 100 and rule["decode_seconds_generate"] >= 0
    # with our rule for the EOS at the limit, generate is the same search as ours (a random
    # model's near-ties may still split a sentence)
    assert result["our_eos_rule"]["identical"] >= 2


@pytest.mark.slow  # ~26 s: three searches (beam, MBR over samples, MBR over beam) compiled
def test_mbr_vs_beam_scores_each_system_on_the_test_split(tmp_path):
    run = random_run(tmp_path / "run", "decode.max_len_a=1.0", "decode.max_len_b=4")
    report = tmp_path / "mbr.md"
    stdout = _run(
        sys.executable, "-m", "benchmarks.mbr_vs_beam", "--workdir", str(run), "--limit", "4",
        "--out", str(report),
    )  # fmt: skip
    text = report.read_text()
    assert text.strip() in stdout
    assert ", 4 test sentences of the run's test split" in text
    from benchmarks.mbr_vs_beam import SYSTEMS

    searches = {}
    for name in SYSTEMS:
        cells = _row(text, name)
        seconds, rate = float(cells[2]), float(cells[3])
        searches[name] = cells[1]  # the strategy's own description
        assert seconds >= 0 and rate > 0
        assert 4 / rate == pytest.approx(seconds, abs=0.06, rel=0.1)  # of the 4 sentences
    # each system decoded with its own search (the decode changes reached the strategy)
    assert searches["beam 4"].startswith("beam 4")
    assert "16 candidates from sampling" in searches["MBR, 16 samples (ε 0.02)"]
    assert "epsilon 0.02" in searches["MBR, 16 samples (ε 0.02)"]
    assert "8 candidates from beam 8" in searches["MBR, beam 8-best"]
    scores = text.split("```")[1]  # seq2seq.evaluation.compare's table: BLEU, then chrF
    assert scores.lstrip().startswith("4 sentences;")
    bleu, chrf = scores.split("\nBLEU ")[1].split("\nchrF ")
    for block in (bleu, chrf):
        for name in SYSTEMS:
            line = next(x for x in block.splitlines() if name in x)
            assert 0 <= float(line.split(name)[1].split()[0]) <= 100


def test_readme_results_table_is_the_quickstart_record():
    """The README's results table is what ``python -m benchmarks.quickstart --table-only``
    writes from docs/data/quickstart.json (so no figure there lacks its record)."""
    from benchmarks.quickstart import BEGIN, END, README, RECORD, load_record, table

    text = README.read_text(encoding="utf-8")
    assert RECORD.is_file() and BEGIN in text and END in text
    assert text.split(BEGIN)[1].split(END)[0].strip() == table(load_record())
