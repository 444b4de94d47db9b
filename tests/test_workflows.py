"""scripts/workflows.py: the back-translation and distillation recipes run end to end with tiny
models (``--smoke``), each stage a real command; the pages report what the stages wrote."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from tiny_run import ROOT, cli_env

sys.path.insert(0, str(ROOT / "scripts"))
import workflows  # noqa: E402


def test_summary_reads_deltas_p_values_and_speeds_from_the_report():
    def system(bleu, chrf, p=None):
        return {"BLEU": {"score": bleu, "p_ar": p}, "chrF": {"score": chrf, "p_ar": p}}

    test = {
        "labels": ["a", "b", "teacher"],
        "report": {"systems": [system(10.0, 30.0), system(12.5, 29.0, 0.01), system(20, 40, 1e-4)]},
        "table": "a: 100 sentences in 2.0 s (50.0 sentences/s), beam 4\n"
        "b: 100 sentences in 1.0 s (100.0 sentences/s), beam 4\n"
        "teacher: 100 sentences in 4.0 s (25.0 sentences/s), beam 4\n",
    }
    lines = workflows.summary(test)
    assert "- a: BLEU 10.00, chrF 30.00" in lines
    assert "- b: BLEU 12.50 (+2.50, p = 0.0100), chrF 29.00 (-1.00, p = 0.0100)" in lines
    assert lines[-2].endswith(
        "a 50.0 (2.00× teacher), b 100.0 (4.00× teacher), teacher 25.0 (1.00× teacher)"
    )
    test["table"] = ""  # hypothesis files only: nothing decoded, no speed line
    assert not any("sentences/s" in line for line in workflows.summary(test))


@pytest.mark.slow
def test_both_recipes_run_through_the_real_commands(tmp_path):
    bt, distill = tmp_path / "bt", tmp_path / "distill"
    for recipe, extra in (
        ("back-translation", ["--out", str(bt)]),
        ("distillation", ["--out", str(distill), "--bt-out", str(bt)]),
    ):
        proc = subprocess.run(
            [sys.executable, "scripts/workflows.py", recipe, "--smoke", *extra],
            cwd=ROOT,
            env=cli_env(),
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    data = bt / "data"
    mono = (data / "mono.es").read_text(encoding="utf-8").splitlines()
    synthetic = (data / "synthetic.en").read_text(encoding="utf-8").splitlines()
    assert len(mono) == 200 and len(synthetic) == len(mono)  # one translation per line, in order
    assert (data / "synthetic.es").read_text(encoding="utf-8").splitlines() == mono
    page = (bt / "back_translation.md").read_text(encoding="utf-8")
    report = json.loads((bt / "test.json").read_text(encoding="utf-8"))
    names = [workflows._rel(bt / run / "test.hyp") for run in ("baseline", "forward")]
    assert [s["name"] for s in report["systems"]] == names
    delta = report["systems"][1]["BLEU"]["score"] - report["systems"][0]["BLEU"]["score"]
    assert f"({delta:+.2f}, p = " in page
    stages = [line for line in page.splitlines() if line.startswith("| ") and " min | " in line]
    assert len(stages) == 5  # reverse, sampling, baseline, forward, test
    assert page.count("python -m seq2seq ") == 5

    # the distilled targets: the teacher's translation of every training source, in order
    sources = (data / "small.en").read_text(encoding="utf-8").splitlines()
    targets = (distill / "data" / "distilled.es").read_text(encoding="utf-8").splitlines()
    assert len(sources) == 400 and len(targets) == len(sources)
    page = (distill / "distillation.md").read_text(encoding="utf-8")
    assert "sentences/s" in page and "× teacher" in page
