"""Scores and the batch: with bfloat16 operands (``model.matmul_dtype``, the preset's setting) a
sentence's log-probability moves with the sentences that share its batch; ``--matmul-dtype
float32`` of seq2seq-score and seq2seq-translate makes it agree to 1e-5 (docs/design.md,
"Precision")."""

import gzip
from pathlib import Path

import pytest
from tiny_run import DATA, random_run

from seq2seq import cli
from seq2seq.trained import load_trained
from seq2seq.translation import Translator


def _lines(lang: str, start: int = 1000, count: int = 32) -> list[str]:
    with gzip.open(DATA / f"train.{lang}.gz", "rt", encoding="utf-8") as f:
        return f.read().split("\n")[start : start + count]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A random model trained with bfloat16 operands (the preset's model.matmul_dtype)."""
    root = tmp_path_factory.mktemp("bf16")
    return random_run(
        root / "run", "decode.beam_size=2", matmul_dtype="bfloat16", d_model=64, d_ff=128
    )


def _alone_and_batched(run, matmul_dtype):
    """|logprob alone − logprob in the 32-sentence batch| of the first 8 pairs."""
    config, tokenizer, graphdef, params = load_trained(run, matmul_dtype=matmul_dtype)
    translator = Translator(graphdef, params, tokenizer, config.decode, max_src_len=64)
    src, tgt = _lines("en"), _lines("es")
    batched = translator.score(src, tgt)
    alone = [translator.score([s], [t])[0] for s, t in zip(src[:8], tgt[:8])]
    return [abs(a.logprob - b.logprob) for a, b in zip(alone, batched)], batched


def _score_lines(path: Path) -> list[float]:
    return [float(line.split(" ||| ")[1]) for line in path.read_text().splitlines()]


@pytest.mark.slow  # ~30 s: five loads and compiles
def test_float32_operands_make_scores_independent_of_the_batch(run, tmp_path, capsys):
    # the documented behaviour: bfloat16 operands move a sentence's score with its batch
    bf16, _ = _alone_and_batched(run, None)
    assert 1e-5 < max(bf16) < 5e-2
    f32, batched = _alone_and_batched(run, "float32")
    assert max(f32) < 1e-5

    # the same through seq2seq-score: one sentence alone, then in the full batch
    src, tgt = _lines("en"), _lines("es")
    for name, lines in (("src", src), ("tgt", tgt), ("src1", src[3:4]), ("tgt1", tgt[3:4])):
        (tmp_path / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    common = ["--workdir", str(run), "--matmul-dtype", "float32"]
    for src_name, tgt_name, out in (("src", "tgt", "all"), ("src1", "tgt1", "one")):
        code = cli.score_main(
            [
                *common,
                "--src",
                str(tmp_path / src_name),
                "--tgt",
                str(tmp_path / tgt_name),
                "--output",
                str(tmp_path / out),
            ]
        )
        assert code == 0
    full, one = _score_lines(tmp_path / "all"), _score_lines(tmp_path / "one")
    assert len(full) == 32 and len(one) == 1
    assert full == pytest.approx([s.logprob for s in batched], abs=5.1e-5)  # printed to 4 places
    assert one[0] == pytest.approx(batched[3].logprob, abs=5.1e-5)

    # seq2seq-translate takes the option too; its n-best scores are the search's
    capsys.readouterr()
    code = cli.translate_main(
        [
            *common,
            "--input",
            str(tmp_path / "src1"),
            "--nbest",
            "2",
            "--output",
            str(tmp_path / "t"),
        ]
    )
    assert code == 0
    rows = (tmp_path / "t").read_text().splitlines()
    assert len(rows) == 2 and all(r.startswith("0 ||| ") for r in rows)


@pytest.mark.parametrize("main", [cli.score_main, cli.translate_main])
def test_help_says_scores_depend_on_the_batch_with_bfloat16(main, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--matmul-dtype {float32,bfloat16}" in text
    assert "depend slightly" in text and "other sentences of its batch" in text
