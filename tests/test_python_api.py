"""docs/python_api.md runs as written: its ```python blocks, in order, in one namespace, in a
temporary directory laid out like the repository root (``data/`` and ``configs/`` linked), and
what they computed is checked afterwards."""

from __future__ import annotations

import os
import re

import sacrebleu
from tiny_run import ROOT

PAGE = ROOT / "docs" / "python_api.md"


def blocks(text: str) -> list[str]:
    """The page's ```python blocks, in order."""
    return re.findall(r"^```python\n(.*?)^```$", text, flags=re.S | re.M)


def test_the_page_has_a_block_per_section():
    found = blocks(PAGE.read_text(encoding="utf-8"))
    assert len(found) == 6
    assert "train(config)" in found[0] and "train.steps=30" in found[0]


def test_the_python_api_page_runs_as_written(tmp_path, monkeypatch):
    for name in ("data", "configs"):
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "python_api"}
    for i, code in enumerate(blocks(PAGE.read_text(encoding="utf-8"))):
        exec(compile(code, f"{PAGE.name}[block {i}]", "exec"), namespace)
    ns = namespace

    summary = ns["summary"]
    assert summary.status == "finished" and summary.step == 30
    assert 0.0 <= summary.test_bleu <= 100.0
    assert (tmp_path / "runs" / "api_demo" / "test.json").is_file()
    assert os.path.samefile(ns["opened"].config.workdir, tmp_path / "runs" / "api_demo")

    # one list of hypotheses per input line, at most nbest each, the empty line empty
    beams, samples = ns["beams"], ns["samples"]
    assert len(beams) == len(samples) == len(ns["sentences"]) == 3
    assert all(1 <= len(h) <= 2 for h in beams) and all(len(h) == 3 for h in samples[:2])
    assert [h.text for h in beams[2]] == [""]
    assert all("\n" not in h.text for hyps in beams + samples for h in hyps)

    # the score is sacreBLEU's on the same lists
    hyps, refs = ns["hypotheses"], ns["references"]
    assert len(hyps) == len(refs) == len(ns["sources"]) == 20
    scores = ns["scores"]
    assert 0.0 <= scores.bleu <= 100.0 and 0.0 <= scores.chrf <= 100.0
    assert scores.bleu == sacrebleu.corpus_bleu(hyps, [refs]).score
    assert scores.chrf == sacrebleu.corpus_chrf(hyps, [refs]).score
    assert scores.bleu_signature.startswith("nrefs:1|case:mixed")

    # the report: the same hypotheses and scores (same model, same beam search)
    report = ns["report"]
    assert report.systems == [("runs/api_demo", hyps)]
    assert set(report.to_json()) == {"system", "BLEU", "chrF"}
    assert report.to_json()["BLEU"] == {"score": scores.bleu, "signature": scores.bleu_signature}
    assert len(report.timings) == 1 and report.timings[0].sentences == 20
    assert "BLEU = " in report.text() and "sentences/s" in report.text()
    compared = ns["compared"]
    assert [name for name, _ in compared.systems] == ["runs/api_demo", "greedy"]
    table = compared.to_json()
    assert table["baseline"] == "runs/api_demo" and table["num_sentences"] == 20
    assert set(table["signatures"]) == {"BLEU", "chrF", "chrF++", "TER"}
    assert table["systems"][0]["BLEU"]["score"] == scores.bleu
    assert 0.0 <= table["systems"][1]["BLEU"]["p_bootstrap"] <= 1.0
