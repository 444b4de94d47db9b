"""Every example of ``examples/`` runs end to end in tiny mode: its script as a user runs it
(``bash run.sh`` or ``python run.py``, in a temporary directory, the checkout on
``PYTHONPATH``), on slices of the shipped corpus with a tiny model, and what it wrote is
checked: translations one per input line, scores in range, a LoRA adapter's share."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_run import DATA, ROOT, TINY_MODEL, cli_env, random_run, write_corpus

EXAMPLES = ROOT / "examples"
TOPICS = ("back_translation", "distillation", "lora", "mbr", "import_opus_mt")
# a ~20k-parameter model, a few steps (overrides of configs/back_translation.yaml)
TINY = [
    *TINY_MODEL,
    "train.steps=6",
    "train.warmup_steps=2",
    "train.eval_every=3",
    "train.checkpoint_every=3",
    "train.log_every=2",
    "decode.beam_size=1",
    "decode.max_len_a=1.0",
    "decode.max_len_b=4",
]
# a model of a few steps decodes to nothing but spaces with beam search: sample instead
SAMPLE = "--search sampling --seed 1"


def _run(cwd: Path, *command: str, **env: str) -> str:
    proc = subprocess.run(
        list(command),
        cwd=cwd,
        env=cli_env(PYTHON=sys.executable, **env),
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc.stdout


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split("\n")[:-1]


def _scores(report: dict) -> list[float]:
    """Every BLEU and chrF of a ``--json`` report (one system's, or a comparison's)."""
    systems = report.get("systems", [report])
    return [s[m]["score"] for s in systems for m in ("BLEU", "chrF")]


def test_every_topic_has_a_readme_a_script_and_an_index_entry():
    index = (EXAMPLES / "README.md").read_text(encoding="utf-8")
    for topic in TOPICS:
        folder = EXAMPLES / topic
        assert (folder / "README.md").is_file()
        assert (folder / "run.sh").is_file() or (folder / "run.py").is_file(), topic
        assert f"]({topic}/README.md)" in index, topic
        readme = (folder / "README.md").read_text(encoding="utf-8")
        assert "](../../docs/" in readme, f"{topic}: no link to its report page"


@pytest.mark.slow
def test_back_translation(tmp_path):
    corpus = write_corpus(tmp_path / "corpus")
    with gzip.open(DATA / "train.es.gz", "rt", encoding="utf-8") as f:
        mono = f.read().split("\n")[1000:1040]
    (tmp_path / "mono.es").write_text("\n".join(mono) + "\n", encoding="utf-8")
    script = str(EXAMPLES / "back_translation" / "run.sh")
    _run(tmp_path, "bash", script, corpus["train"], "mono.es", corpus["dev"], corpus["test"],
         *TINY, OUT="bt", SEARCH=SAMPLE)  # fmt: skip
    out = tmp_path / "bt"
    assert len(_lines(out / "synthetic.en")) == len(_lines(out / "synthetic.es")) == 40
    forward = json.loads((out / "forward" / "test.json").read_text(encoding="utf-8"))
    assert forward["step"] == 12  # twice the baseline's 6 steps
    # real and synthetic pairs weighted 1:1: per corpus [share of the micro-batches, weight]
    shares = forward["corpus_shares"]
    assert sorted(shares) == ["en-es#1", "en-es#2"] and [w for _, w in shares.values()] == [0.5] * 2
    assert sum(share for share, _ in shares.values()) == pytest.approx(1.0)
    report = json.loads((out / "compare.json").read_text(encoding="utf-8"))
    assert [s["name"] for s in report["systems"]] == ["bt/baseline/test.hyp", "bt/forward/test.hyp"]
    assert all(0.0 <= s <= 100.0 for s in _scores(report))


@pytest.mark.slow
def test_distillation(tmp_path):
    corpus = write_corpus(tmp_path / "corpus", train=200)
    script = str(EXAMPLES / "distillation" / "run.sh")
    _run(tmp_path, "bash", script, corpus["train"], corpus["dev"], corpus["test"], *TINY,
         OUT="kd", TEACHER="model.d_model=24 model.d_ff=48", TEACHER_SEARCH=SAMPLE)  # fmt: skip
    out = tmp_path / "kd"
    assert len(_lines(out / "distilled.es")) == len(_lines(out / "distilled.en")) == 200
    teacher = json.loads((out / "teacher" / "test.json").read_text(encoding="utf-8"))
    student = json.loads((out / "student" / "test.json").read_text(encoding="utf-8"))
    assert student["parameters"] < teacher["parameters"]
    report = json.loads((out / "compare.json").read_text(encoding="utf-8"))
    assert [s["name"] for s in report["systems"]] == ["kd/teacher", "kd/student"]
    assert all(0.0 <= s <= 100.0 for s in _scores(report))
    assert len(list((out / "test").glob("*.txt"))) == 2


@pytest.mark.slow
def test_lora(tmp_path):
    corpus = write_corpus(tmp_path / "corpus", train=200)
    base = random_run(tmp_path / "base")
    script = str(EXAMPLES / "lora" / "run.sh")
    _run(tmp_path, "bash", script, str(base), corpus["train"], corpus["dev"], corpus["test"],
         "data.max_tokens=256", "train.dev_bleu=false", "train.best_metric=loss",
         "decode.max_len_b=4", OUT="lora", STEPS="4", RANK="2")  # fmt: skip
    summary = json.loads((tmp_path / "lora" / "adapted" / "test.json").read_text(encoding="utf-8"))
    assert summary["step"] == 4
    assert 0 < summary["trainable_parameters"] < summary["parameters"] / 5  # the adapters only
    for name in ("before", "after"):
        report = json.loads((tmp_path / "lora" / f"{name}.json").read_text(encoding="utf-8"))
        assert all(0.0 <= s <= 100.0 for s in _scores(report))


def test_mbr(tmp_path):
    run = random_run(tmp_path / "run", "decode.max_len_b=4")
    corpus = write_corpus(tmp_path / "corpus", train=1, dev=1, test=5)
    script = str(EXAMPLES / "mbr" / "run.py")
    printed = _run(tmp_path, sys.executable, script, "--workdir", str(run), "--src",
                   f"{corpus['test']}.en", "--ref", f"{corpus['test']}.es", "--mbr-size", "4",
                   "--out", "mbr")  # fmt: skip
    for name in ("beam", "mbr"):
        assert len(_lines(tmp_path / "mbr" / f"{name}.txt")) == 5
    report = json.loads((tmp_path / "mbr" / "compare.json").read_text(encoding="utf-8"))
    assert [s["name"] for s in report["systems"]] == ["beam", "mbr"]
    assert all(0.0 <= s <= 100.0 for s in _scores(report))
    assert 0.0 <= report["systems"][1]["BLEU"]["p_bootstrap"] <= 1.0
    assert "baseline: beam" in printed


@pytest.mark.slow
def test_import_opus_mt(tmp_path):
    pytest.importorskip("transformers")
    from test_marian import make_marian  # a random MarianMTModel saved locally (no network)

    model = make_marian(tmp_path / "models" / "opus-mt-en-es", d_model=16, layers=(1, 1), heads=2)
    corpus = write_corpus(tmp_path / "corpus", train=100, dev=4, test=5)
    script = str(EXAMPLES / "import_opus_mt" / "run.sh")
    _run(tmp_path, "bash", script, str(model), corpus["test"], corpus["train"], corpus["dev"],
         "data.max_len=64", "data.max_tokens=512", "data.max_length_ratio=100",
         "train.eval_every=2", "train.checkpoint_every=2", "train.dev_bleu=false",
         "train.best_metric=loss", OUT="opus", STEPS="2")  # fmt: skip
    out = tmp_path / "opus"
    assert (out / "run" / "vocab.json").is_file()
    assert len(_lines(out / "test.hyp")) == 5
    for name in ("imported", "finetuned"):
        report = json.loads((out / f"{name}.json").read_text(encoding="utf-8"))
        assert all(0.0 <= s <= 100.0 for s in _scores(report))
    summary = json.loads((out / "finetuned" / "test.json").read_text(encoding="utf-8"))
    assert summary["step"] == 2
