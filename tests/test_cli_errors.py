"""A bad value or a combination that cannot work stops ``seq2seq-train`` before any work,
with an error naming the key (exit status 2, no tokenizer trained, no data read)."""

import pytest

from seq2seq import cli
from tiny_run import tiny_overrides, write_corpus


@pytest.mark.parametrize("overrides, message", [
    (["decode.length_penalty=gnmt2"], "decode.length_penalty must be one of gnmt, plain, none"),
    (["decode.beam_size=0"], "decode.beam_size must be ≥ 1"),
    (["decode.top_p=1.5"], "decode.top_p"),
    (["data.test.format=parquet"], "data.test.format must be one of text, tsv, csv, jsonl, hub, disk"),
    (["data.max_tokens=16"], "data.max_tokens=16 is less than one row of data.max_len=32"),
    (["model.positions=learned", "model.max_len=16"], "model.max_len=16 positions, fewer than "
                                                      "data.max_len=32"),
    (["model.positions=learned", "model.max_len=128"],  # decodes 1.0 × 128 + 4 tokens
     "model.positions=learned has a table of model.max_len=128 positions, but outputs may reach "
     "decode.max_len_a=1.0 × 128 source tokens (the test decode's source limit max(data.max_len, "
     "256) up to model.max_len) + decode.max_len_b=4 = 132 tokens; set model.max_len=260 or "
     "more, or lower decode.max_len_a / decode.max_len_b"),
    (["model.positions=learned", "decode.max_len_a=2.5"], "outputs may reach decode.max_len_a=2.5 "
                                                          "× 256 source tokens"),
    (["model.positions=absolute"], "model.positions must be one of sinusoidal, learned"),
    (["model.num_heads=3"], "model.d_model=16 is not divisible by model.num_heads=3"),
    (["tokenizer.model_type=word"], "tokenizer.model_type='word'"),
    (["tokenizer.joint=false", "model.share_embeddings=all"], "model.share_embeddings=target"),
    (["train.best_metric=bleu", "train.dev_bleu=false"], "train.best_metric=bleu needs"),
    (["mesh.data=2"], "mesh data=2, fsdp=1, tensor=1 needs 2 devices but there are 1"),
    (["mesh.tensor=3", "mesh.data=1"], "mesh data=1, fsdp=1, tensor=3 needs 3 devices"),
])
def test_bad_value_is_named_before_any_work(tmp_path, capsys, overrides, message):
    corpus = write_corpus(tmp_path / "corpus", train=50, dev=4, test=2)
    workdir = tmp_path / "run"
    assert cli.train_main(tiny_overrides(corpus, workdir, *overrides)) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
    assert not workdir.exists()  # no run directory, no train.log: nothing started
    assert "config:" not in err  # refused before the resolved config is logged
