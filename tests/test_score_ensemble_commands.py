"""seq2seq-score, and seq2seq-translate/evaluate with ensembles (several --workdir or --step),
--prefix-file and --word-scores, on run directories of tiny random models with a real
SentencePiece tokenizer (each a real config.yaml, spm.model and checkpoint)."""

import gzip
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import packed_batch

from seq2seq import cli
from seq2seq.config import (
    Config,
    DataConfig,
    DecodeConfig,
    ModelConfig,
    TokenizerConfig,
    load_config,
    replace,
    save_config,
)
from seq2seq.data.tokenizer import Tokenizer, train_or_load
from seq2seq.decoding import length_penalty
from seq2seq.model import build_model
from seq2seq.training.checkpoints import Checkpointer
from seq2seq.training.step import create_train_state, make_eval_step, make_optimizer
from seq2seq.workdir import checkpoint_dir, config_path

DATA = Path(__file__).resolve().parents[1] / "data" / "tatoeba-en-es"
DECODE = DecodeConfig(beam_size=3, alpha=0.6, max_len_a=0.5, max_len_b=4, max_tokens=4096)
# 16-token bucket only (one compiled shape per command), one empty line
LINES = ["Tom is here.", "I can't eat chicken.", "", "Yes.", "He is tall.", "Where is Tom?"]


def shipped(start, count):
    sides = []
    for lang in ("en", "es"):
        with gzip.open(DATA / f"train.{lang}.gz", "rt", encoding="utf-8") as f:
            sides.append(f.read().split("\n")[start : start + count])
    return sides


def make_run(directory, spm_dir, checkpoints, decode=DECODE):
    """A run directory holding ``checkpoints`` {step: model seed} of a ~20k-parameter model."""
    directory.mkdir()
    shutil.copy(spm_dir / "spm.model", directory / "spm.model")
    vocab = Tokenizer(directory / "spm.model").vocab_size
    model = ModelConfig(
        vocab_size=vocab,
        d_model=16,
        num_heads=2,
        num_encoder_layers=1,
        num_decoder_layers=1,
        d_ff=32,
        dropout_rate=0.0,
    )
    config = Config(
        workdir=str(directory),
        model=model,
        tokenizer=TokenizerConfig(vocab_size=vocab),
        data=DataConfig(max_len=32),
        decode=decode,
    )
    save_config(config, config_path(directory))
    ck = Checkpointer(checkpoint_dir(directory), keep=None, async_save=False)
    for step, seed in checkpoints.items():
        state = create_train_state(build_model(model, seed), make_optimizer(config.train), seed)[1]
        ck.save(step, state, {"step": step})
    ck.close()
    return str(directory)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    texts = sum(shipped(0, 400), [])
    for name, size in (("spm", 200), ("spm_other", 150)):
        train_or_load(texts, TokenizerConfig(vocab_size=size), root / name)
    return dict(
        root=root,
        a=make_run(root / "a", root / "spm", {10: 5, 20: 0}),
        b=make_run(root / "b", root / "spm", {20: 1}),
        other=make_run(root / "other", root / "spm_other", {20: 2}),
    )


def nbest_rows(text):
    """``line ||| text ||| logprob ||| score [||| words]`` rows → tuples."""
    rows = []
    for line in text.splitlines():
        parts = line.split(" ||| ")
        rows.append((int(parts[0]), parts[1], float(parts[2]), float(parts[3]), *parts[4:]))
    return rows


def words(field):
    """``piece=logprob ...`` → [(piece, logprob)] (a piece may hold '=': split at the last)."""
    return [(w.rsplit("=", 1)[0], float(w.rsplit("=", 1)[1])) for w in field.split()]


def translate(capsys, tmp_path, *args):
    (tmp_path / "in.txt").write_text("\n".join(LINES) + "\n", encoding="utf-8")
    assert cli.translate_main(["--input", str(tmp_path / "in.txt"), *args]) == 0
    return capsys.readouterr().out


