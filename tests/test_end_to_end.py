"""A tiny run through the real command-line entry points: train → resume → evaluate → translate."""

import json

import pytest

from conftest import write_split
from seq2seq import cli


@pytest.mark.slow
def test_train_resume_evaluate_translate(tmp_path, capsys):
    train = write_split(tmp_path, "train", 0, 600)
    dev = write_split(tmp_path, "dev", 600, 40)
    test = write_split(tmp_path, "test", 640, 30)
    workdir = tmp_path / "run"
    overrides = [
        f"workdir={workdir}", f"data.train.path={train}", f"data.dev.path={dev}",
        f"data.test.path={test}", "data.max_len=32", "data.max_tokens=512",
        "tokenizer.vocab_size=300", "model.d_model=32", "model.num_heads=2", "model.d_ff=64",
        "model.num_encoder_layers=1", "model.num_decoder_layers=1", "train.steps=12",
        "train.warmup_steps=4", "train.eval_every=6", "train.checkpoint_every=6",
        "train.log_every=3", "decode.beam_size=2"]
    assert cli.train_main(overrides) == 0
    out = capsys.readouterr().out
    assert "test BLEU" in out and "nrefs:1|case:mixed" in out
    summary = json.loads((workdir / "test.json").read_text())
    assert summary["step"] == 12 and summary["test_sentences"] == 30
    assert len((workdir / "test.hyp").read_text().splitlines()) == 30
    assert (workdir / "spm.model").is_file() and (workdir / "config.yaml").is_file()

    # rerun with more steps: resumes at 12 (does not start over) and reuses the tokenizer
    spm_mtime = (workdir / "spm.model").stat().st_mtime_ns
    assert cli.train_main([o for o in overrides if not o.startswith("train.steps")] + ["train.steps=18"]) == 0
    steps = [r["step"] for r in map(json.loads, (workdir / "metrics.jsonl").read_text().splitlines())
             if r["split"] == "train"]
    assert steps == [3, 6, 9, 12, 15, 18]
    assert (workdir / "spm.model").stat().st_mtime_ns == spm_mtime
    capsys.readouterr()

    assert cli.evaluate_main(["--workdir", str(workdir), "--src", test + ".en", "--ref",
                              test + ".es", "--output", str(tmp_path / "hyp")]) == 0
    assert "BLEU = " in capsys.readouterr().out
    assert len((tmp_path / "hyp").read_text().splitlines()) == 30

    src = tmp_path / "in.txt"
    src.write_text("I can't eat chicken.\n\nTom is here.\n", encoding="utf-8")
    assert cli.translate_main(["--workdir", str(workdir), "--input", str(src), "--output",
                               str(tmp_path / "out.txt")]) == 0
    lines = (tmp_path / "out.txt").read_text(encoding="utf-8").split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == ""  # empty line stays empty
