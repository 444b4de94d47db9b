"""benchmarks/workflows.py: the back-translation and distillation recipes run end to end with tiny
models (``--smoke``), each stage a real command; the pages report what the stages wrote."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
import yaml
from tiny_run import ROOT, cli_env

from benchmarks import workflows
from seq2seq.data.batching import MIX_BLOCK, MixedBatches


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


def test_the_distillation_result_reads_the_gain_as_a_share_of_the_teachers_lead():
    def system(bleu, p=None):
        return {"BLEU": {"score": bleu, "p_ar": p}, "chrF": {"score": bleu + 20, "p_ar": p}}

    record = {
        "runs": {  # dev BLEU at steps 2, 4, ..., 10: the distilled student 3 ahead, then 1
            "student_original": {"dev_bleu": [[k, 10.0] for k in (2, 4, 6, 8, 10)]},
            "teacher": {"dev_bleu": [[k, 20.0 + k] for k in (2, 4, 6, 8, 10)]},
            "student_distilled": {
                "dev_bleu": [[k, 13.0 if k <= 2 else 11.0] for k in (2, 4, 6, 8, 10)]
            },
        },
        "conditions": {"pairs": 20000, "steps": 10},
        "distilled": {"bleu": 92.4, "copy_rate": 0.831},
        "test": {"report": {"systems": [system(31.0), system(32.5, 0.0123), system(35.0, 1e-4)]}},
    }
    text = "\n".join(workflows._distill_result(record))
    # (32.5 - 31) / (35 - 31) = 38% of the teacher's 4.00 lead; 1 - 0.831 of the targets changed
    assert (
        "+1.50, 38% of the teacher's lead of 4.00; paired approximate randomization, p = "
        "0.0123" in text
    )
    assert "chrF 52.50 against 51.00 (+1.50, p = 0.0123)" in text
    # the last fifth (step 10) over the one before (step 8): +2 for the teacher, 0 for the others
    assert (
        "teacher +2.00, student, original targets +0.00, student, distilled targets +0.00" in text
    )
    assert (
        "lead over the other, +3.00 over steps 1–2, +1.00 over steps 3–8, +1.00 over "
        "steps 9–10." in text
    )
    assert "16.9% of them differ" in text and "mostly the original targets" in text
    record["distilled"]["copy_rate"] = 0.3  # a teacher far from its training targets
    record["test"]["report"]["systems"][2] = system(30.0)  # and below the student: no share
    text = "\n".join(workflows._distill_result(record))
    assert "mostly the original" not in text and "teacher's lead" not in text


@pytest.mark.parametrize("ratio", [0.5, 1.0, 1.5, 3.0])
def test_forward_steps_give_at_least_the_baselines_updates_on_real_pairs(ratio):
    # the batches' corpora as the training run draws them (MixedBatches, weights 1 and r): the
    # real pairs' count after forward_steps(S, r) steps is at least S, for every S and seed
    # (ceil(S · (1 + r)) alone fell short inside MixedBatches' shuffled blocks)
    corpus = types.SimpleNamespace(rows=1, max_len=1)
    for seed in (0, 1):
        mixed = MixedBatches([corpus, corpus], [1.0, ratio], seed=seed)
        for baseline in range(1, 700, 13):
            steps = workflows.forward_steps(baseline, ratio)
            assert steps >= baseline * (1 + ratio) and steps % MIX_BLOCK == 0
            assert mixed.counts(steps)[0] >= baseline, (seed, baseline, steps)


def test_the_plan_counts_finished_stages_and_times_the_others_from_the_probes():
    # a finished stage counts with its measured seconds and steps, a finished baseline fixes the
    # forward models' steps; the others: the probe's overhead, steps, evaluations, test lines
    probe = {"step_s": 0.5, "eval_s": 10.0, "overhead_s": 30.0, "line_s": 0.01}
    probes = {"probe_student": {**probe, "decode_overhead_s": 20.0}}
    conditions = {"test_lines": 100, "methods": ["topk10", "beam"], "mono_lines": 1000}
    conditions["ratio"] = 1.5
    record = {"stages": {"baseline": {"seconds": 123.0}}, "runs": {"baseline": {"steps": 1001}}}
    sizes = workflows.Sizes([], [], 5000, 100, 40, 200, [])
    rows = workflows.plan("back-translation", conditions, record, probes, sizes, 2000)
    by_key = {r.key: r for r in rows}
    assert list(by_key) == [
        "baseline",
        "reverse",
        "translate_topk10",
        "translate_beam",
        "synthetic",
        "forward_topk10",
        "forward_beam",
        "test",
        "baseline_long",
        "test_long",
    ]
    baseline, reverse = by_key["baseline"], by_key["reverse"]
    assert baseline.done and baseline.steps == (1001, 1001) and baseline.seconds == (123.0,) * 2
    assert reverse.steps == (2000, 5000)  # expected / the cap
    assert reverse.seconds[0] == pytest.approx(30 + 2000 * 0.5 + 20 * 10.0 + 100 * 0.01)
    for m in ("topk10", "beam"):
        assert by_key[f"forward_{m}"].steps == (2600, 2600)  # 1002 × 2.5 = 2505, up to 2600
        assert by_key[f"translate_{m}"].seconds == (pytest.approx(20 + 1000 * 0.01),) * 2
    assert by_key["baseline_long"].steps == (2600 - 1001, 2600 - 1001)  # to the forward steps
    # distillation, planned during back-translation: teacher and student at those steps
    probes["probe_teacher"] = probes["probe_student"]
    conditions["pairs"] = 400
    later = workflows.plan("distillation", conditions, {}, probes, sizes, 2000, (2600, 2600))
    trained = {r.key: r.steps for r in later if r.key in ("teacher", "student_distilled")}
    assert trained == {"teacher": (2600, 2600), "student_distilled": (2600, 2600)}


def test_a_record_continues_only_under_its_own_conditions(tmp_path):
    path = tmp_path / "record.json"
    record = workflows.Record(path, {"conditions": {"pairs": 400, "ratio": 1.0}})
    record.data["stages"]["baseline"] = {"seconds": 1.0}
    record.save()
    assert workflows.Record(path, {"conditions": {"pairs": 400, "ratio": 1.0}}).data == record.data
    with pytest.raises(
        SystemExit,
        match=r"record.json holds a run under other conditions "
        r"\(ratio: 1.0 → 2.0\)",
    ):
        workflows.Record(path, {"conditions": {"pairs": 400, "ratio": 2.0}})


def _spm_sha256(run: Path) -> str:
    """SHA-256 of the SentencePiece model a run reads: its ``tokenizer.model_file``, else the
    one it trained (``spm.model`` in the run)."""
    config = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8"))
    given = config["tokenizer"].get("model_file")
    path = ROOT / given if given else run / "spm.model"
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _smoke(recipe: str, *extra: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.workflows", recipe, "--smoke", *extra],
        cwd=ROOT,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.mark.slow
def test_both_recipes_run_through_the_real_commands(tmp_path):
    bt, distill = tmp_path / "bt", tmp_path / "distill"
    first = _smoke("back-translation", "--out", str(bt))
    _smoke("distillation", "--out", str(distill), "--bt-out", str(bt))

    # one tokenizer: every model of both experiments reads the baseline's SentencePiece model
    runs = sorted(p.parent for p in [*bt.glob("*/config.yaml"), *distill.glob("*/config.yaml")])
    runs = [r for r in runs if r.name != "probe" and not r.name.startswith("probe_")]
    hashes = {r.name: _spm_sha256(r) for r in runs}
    assert len(hashes) >= 6 and len(set(hashes.values())) == 1, hashes

    # equal real-data exposure: each forward model made at least the baseline's updates on real
    # pairs (the first corpus; its observed share of the batches times the steps)
    baseline = json.loads((bt / "baseline" / "test.json").read_text(encoding="utf-8"))
    forwards = sorted(bt.glob("forward*/test.json"))
    assert len(forwards) >= 2  # one per way of producing the synthetic sources
    for path in forwards:
        summary = json.loads(path.read_text(encoding="utf-8"))
        real_share, _ = next(iter(summary["corpus_shares"].values()))
        assert round(real_share * summary["step"]) >= baseline["step"], path

    data = bt / "data"
    mono = (data / "mono.es").read_text(encoding="utf-8").splitlines()
    record = json.loads((bt / "back_translation.json").read_text(encoding="utf-8"))
    page = (bt / "back_translation.md").read_text(encoding="utf-8")
    assert record["conditions"]["ratio"] == 1.0 and "synthetic:real batch ratio 1:1" in page
    methods = record["conditions"]["methods"]
    assert len(methods) >= 2
    for method in methods:
        # one synthetic source per monolingual line, in order, and its measurements as recomputed
        synthetic = (data / f"synthetic_{method}.en").read_text(encoding="utf-8").splitlines()
        assert len(mono) == 200 and len(synthetic) == len(mono)
        assert (data / f"synthetic_{method}.es").read_text(encoding="utf-8").splitlines() == mono
        copies = sum(s.strip() == m.strip() for s, m in zip(synthetic, mono)) / len(mono)
        ratio = sum(len(s.split()) for s in synthetic) / sum(len(m.split()) for m in mono)
        measured = record["synthetic"][method]
        assert measured["copy_rate"] == pytest.approx(copies)
        assert measured["length_ratio"] == pytest.approx(ratio)
        run = record["runs"][f"forward_{method}"]
        assert run["real_updates"] >= record["runs"]["baseline"]["steps"]
        assert f"| {workflows.METHODS[method].label} | {copies:.1%} | {ratio:.2f} |" in page

    # every forward model scored against the baseline in one paired test, as the page reads it
    report = json.loads((bt / "test.json").read_text(encoding="utf-8"))
    names = [workflows._rel(bt / run / "test.hyp") for run in ("baseline", *record["arms"])]
    assert [s["name"] for s in report["systems"]] == names
    for label, system in zip(record["test"]["labels"][1:], report["systems"][1:]):
        delta = system["BLEU"]["score"] - report["systems"][0]["BLEU"]["score"]
        assert f"- {label}: BLEU {system['BLEU']['score']:.2f} ({delta:+.2f}, p = " in page
    # the control at equal total updates: the baseline continued to the forward models' steps
    # from its own last checkpoint (its first part of the dev curve is the baseline's, once)
    long, base = record["runs"]["baseline_long"], record["runs"]["baseline"]
    assert long["steps"] == record["runs"][f"forward_{methods[0]}"]["steps"] > base["steps"]
    assert long["dev_bleu"][: len(base["dev_bleu"])] == base["dev_bleu"]
    evaluated = [step for step, _ in long["dev_bleu"]]
    assert evaluated == sorted(set(evaluated)) and evaluated[-1] == long["steps"]
    report = json.loads((bt / "test_long.json").read_text(encoding="utf-8"))
    assert [s["name"] for s in report["systems"]] == [
        workflows._rel(bt / "baseline_long" / "test.hyp"),
        *names[1:],
    ]
    assert "## Against the baseline at equal total updates" in page
    reverse = json.loads((bt / "reverse" / "test.json").read_text(encoding="utf-8"))
    assert f"BLEU {reverse['test_bleu']:.2f}" in page  # the reverse model's own test score
    assert (bt / "back_translation_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the plan, with its estimated total, printed before the first stage ran
    out = first.stdout
    assert out.index("estimated total") < out.index("[baseline")

    # resumable: a second run finds every stage done, runs no command and writes the same page
    again = _smoke("back-translation", "--out", str(bt))
    assert "$ " not in again.stdout and "done, kept" in again.stdout
    assert json.loads((bt / "back_translation.json").read_text(encoding="utf-8")) == record

    # the distilled targets: the teacher's translation of every training source, in order
    sources = (data / "small.en").read_text(encoding="utf-8").splitlines()
    targets = (distill / "data" / "distilled.es").read_text(encoding="utf-8").splitlines()
    assert len(sources) == 400 and len(targets) == len(sources)
    page = (distill / "distillation.md").read_text(encoding="utf-8")
    assert "sentences/s" in page and "× teacher" in page
    record = json.loads((distill / "distillation.json").read_text(encoding="utf-8"))
    # the student on the original targets: the continued baseline, whose steps every
    # distillation run trains, none early-stopped
    assert record["runs"]["student_original"]["workdir"] == workflows._rel(bt / "baseline_long")
    steps = record["runs"]["student_original"]["steps"]
    for key in ("teacher", "student_distilled"):
        assert record["runs"][key]["steps"] == steps, key