@pytest.fixture(scope="module")
def single(runs, tmp_path_factory):
    """Run a's 3-best with word scores, once for the module."""
    tmp = tmp_path_factory.mktemp("single")
    (tmp / "in.txt").write_text("\n".join(LINES) + "\n", encoding="utf-8")
    out = tmp / "out.txt"
    argv = ["--workdir", runs["a"], "--input", str(tmp / "in.txt"), "--output", str(out)]
    assert cli.translate_main([*argv, "--nbest", "3", "--word-scores"]) == 0
    return nbest_rows(out.read_text(encoding="utf-8"))


def mixture(*per_model):
    """Σ_t log mean_m p_m(y_t): the ensemble's log-probability from each model's token scores."""
    return float(np.sum(np.log(np.mean(np.exp(np.array(per_model)), axis=0))))


def test_ensembles_through_translate(runs, single, tmp_path, capsys):
    a, b = runs["a"], runs["b"]
    # a with itself is a alone
    same = nbest_rows(translate(capsys, tmp_path, "--workdir", a, "--workdir", a, "--nbest", "3"))
    assert [r[:2] for r in same] == [r[:2] for r in single]
    np.testing.assert_allclose([r[2:4] for r in same], [r[2:4] for r in single], atol=2e-4)
    # a with b: other translations, whose log-probability is the mixture of the two models'
    # teacher-forced token scores (seq2seq-score of each model alone on those translations)
    both = nbest_rows(
        translate(capsys, tmp_path, "--workdir", a, "--workdir", b, "--nbest", "3", "--word-scores")
    )
    assert [r[1] for r in both] != [r[1] for r in single]
    pairs = [(LINES[i], text) for i, text, *_ in both if LINES[i]]
    (tmp_path / "src").write_text("\n".join(s for s, _ in pairs) + "\n", encoding="utf-8")
    (tmp_path / "tgt").write_text("\n".join(t for _, t in pairs) + "\n", encoding="utf-8")
    per_model = {}
    files = ["--src", str(tmp_path / "src"), "--tgt", str(tmp_path / "tgt"), "--word-scores"]
    for run in (a, b):
        assert cli.score_main(["--workdir", run, *files]) == 0
        per_model[run] = [words(r[4]) for r in nbest_rows_score(capsys.readouterr().out)]
    assert cli.score_main(["--workdir", a, "--workdir", b, *files]) == 0  # the ensemble's
    ensemble_scores = nbest_rows_score(capsys.readouterr().out)
    for r, wa, wb in zip(ensemble_scores, per_model[a], per_model[b]):
        assert r[1] == pytest.approx(mixture([v for _, v in wa], [v for _, v in wb]), abs=5e-4)
    decoded = [r for r in both if LINES[r[0]]]
    checked = 0
    for row, wa, wb in zip(decoded, per_model[a], per_model[b]):
        if [p for p, _ in words(row[4])] != [p for p, _ in wa]:
            continue  # the text re-encodes to other pieces: not the same target
        checked += 1
        assert row[2] == pytest.approx(mixture([v for _, v in wa], [v for _, v in wb]), abs=5e-4)
        assert row[2] != pytest.approx(sum(v for _, v in wa), abs=1e-3)  # not either model
        assert row[2] != pytest.approx(sum(v for _, v in wb), abs=1e-3)
    assert checked >= len(decoded) // 2


def nbest_rows_score(text):
    """``line ||| logprob ||| per token ||| score [||| words]`` rows → tuples."""
    rows = []
    for line in text.splitlines():
        parts = line.split(" ||| ")
        rows.append((int(parts[0]), float(parts[1]), float(parts[2]), float(parts[3]), *parts[4:]))
    return rows


def test_ensemble_of_checkpoints_through_evaluate(runs, single, tmp_path, capsys):
    """The lines and options of the translate tests: their compiled searches are reused."""
    (tmp_path / "src").write_text("\n".join(LINES) + "\n", encoding="utf-8")
    (tmp_path / "ref").write_text("\n".join(LINES) + "\n", encoding="utf-8")
    base = ["--src", str(tmp_path / "src"), "--ref", str(tmp_path / "ref")]
    outputs = {}
    for name, models in (
        ("both", ["--workdir", runs["a"], "--step", "10", "--step", "20"]),
        ("20", ["--workdir", runs["a"]]),  # the default: the newest
    ):
        out = tmp_path / f"{name}.txt"
        assert cli.evaluate_main([*models, *base, "--output", str(out)]) == 0
        assert "6 sentences in" in capsys.readouterr().out
        outputs[name] = out.read_text(encoding="utf-8").splitlines()
    best = {r[0]: r[1] for r in single[::-1]}  # the first (best) row of each line
    assert outputs["20"] == [best[i] for i in range(len(LINES))]
    assert outputs["both"] != outputs["20"]


