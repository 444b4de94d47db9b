"""Inputs of the kind real corpora contain, through seq2seq-evaluate, seq2seq-translate and the
scoring API: each gives the right number or a message that names the file and line."""

import logging
from pathlib import Path

import pytest
import sacrebleu
from test_translation import DECODE

from seq2seq import cli, evaluation
from seq2seq.config import Config, DataConfig

BOM = "\ufeff".encode()


@pytest.fixture
def echo_run(monkeypatch, tmp_path):
    """A fake run whose translator returns each source line unchanged (hypothesis = source)."""
    seen = {}
    config = Config(workdir=str(tmp_path), data=DataConfig(max_len=32), decode=DECODE)
    monkeypatch.setattr(
        "seq2seq.trained.load_trained",
        lambda workdir, step=None, matmul_dtype=None: (config, None, None, None),
    )

    class Echo:
        def __init__(self, *args, **kwargs):
            pass

        def log_unknown_rate(self, lines, name="input"):
            pass

        def translate(self, lines, nbest=1, progress=False, source=None):
            from seq2seq.translation import Hypothesis

            seen["lines"] = list(lines)
            return [[Hypothesis(line, (), 0.0, 0.0)] * nbest for line in lines]

    monkeypatch.setattr("seq2seq.translation.Translator", Echo)
    return tmp_path, seen


TEXT = ["Tom está aquí.", "¿Dónde pusiste las llaves?", "No puedo comer pollo."]


def test_evaluate_strips_a_bom_from_the_references(echo_run, capsys):
    tmp, _ = echo_run
    (tmp / "src").write_text("".join(t + "\n" for t in TEXT), encoding="utf-8")
    (tmp / "ref").write_bytes(BOM + "".join(t + "\r\n" for t in TEXT).encode())  # BOM + CRLF
    argv = ["--workdir", "RUN", "--src", str(tmp / "src"), "--ref", str(tmp / "ref")]
    assert cli.evaluate_main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "BLEU = 100.00 " in out and "chrF = 100.00 " in out  # with the BOM: 87.68 / 98.25


def test_translate_strips_a_bom_from_the_input(echo_run, capsys):
    tmp, seen = echo_run
    (tmp / "in").write_bytes(BOM + "Hola.\nAdiós.\n".encode())
    assert cli.translate_main(["--workdir", "RUN", "--input", str(tmp / "in")]) == 0
    assert seen["lines"] == ["Hola.", "Adiós."]
    assert capsys.readouterr().out == "Hola.\nAdiós.\n"


PIECES = ["▁Tom ▁está ▁aquí .", "¿ D ón de ▁pus iste ▁las ▁llaves ?", "No puedo comer pollo."]


def test_evaluate_refuses_references_in_pieces_unless_allowed(echo_run, capsys):
    tmp, _ = echo_run
    (tmp / "src").write_text("".join(t + "\n" for t in TEXT), encoding="utf-8")
    (tmp / "ref").write_text("".join(t + "\n" for t in PIECES), encoding="utf-8")
    argv = ["--workdir", "RUN", "--src", str(tmp / "src"), "--ref", str(tmp / "ref")]
    assert cli.evaluate_main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == (
        f"error: {tmp / 'ref'}: 2 of 3 lines contain SentencePiece pieces ('▁', first on line "
        "1); BLEU and chrF are meant for detokenized text (decode the pieces, e.g. with "
        "spm_decode); or pass --allow-pieces to score them as they are\n"
    )
    assert cli.evaluate_main(argv + ["--allow-pieces"]) == 0
    captured = capsys.readouterr()
    assert f"{tmp / 'ref'}: 2 of 3 lines contain SentencePiece pieces" in captured.err
    assert "BLEU = " in captured.out


def test_evaluate_names_the_hypothesis_file_in_pieces(echo_run, capsys):
    """Hypotheses in pieces are scored with a warning that names their file and first such
    line, as the reference check does (before: "hypotheses: ..."); decoded ones name the
    --output file they are written to, else the run."""
    tmp, _ = echo_run
    hyp, ref, src = tmp / "hyp_pieces.es", tmp / "ref.es", tmp / "src"
    for path, lines in ((hyp, PIECES), (ref, TEXT), (src, PIECES)):
        path.write_text("".join(t + "\n" for t in lines), encoding="utf-8")
    warning = (
        ": 2 of 3 lines contain SentencePiece pieces ('▁', first on line 1); BLEU and chrF are "
        "meant for detokenized text (decode the pieces, e.g. with spm_decode)\n"
    )
    bleu = sacrebleu.BLEU().corpus_score(PIECES, [TEXT]).score
    for argv, name in (
        (["--hyp", str(hyp)], str(hyp)),
        (["--workdir", "RUN", "--src", str(src), "--output", str(tmp / "out")], str(tmp / "out")),
        (["--workdir", "RUN", "--src", str(src)], "the translations of RUN"),
    ):
        assert cli.evaluate_main([*argv, "--ref", str(ref)]) == 0
        captured = capsys.readouterr()
        assert f"WARNING seq2seq.evaluation: {name}{warning}" in captured.err
        assert captured.out.startswith(f"BLEU = {bleu:.2f} ")


