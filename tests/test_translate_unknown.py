"""seq2seq-translate logs the unknown-piece rate of its input, as training logs one per split."""

import logging
import logging.handlers
import re

import pytest
import sentencepiece as spm
from tiny_run import random_run

from seq2seq import cli
from seq2seq.trained import load_trained
from seq2seq.translation import Translator


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return random_run(tmp_path_factory.mktemp("unk") / "run", "decode.beam_size=1")


def _logged(text: str, name: str) -> tuple[str, float]:
    found = re.findall(
        rf"(INFO|WARNING) .*: unknown pieces \(share of tokens\): {re.escape(name)} ([0-9.]+)%",
        text,
    )
    assert len(found) == 1, text[-3000:]
    return found[0][0], float(found[0][1])


def test_translate_logs_the_unknown_piece_rate_of_its_input(run, tmp_path, capsys):
    # Cyrillic and CJK are not in a 200-piece vocabulary of English and Spanish
    lines = ["Tom is here.", "Привет, Том!", "東京 is big.", ""]
    path = tmp_path / "in.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    sp = spm.SentencePieceProcessor(model_file=str(run / "spm.model"))
    ids = [[*sp.encode(line), sp.eos_id()] for line in lines]  # EOS counts, as in training
    expected = sum(i == sp.unk_id() for x in ids for i in x) / sum(len(x) for x in ids)
    assert expected > 0.01

    args = ["--workdir", str(run), "--output", str(tmp_path / "out.txt")]
    assert cli.translate_main([*args, "--input", str(path)]) == 0
    err = capsys.readouterr().err
    level, percent = _logged(err, str(path))
    assert level == "WARNING" and "the tokenizer does not cover this text well" in err
    assert percent == pytest.approx(100 * expected, abs=5e-4)  # printed to 3 decimals

    # the same method on text the tokenizer covers: an INFO line, 0%
    config, tokenizer, graphdef, params = load_trained(run)
    translator = Translator(graphdef, params, tokenizer, config.decode)
    logger = logging.getLogger("seq2seq.translation")
    handler = logging.handlers.BufferingHandler(10)
    logger.addHandler(handler)
    try:
        assert translator.log_unknown_rate(["Tom is here.", "Yes."], "clean") == 0.0
    finally:
        logger.removeHandler(handler)
    assert [(r.levelname, r.getMessage()) for r in handler.buffer] == [
        ("INFO", "unknown pieces (share of tokens): clean 0.000%")
    ]