def test_ensemble_errors(runs, tmp_path, capsys):
    a, other = runs["a"], runs["other"]
    (tmp_path / "in.txt").write_text("Yes.\n", encoding="utf-8")
    argv = ["--input", str(tmp_path / "in.txt")]
    assert cli.translate_main([*argv, "--workdir", a, "--workdir", other]) == 2
    err = capsys.readouterr().err
    assert f"{a} and {other} do not share the source vocabulary (200 vs 150 pieces)" in err
    assert cli.translate_main([*argv, "--workdir", a, "--workdir", a, "--step", "10"]) == 2
    assert "2 --workdir but 1 --step" in capsys.readouterr().err
    plain = tmp_path / "plain"
    shutil.copytree(runs["b"], plain)
    config = load_config(config_path(plain))
    save_config(replace(config, decode=replace(DECODE, length_penalty="plain")), config_path(plain))
    assert cli.translate_main([*argv, "--workdir", a, "--workdir", str(plain)]) == 2
    assert "decode.length_penalty is 'gnmt' vs 'plain'" in capsys.readouterr().err
    assert cli.translate_main([*argv, "--workdir", a, "--step", "10", "--step", "15"]) == 2
    assert "15" in capsys.readouterr().err


def test_prefix_file(runs, single, tmp_path, capsys):
    tok = Tokenizer(Path(runs["a"]) / "spm.model")
    best = {i: text for i, text, *_ in single[::-1]}  # the first row of each line is its best
    prefixes, expect = [], []
    for i, line in enumerate(LINES):
        ids = tok.encode([best[i]], add_eos=False)[0]
        own = tok.decode([ids[:2]])[0]
        if i == 1:  # another prefix: the output starts with it
            prefixes.append("Él")
        elif i in (3, 5) or not line:  # empty: as without a prefix
            prefixes.append("")
        else:  # the model's own first pieces: its own translation
            prefixes.append(own)
        expect.append(best[i])
    (tmp_path / "prefix.txt").write_text("\n".join(prefixes) + "\n", encoding="utf-8")
    argv = ["--workdir", runs["a"], "--nbest", "3", "--word-scores"]
    got = nbest_rows(
        translate(capsys, tmp_path, *argv, "--prefix-file", str(tmp_path / "prefix.txt"))
    )
    firsts = {r[0]: r for r in got[::-1]}  # the first (best) row of each line
    single_first = {r[0]: r for r in single[::-1]}
    for i in (0, 2, 3, 4, 5):
        assert firsts[i][1] == expect[i], i  # the unconstrained output
        assert firsts[i][2] == pytest.approx(single_first[i][2], abs=2e-4)
    forced = [r for r in got if r[0] == 1]
    assert len(forced) == 3 and all(r[1].startswith("Él") for r in forced)
    assert firsts[1][1] != expect[1]
    piece_rows = words(firsts[1][4])
    forced_pieces = [tok.sp.id_to_piece(int(t)) for t in tok.encode(["Él"], add_eos=False)[0]]
    assert [p for p, _ in piece_rows[: len(forced_pieces)]] == forced_pieces
    # the score counts the forced pieces: it is the sum of every piece's log-probability
    assert firsts[1][2] == pytest.approx(sum(v for _, v in piece_rows), abs=5e-4)

    # bad prefix files: a line count that differs, a prefix too long for its line's limit
    (tmp_path / "short.txt").write_text("a\nb\n", encoding="utf-8")
    assert (
        cli.translate_main(
            [
                "--workdir",
                runs["a"],
                "--input",
                str(tmp_path / "in.txt"),
                "--prefix-file",
                str(tmp_path / "short.txt"),
            ]
        )
        == 2
    )
    assert f"{tmp_path / 'short.txt'} has 2 line(s) but the input has 6" in capsys.readouterr().err
    long = ["", "", "", "uno dos tres cuatro cinco seis siete ocho", "", ""]
    (tmp_path / "long.txt").write_text("\n".join(long) + "\n", encoding="utf-8")
    assert (
        cli.translate_main(
            [
                "--workdir",
                runs["a"],
                "--input",
                str(tmp_path / "in.txt"),
                "--prefix-file",
                str(tmp_path / "long.txt"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert f"{tmp_path / 'long.txt'}:4: the prefix has" in err and "decode.max_len_a=0.5" in err


def test_score_equals_the_unsmoothed_eval_loss_and_translate_word_scores(
    runs, single, tmp_path, capsys
):
    src, tgt = shipped(400, 6)
    (tmp_path / "src").write_text("\n".join(src) + "\n", encoding="utf-8")
    (tmp_path / "tgt").write_text("\n".join(tgt) + "\n", encoding="utf-8")
    argv = ["--workdir", runs["a"], "--src", str(tmp_path / "src"), "--tgt", str(tmp_path / "tgt")]
    assert cli.score_main([*argv, "--word-scores"]) == 0
    rows = nbest_rows_score(capsys.readouterr().out)
    tok = Tokenizer(Path(runs["a"]) / "spm.model")
    tgt_ids, src_ids = tok.encode(tgt), tok.encode(src)
    for (_, logprob, per_token, score, field), y in zip(rows, tgt_ids):
        pieces = words(field)
        assert [p for p, _ in pieces] == [tok.sp.id_to_piece(int(t)) for t in y]
        assert logprob == pytest.approx(sum(v for _, v in pieces), abs=5e-4)
        assert per_token == pytest.approx(logprob / len(y), abs=2e-4)
        assert score == pytest.approx(logprob / float(length_penalty(len(y), 0.6)), abs=2e-4)
    # the eval step's loss with label smoothing 0 on the same pairs (packed, as in training)
    from seq2seq.trained import load_trained

    _, _, graphdef, params = load_trained(runs["a"])
    batch, _ = packed_batch(src_ids, tgt_ids, 64, 6)
    sums = jax.jit(make_eval_step(graphdef, bos_id=tok.bos_id, label_smoothing=0.0))(params, batch)
    assert float(sums["tokens"]) == sum(len(y) for y in tgt_ids)
    assert -sum(r[1] for r in rows) / float(sums["tokens"]) == pytest.approx(
        float(sums["loss"]) / float(sums["tokens"]), rel=1e-5
    )

    # translate's n-best with --word-scores: the same numbers as seq2seq-score for that pair
    pairs = [(LINES[r[0]], r[1], r) for r in single if LINES[r[0]]]
    (tmp_path / "hsrc").write_text("\n".join(p[0] for p in pairs) + "\n", encoding="utf-8")
    (tmp_path / "htgt").write_text("\n".join(p[1] for p in pairs) + "\n", encoding="utf-8")
    argv = [
        "--workdir",
        runs["a"],
        "--src",
        str(tmp_path / "hsrc"),
        "--tgt",
        str(tmp_path / "htgt"),
    ]
    assert cli.score_main([*argv, "--word-scores"]) == 0
    scored = nbest_rows_score(capsys.readouterr().out)
    same = 0
    for (_, _, row), sc in zip(pairs, scored):
        assert row[2] == pytest.approx(sum(v for _, v in words(row[4])), abs=5e-4)
        if [p for p, _ in words(row[4])] == [p for p, _ in words(sc[4])]:
            same += 1
            assert (row[2], row[3]) == pytest.approx((sc[1], sc[3]), abs=2e-4)
            assert row[4] == sc[4]
    assert same >= len(pairs) // 2

    # bad input: line counts that differ are named, with the unpaired line
    (tmp_path / "tgt5").write_text("\n".join(tgt[:5]) + "\n", encoding="utf-8")
    argv = ["--workdir", runs["a"], "--src", str(tmp_path / "src"), "--tgt", str(tmp_path / "tgt5")]
    assert cli.score_main(argv) == 2
    assert f"has 6 lines but {tmp_path / 'tgt5'} has 5: {tmp_path / 'src'}:6 has no line" in (
        capsys.readouterr().err
    )