def test_scoring_api_warns_about_pieces_on_either_side(caplog):
    refs = ["Tom is here.", "Where did you put the keys?", "I can't eat chicken."]
    hyps = ["▁Tom ▁is ▁here .", "▁Where ▁did ▁you ▁put ▁the ▁key s ?", "I can't eat chicken."]
    with caplog.at_level(logging.WARNING, logger="seq2seq.evaluation"):
        scores = evaluation.score(hyps, refs)
        evaluation.score(refs, refs, names=("out.txt", "ref.txt"))
    assert [r.getMessage() for r in caplog.records] == [
        "hypotheses: 2 of 3 lines contain SentencePiece pieces ('▁', first on line 1); BLEU and "
        "chrF are meant for detokenized text (decode the pieces, e.g. with spm_decode)"
    ]
    assert round(scores.bleu, 2) == 29.93  # scored as given; detokenized, the same lines give 100
    assert evaluation.piece_lines(["a ▁b", "c", "▁"]) == [1, 3]


def test_translate_refuses_a_source_limit_beyond_the_learned_position_table(
    echo_run, capsys, monkeypatch
):
    from dataclasses import replace

    from seq2seq.config import ModelConfig

    tmp, seen = echo_run
    config = Config(
        workdir=str(tmp),
        data=DataConfig(max_len=32),
        decode=DECODE,
        model=ModelConfig(positions="learned", max_len=64),
    )
    monkeypatch.setattr(
        "seq2seq.trained.load_trained",
        lambda workdir, step=None, matmul_dtype=None: (config, None, None, None),
    )
    (tmp / "in").write_text("Hola.\n", encoding="utf-8")
    argv = ["--workdir", "RUN", "--input", str(tmp / "in")]
    assert cli.translate_main(argv + ["--max-src-tokens", "100"]) == 2
    assert capsys.readouterr().err == (
        "error: model.positions=learned has a table of model.max_len=64 positions, fewer than "
        "the 100 source tokens of --max-src-tokens; lower --max-src-tokens or raise "
        "model.max_len\n"
    )
    assert cli.translate_main(argv + ["--max-src-tokens", "64"]) == 0  # 0.5 × 64 + 4 ≤ 64
    config = replace(config, decode=replace(DECODE, max_len_a=1.0))
    assert cli.translate_main(argv) == 2  # the default limit is 64 here: 1.0 × 64 + 4 > 64
    assert "= 68 tokens; set model.max_len=260 or more" in capsys.readouterr().err


def test_train_names_skipped_pairs_reports_unknown_pieces_and_saves_tokenizer_options(
    tmp_path, capsys
):
    """One tiny seq2seq-train run: empty lines named (file:line, all in skipped.txt), the
    unknown-piece rate of every split side logged, the tokenizer options saved with the run."""
    from tiny_run import tiny_overrides, write_corpus

    from seq2seq.config import load_config
    from seq2seq.data.tokenizer import Tokenizer

    corpus = write_corpus(tmp_path / "corpus", train=200, dev=8, test=4)
    train_en, train_es = (Path(corpus["train"] + s) for s in (".en", ".es"))
    en, es = train_en.read_text("utf-8").splitlines(), train_es.read_text("utf-8").splitlines()
    en[2], es[9], en[40], es[40] = "", "  ", "", ""  # lines 3, 10 and 41 have an empty side
    train_en.write_text("".join(s + "\n" for s in en), "utf-8")
    train_es.write_text("".join(s + "\n" for s in es), "utf-8")
    test_en = Path(corpus["test"] + ".en")
    test_en.write_text(test_en.read_text("utf-8").replace(".", " Ω.", 1), "utf-8")  # not in train
    workdir = tmp_path / "run"
    overrides = tiny_overrides(
        corpus,
        workdir,
        "train.steps=1",
        "tokenizer.normalization=identity",
        "tokenizer.byte_fallback=false",
        "decode.allow_unk=false",
    )
    assert cli.train_main(overrides) == 0, capsys.readouterr().err
    log = (workdir / "train.log").read_text("utf-8")
    assert (
        f"train: skipped 3 of 200 pairs with an empty source or target ({corpus['train']}"
        f".{{en,es}}): {train_en}:3, {train_es}:10, {train_en}:41\n"
    ) in log
    assert (workdir / "skipped.txt").read_text("utf-8") == (
        f"train\t{train_en}:3\ntrain\t{train_es}:10\ntrain\t{train_en}:41\n"
    )
    saved = load_config(workdir / "config.yaml")
    assert (
        saved.tokenizer.normalization,
        saved.tokenizer.byte_fallback,
        saved.decode.allow_unk,
    ) == ("identity", False, False)
    tok = Tokenizer(workdir / "spm.model")
    ids = tok.encode(test_en.read_text("utf-8").splitlines())
    rate = sum(int((x == tok.unk_id).sum()) for x in ids) / sum(len(x) for x in ids)
    assert 0 < rate < 0.1
    assert (
        f"unknown pieces (share of tokens): train.source 0.000%, train.target 0.000%, "
        f"dev.source 0.000%, dev.target 0.000%, test.source {rate:.3%}, test.target "
        "0.000%\n"
    ) in log
    hyps = (workdir / "test.hyp").read_text("utf-8")
    assert "⁇" not in hyps and "<0x" not in hyps
