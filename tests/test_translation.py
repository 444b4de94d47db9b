"""Translator (batching, order, long and empty lines, sampling, devices) and the translate and
evaluate commands, on a tiny random model with a real SentencePiece tokenizer."""

import gzip
import io
import json
import logging
import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import sacrebleu
from flax import nnx
from tiny_run import shipped_pairs, xla_flags

from seq2seq import cli
from seq2seq import search as search_module
from seq2seq.config import Config, DataConfig, DecodeConfig, ModelConfig, TokenizerConfig
from seq2seq.data.tokenizer import Tokenizer, train_or_load
from seq2seq.decoding import length_penalty
from seq2seq.model import build_model
from seq2seq.translation import (
    LINE_BREAKS,
    Hypothesis,
    Translator,
    check_decode_config,
    one_line,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "tatoeba-en-es"
# 4 lines in bucket 16 and 2 in bucket 32 (batches of 4 and 2 rows), 2 empty ones; most tests
# decode these so that the compiled searches are shared
LINES = [
    "I can't eat chicken.",  # 18 tokens
    "",
    "Tom is here.",  # 6 tokens
    "Where did you put the keys?",  # 20 tokens
    "   ",
    "Yes.",  # 5 tokens
    "Tom is here.",  # a duplicate
    "Él no está aquí.",  # 8 tokens
]
LONG = ["Tom is here.", "I can't eat chicken.", "Yes.", "Él no está aquí."]
# short outputs (a·|x| + b with a = 0.5) keep the decodes cheap
DECODE = DecodeConfig(beam_size=3, alpha=0.6, max_len_a=0.5, max_len_b=4, max_tokens=4096)
SAMPLING = replace(DECODE, search="sampling", temperature=1.0, top_k=20, seed=1)


def tiny_parts(tokenizer_path, eos_bias=0.0):
    """(tokenizer, graphdef, params) of a random 1-layer model; also used by the 8-device run."""
    tokenizer = Tokenizer(tokenizer_path)
    cfg = ModelConfig(
        vocab_size=tokenizer.vocab_size,
        d_model=16,
        num_heads=2,
        num_encoder_layers=1,
        num_decoder_layers=1,
        d_ff=32,
        dropout_rate=0.0,
    )
    model = build_model(cfg, seed=0)
    if eos_bias:
        # logits = norm(x) · Eᵀ: this norm bias adds eos_bias to the EOS logit
        e = model.embed.embedding[tokenizer.eos_id]
        model.decoder_norm.bias[...] = model.decoder_norm.bias[...] + eos_bias * e / (e @ e)
    graphdef, params = nnx.split(model, nnx.Param)
    return tokenizer, graphdef, params


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory):
    texts = []
    for lang in ("en", "es"):
        with gzip.open(DATA / f"train.{lang}.gz", "rt", encoding="utf-8") as f:
            texts += f.read().split("\n")[:400]
    workdir = tmp_path_factory.mktemp("spm")
    train_or_load(texts, TokenizerConfig(vocab_size=200), workdir)
    return str(workdir / "spm.model")


@pytest.fixture(scope="module")
def parts(tokenizer_path):
    return tiny_parts(tokenizer_path)


def translator(parts, config=DECODE, **kwargs):
    tokenizer, graphdef, params = parts
    return Translator(graphdef, params, tokenizer, config, **kwargs)


def as_tuples(results):
    return [[(h.text, tuple(h.tokens), h.logprob, h.score) for h in hyps] for hyps in results]


def assert_same(a, b):
    """Same texts and tokens; log-probabilities and scores equal up to float32 noise (a batch's
    shape can change the order of additions)."""
    a, b = as_tuples(a), as_tuples(b)
    assert [[h[:2] for h in hyps] for hyps in a] == [[h[:2] for h in hyps] for hyps in b]
    np.testing.assert_allclose(
        [h[2:] for hyps in a for h in hyps],
        [h[2:] for hyps in b for h in hyps],
        rtol=1e-5,
        atol=1e-4,
    )


# -- Translator ----------------------------------------------------------------------------------


def test_batching_and_order_do_not_change_translations(parts):
    tokenizer = parts[0]
    widths = {len(x) for x in tokenizer.encode([line for line in LINES if line.strip()])}
    assert min(widths) <= 16 < max(widths) <= 32  # two buckets
    one_per_batch = translator(parts, replace(DECODE, max_tokens=16)).translate(LINES, nbest=3)
    batched = translator(parts).translate(LINES, nbest=3)
    assert_same(one_per_batch, batched)
    for i, line in enumerate(LINES):  # the input order is restored
        if line.strip():
            assert_same(translator(parts).translate([line], nbest=3), [batched[i]])
    assert_same([batched[2]], [batched[6]])  # duplicates translate alike
    for line, hyps in zip(LINES, batched):
        if not line.strip():
            continue
        assert len(hyps) == 3
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        for h in hyps:
            assert h.text == tokenizer.decode([h.tokens])[0]
            assert tokenizer.eos_id not in h.tokens and tokenizer.pad_id not in h.tokens
            n = len(tokenizer.encode([line])[0])
            assert len(h.tokens) + 1 <= np.ceil(DECODE.max_len_a * n + DECODE.max_len_b)
            np.testing.assert_allclose(
                h.score,
                h.logprob / float(length_penalty(len(h.tokens) + 1, DECODE.alpha)),
                rtol=1e-5,
            )


def test_empty_lines_give_empty_output_without_decoding(parts, monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("nothing should be decoded")

    monkeypatch.setattr(search_module, "beam_search_jit", fail)
    empty = Hypothesis("", (), 0.0, 0.0)
    assert translator(parts).translate(["", "  ", "\t"], nbest=2) == [[empty]] * 3
    assert translator(parts).translate([]) == []


def test_long_lines_are_truncated_with_a_warning_or_rejected(parts, caplog):
    with caplog.at_level(logging.WARNING, logger="seq2seq.translation"):
        out = translator(parts, max_src_len=16).translate(LONG)
    assert "line 2: 18 tokens, truncated to 16" in caplog.text
    assert caplog.text.count("truncated") == 1
    assert all(len(hyps) == 1 for hyps in out)
    full = translator(parts).translate(LONG)
    assert_same([out[0], out[2], out[3]], [full[0], full[2], full[3]])
    with pytest.raises(
        ValueError,
        match=r"1 line\(s\) longer than the limit of 16 tokens: "
        r"line 2 \(18 tokens\)",
    ):
        translator(parts, max_src_len=16, on_long="reject").translate(LONG)


def test_greedy_and_min_length(tokenizer_path, parts):
    greedy = translator(parts, replace(DECODE, beam_size=1, alpha=0.0)).translate(LINES)
    # beam 1 is greedy search: with α = 0 the score is the log-probability
    assert all(h[0].score == h[0].logprob < 0 for line, h in zip(LINES, greedy) if line.strip())
    assert len({h[0].text for h in greedy}) > 2
    # EOS made likely: without a minimum every translation is empty or nearly so
    eager = tiny_parts(tokenizer_path, eos_bias=40.0)
    free = translator(eager).translate(LINES)
    assert max(len(h[0].tokens) for h in free) <= 1
    for config, nbest in ((replace(DECODE, min_length=3), 3), (replace(SAMPLING, min_length=3), 2)):
        out = translator(eager, config).translate(LINES, nbest=nbest)
        for line, hyps in zip(LINES, out):
            if line.strip():
                assert len(hyps) == nbest and all(len(h.tokens) >= 3 for h in hyps)


def test_sampling_is_seeded_per_line(parts):
    one_per_batch = translator(parts, replace(SAMPLING, max_tokens=16)).translate(LINES, nbest=3)
    batched = translator(parts, SAMPLING).translate(LINES, nbest=3)
    assert_same(one_per_batch, batched)  # independent of the batching
    other = translator(parts, replace(SAMPLING, seed=2)).translate(LINES, nbest=3)
    assert [h.tokens for hyps in other for h in hyps] != [
        h.tokens for hyps in batched for h in hyps
    ]
    # a duplicate line is sampled afresh (its own line key)
    assert [h.tokens for h in batched[2]] != [h.tokens for h in batched[6]]
    for line, hyps in zip(LINES, batched):
        if line.strip():
            assert len(hyps) == 3 and len({h.tokens for h in hyps}) > 1
            assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)


def test_invalid_options_are_rejected(parts):
    with pytest.raises(ValueError, match="between 1 and the beam size 3"):
        translator(parts).translate(["Yes."], nbest=4)
    assert translator(parts, SAMPLING).translate([""], nbest=4) == [[Hypothesis("", (), 0, 0)]]
    bad = [
        (dict(beam_size=0), "decode.beam_size"),
        (dict(alpha=-1.0), "decode.alpha"),
        (dict(length_penalty="x"), "decode.length_penalty"),
        (dict(top_p=0.0), "decode.top_p"),
        (dict(temperature=0.0), "decode.temperature"),
        (dict(min_length=-1), "decode.min_length"),
        (dict(max_tokens=0), "decode.max_tokens"),
    ]
    for change, key in bad:
        with pytest.raises(ValueError, match=key):
            check_decode_config(replace(DECODE, **change))
    with pytest.raises(ValueError, match="on_long"):
        translator(parts, on_long="drop")


SHARDED = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    from test_translation import DECODE, LINES, SAMPLING, as_tuples, tiny_parts
    from seq2seq.config import MeshConfig
    from seq2seq.sharding import Partitioner, make_mesh
    from seq2seq.translation import Translator
    assert jax.device_count() == 8, jax.devices()
    tokenizer, graphdef, params = tiny_parts(sys.argv[1])
    partitioner = Partitioner(make_mesh(MeshConfig(data=8)))
    out = {}
    for name, config in (("beam", DECODE), ("sampling", SAMPLING)):
        t = Translator(graphdef, params, tokenizer, config, partitioner=partitioner)
        x = t.partitioner.shard_batch({"src": np.zeros((8, 16), np.int32)})["src"]
        assert len(x.sharding.device_set) == 8 and x.sharding.shard_shape(x.shape) == (1, 16)
        out[name] = as_tuples(t.translate(LINES, nbest=3))
    print(json.dumps(out))
""")


def test_translation_is_identical_on_1_and_8_devices(parts, tokenizer_path):
    # the child imports this module (and conftest) from tests/
    path = os.pathsep.join(filter(None, [str(Path(__file__).parent), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, XLA_FLAGS=xla_flags(8), JAX_PLATFORMS="cpu", PYTHONPATH=path)
    proc = subprocess.run(
        [sys.executable, "-c", SHARDED, tokenizer_path],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    sharded = json.loads(proc.stdout.strip().splitlines()[-1])
    for name, config in (("beam", DECODE), ("sampling", SAMPLING)):
        single = translator(parts, config).translate(LINES, nbest=3)
        assert_same(
            [[Hypothesis(h[0], tuple(h[1]), h[2], h[3]) for h in hyps] for hyps in sharded[name]],
            single,
        )


# -- seq2seq-translate and seq2seq-evaluate ------------------------------------------------------


@pytest.fixture
def run(parts, monkeypatch, tmp_path):
    """A fake run directory: ``load_trained`` returns the tiny model and a config."""
    tokenizer, graphdef, params = parts
    config = Config(workdir=str(tmp_path), data=DataConfig(max_len=32), decode=DECODE)

    def load_trained(workdir, step=None, matmul_dtype=None):
        assert workdir == "RUN"
        return config, tokenizer, graphdef, params

    monkeypatch.setattr("seq2seq.trained.load_trained", load_trained)
    return tmp_path


def stdin(monkeypatch, data: bytes):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


def test_translate_command_stdin_to_stdout(run, parts, monkeypatch, capsys):
    stdin(monkeypatch, "\n".join(LINES).encode() + b"\r\n")
    assert cli.translate_main(["--workdir", "RUN"]) == 0
    expected = [h[0].text for h in translator(parts).translate(LINES)]
    assert capsys.readouterr().out.split("\n") == expected + [""]


def test_translate_command_nbest_file_to_file(run, parts, capsys):
    (run / "in.txt").write_text("\n".join(LINES) + "\n", encoding="utf-8")
    argv = [
        "--workdir",
        "RUN",
        "--input",
        str(run / "in.txt"),
        "--output",
        str(run / "out.txt"),
        "--nbest",
        "2",
    ]
    assert cli.translate_main(argv) == 0
    assert capsys.readouterr().out == ""
    rows = [r.split(" ||| ") for r in (run / "out.txt").read_text(encoding="utf-8").splitlines()]
    results = translator(parts).translate(LINES, nbest=2)
    expected = [
        [str(i), h.text, f"{h.logprob:.4f}", f"{h.score:.4f}"]
        for i, hyps in enumerate(results)
        for h in hyps
    ]
    assert rows == expected
    assert [r[0] for r in rows] == [
        "0",
        "0",
        "1",
        "2",
        "2",
        "3",
        "3",
        "4",
        "5",
        "5",
        "6",
        "6",
        "7",
        "7",
    ]  # empty lines give one empty hypothesis


def test_translate_command_sampling(run, parts, capsys):
    (run / "in.txt").write_text("\n".join(LINES) + "\n", encoding="utf-8")
    argv = [
        "--workdir",
        "RUN",
        "--input",
        str(run / "in.txt"),
        "--sampling",
        "--top-k",
        "20",
        "--seed",
        "1",
        "--temperature",
        "1.0",
        "--nbest",
        "3",
    ]
    assert cli.translate_main(argv) == 0
    rows = capsys.readouterr().out.splitlines()
    results = translator(parts, SAMPLING).translate(LINES, nbest=3)
    assert rows == [
        f"{i} ||| {h.text} ||| {h.logprob:.4f} ||| {h.score:.4f}"
        for i, hyps in enumerate(results)
        for h in hyps
    ]


def test_translate_command_options_reach_the_translator(run, monkeypatch, capsys):
    seen = {}

    class FakeTranslator:
        def __init__(self, graphdef, params, tokenizer, config, max_src_len, on_long, partitioner):
            seen.update(
                config=config,
                max_src_len=max_src_len,
                on_long=on_long,
                mesh=dict(partitioner.mesh.shape),
            )

        def log_unknown_rate(self, lines, name="input"):
            return 0.0

        def translate(self, lines, nbest=1, progress=False, source=None):
            seen.update(nbest=nbest, progress=progress)
            return [[Hypothesis(line.upper(), (), -1.0, -0.5)] * nbest for line in lines]

    monkeypatch.setattr("seq2seq.translation.Translator", FakeTranslator)
    (run / "in.txt").write_text("a\nb\n", encoding="utf-8")
    argv = [
        "--workdir",
        "RUN",
        "--input",
        str(run / "in.txt"),
        "--alpha",
        "1.0",
        "--min-length",
        "2",
        "--max-tokens",
        "100",
        "--sampling",
        "--temperature",
        "0.7",
        "--top-k",
        "7",
        "--top-p",
        "0.9",
        "--seed",
        "3",
        "--max-src-tokens",
        "40",
        "--on-long",
        "reject",
        "--nbest",
        "2",
    ]
    assert cli.translate_main(argv) == 0
    assert capsys.readouterr().out == (
        "0 ||| A ||| -1.0000 ||| -0.5000\n" * 2 + "1 ||| B ||| -1.0000 ||| -0.5000\n" * 2
    )
    assert seen == dict(
        config=replace(
            DECODE,
            alpha=1.0,
            min_length=2,
            max_tokens=100,
            search="sampling",
            temperature=0.7,
            top_k=7,
            top_p=0.9,
            seed=3,
        ),
        max_src_len=40,
        on_long="reject",
        nbest=2,
        progress=True,
        mesh={"data": 1, "fsdp": 1, "tensor": 1},
    )  # the run's mesh, here
    # defaults: the run's decode config, max(data.max_len, 256) tokens, no progress bar on stdin
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"x\n"), encoding="utf-8"))
    assert cli.translate_main(["--workdir", "RUN"]) == 0
    assert capsys.readouterr().out == "X\n"
    assert seen == dict(
        config=DECODE,
        max_src_len=256,
        on_long="truncate",
        nbest=1,
        progress=False,
        mesh={"data": 1, "fsdp": 1, "tensor": 1},
    )
    # sampling options without --sampling, and out-of-range values, are errors
    assert (
        cli.translate_main(
            ["--workdir", "RUN", "--input", str(run / "in.txt"), "--top-k", "5", "--seed", "2"]
        )
        == 2
    )
    assert "--top-k, --seed only apply with --sampling" in capsys.readouterr().err
    for bad, message in (
        (["--top-p", "1.5"], "must be in (0, 1]"),
        (["--temperature", "0"], "must be > 0"),
        (["--beam", "0"], "must be ≥ 1"),
        (["--on-long", "drop"], "invalid choice"),
    ):
        with pytest.raises(SystemExit):
            cli.translate_main(["--workdir", "RUN", "--sampling"] + bad)
        assert message in capsys.readouterr().err


def test_mbr_command_samples_with_epsilon_and_refuses_beam(run, capsys):
    """``--search mbr`` on a run whose config leaves ``decode.epsilon`` to the search (null)
    samples its candidates with ε = 0.02 (Freitag et al. 2023): the output of ``--epsilon
    0.02``, not of ``--epsilon 0`` (before: ε 0, the full distribution). ``--beam``, which
    only beam search reads (MBR's candidate beam is ``--mbr-size``), is refused by name
    (before: ignored)."""
    (run / "in.txt").write_text("\n".join(LINES) + "\n", encoding="utf-8")
    mbr = ["--workdir", "RUN", "--input", str(run / "in.txt"), "--search", "mbr"]
    mbr += ["--mbr-size", "4", "--nbest", "2"]
    out = {}
    for eps in (None, "0.02", "0"):
        assert cli.translate_main(mbr + ([] if eps is None else ["--epsilon", eps])) == 0
        out[eps] = capsys.readouterr().out
    assert out[None] == out["0.02"] != out["0"]
    for extra in ([], ["--mbr-candidates", "beam"], ["--search", "sampling"]):
        assert cli.translate_main([*mbr, *extra, "--beam", "8"]) == 2
        captured = capsys.readouterr()
        search = "sampling" if extra[1:] == ["sampling"] else "mbr"
        assert captured.out == "" and captured.err == (
            f"error: --beam only applies with --search beam, not {search} (MBR's candidates "
            "with --mbr-candidates beam are the n-best of a beam of --mbr-size)\n"
        )


def test_translate_command_names_the_bad_line(run, monkeypatch, capsys):
    (run / "bad.txt").write_bytes(b"ok\nstill ok\n" + b"caf\xe9\n")
    assert cli.translate_main(["--workdir", "RUN", "--input", str(run / "bad.txt")]) == 2
    err = capsys.readouterr().err
    assert f"{run / 'bad.txt'}:3: invalid UTF-8 (byte 0xe9 at byte 4 of the line)" in err
    stdin(monkeypatch, b"\xff\n")
    assert cli.translate_main(["--workdir", "RUN"]) == 2
    assert "<stdin>:1: invalid UTF-8 (byte 0xff at byte 1 of the line)" in capsys.readouterr().err


def test_translate_command_long_lines(run, capsys):
    (run / "in.txt").write_text("\n".join(LONG) + "\n", encoding="utf-8")
    base = ["--workdir", "RUN", "--input", str(run / "in.txt"), "--max-src-tokens", "16"]
    assert cli.translate_main(base) == 0
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 4
    assert f"{run / 'in.txt'}:2: 18 tokens, truncated to 16" in captured.err
    assert cli.translate_main(base + ["--on-long", "reject"]) == 2
    captured = capsys.readouterr()
    assert (
        captured.out == ""
        and (f"{run / 'in.txt'}: 1 line(s) longer than the limit of 16 tokens: line 2 (18 tokens)")
        in captured.err
    )


def test_evaluate_command(run, parts, capsys):
    refs = [
        "No puedo comer pollo.",
        "",
        "Tom está aquí.",
        "¿Dónde pusiste las llaves?",
        "",
        "Sí.",
        "Tom está aquí.",
        "Dijo que volvería.",
    ]
    (run / "src.en").write_text("\n".join(LINES) + "\n", encoding="utf-8")
    (run / "ref.es").write_text("\n".join(refs) + "\n", encoding="utf-8")
    argv = [
        "--workdir",
        "RUN",
        "--src",
        str(run / "src.en"),
        "--ref",
        str(run / "ref.es"),
        "--output",
        str(run / "hyp.es"),
    ]
    assert cli.evaluate_main(argv) == 0
    out = capsys.readouterr().out
    hyps = (run / "hyp.es").read_text(encoding="utf-8").split("\n")[:-1]
    assert hyps == [h[0].text for h in translator(parts).translate(LINES)]
    bleu = sacrebleu.BLEU().corpus_score(hyps, [refs])
    chrf = sacrebleu.CHRF().corpus_score(hyps, [refs])
    assert f"BLEU = {bleu.score:.2f} (nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:" in out
    assert f"chrF = {chrf.score:.2f} (nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:" in out
    assert "8 sentences in" in out and "beam 3, alpha 0.6" in out

    (run / "short.es").write_text("uno\n", encoding="utf-8")
    assert cli.evaluate_main(argv[:4] + ["--ref", str(run / "short.es")]) == 2
    assert "has 8 lines but" in capsys.readouterr().err
    assert cli.evaluate_main(["--workdir", "RUN", "--src", str(run / "src.en")]) == 2
    assert "give both --src and --ref" in capsys.readouterr().err
    (run / "empty").write_text("", encoding="utf-8")
    assert (
        cli.evaluate_main(
            ["--workdir", "RUN", "--src", str(run / "empty"), "--ref", str(run / "empty")]
        )
        == 2
    )
    assert "need as many hypotheses as references (> 0)" in capsys.readouterr().err
    assert cli.evaluate_main(argv[:4] + ["--ref", str(run / "missing.es")]) == 2
    assert "missing.es" in capsys.readouterr().err


# -- byte pieces: one line out per line in --------------------------------------------------------


@pytest.fixture(scope="module")
def byte_run(tmp_path_factory):
    """A run directory: a byte-fallback SentencePiece model (400 pieces, 256 of them bytes)
    and a random tiny model whose output favours the newline byte piece ``<0x0A>``."""
    import jax

    from seq2seq.config import load_config, save_config
    from seq2seq.training.checkpoints import Checkpointer
    from seq2seq.training.step import create_train_state, make_optimizer
    from seq2seq.workdir import checkpoint_dir, config_path

    texts = []
    for lang in ("en", "es"):
        with gzip.open(DATA / f"train.{lang}.gz", "rt", encoding="utf-8") as f:
            texts += f.read().split("\n")[:400]
    workdir = tmp_path_factory.mktemp("bytes") / "run"
    keys = ["tokenizer.vocab_size=400", "tokenizer.byte_fallback=true"]
    tokenizer = train_or_load(texts, load_config(None, keys).tokenizer, workdir)
    sizes = dict(d_model=16, num_heads=2, d_ff=32, num_encoder_layers=1, num_decoder_layers=1)
    config = load_config(
        None,
        [
            f"workdir={workdir}",
            *keys,
            f"model.vocab_size={tokenizer.vocab_size}",
            "model.dropout_rate=0.0",
            *(f"model.{k}={v}" for k, v in sizes.items()),
            "decode.max_len_a=0.5",
            "decode.max_len_b=8",
        ],
    )
    save_config(config, config_path(workdir))
    model = build_model(config.model, seed=0)
    newline = tokenizer.piece_to_id("<0x0A>")
    assert tokenizer.sp.is_byte(newline)
    e = model.embed.embedding[newline]  # logits = norm(x) · Eᵀ: +5 on the newline's logit
    model.decoder_norm.bias[...] = model.decoder_norm.bias[...] + 5.0 * e / (e @ e)
    _, state = create_train_state(model, make_optimizer(config.train), 0)
    ck = Checkpointer(checkpoint_dir(workdir), keep=None, async_save=False)
    try:
        ck.save(1, state.replace(step=jax.numpy.asarray(1, jax.numpy.int32)), {"step": 1})
    finally:
        ck.close()
    return workdir


def test_sampled_line_breaks_never_split_a_translation(byte_run, tmp_path, capsys):
    """Samples of a byte-fallback model decode byte pieces as SentencePiece does; each line
    break in them (what ``str.splitlines`` splits on: ``<0x0A>``, ``<0x0D>``, ``<0x0B>``,
    ``<0x1C>``, ... pieces) becomes a space and is counted, so translate and bulk translation
    write one line per input line (before: more lines out than in)."""
    from seq2seq.inference import open_run

    lines = [en for en, _ in shipped_pairs(0, 12)]
    src = tmp_path / "in.en"
    src.write_text("".join(s + "\n" for s in lines), encoding="utf-8")
    sampling = ["--sampling", "--seed", "0"]
    assert cli.translate_main(["--workdir", str(byte_run), "--input", str(src), *sampling]) == 0
    captured = capsys.readouterr()
    # the reference: SentencePiece's own decode of each sample's ids, split as Python splits
    opened = open_run([(byte_run, None)], decode_changes={"search": "sampling", "seed": 0})
    hyps = [h[0] for h in opened.translator().translate(lines)]
    sp = opened.tokenizer.target.sp
    raw = [sp.decode(list(h.tokens)) for h in hyps]
    parts = [(text + "x").splitlines() for text in raw]  # "x": a break at the end counts too
    breaks = [len(p) - 1 for p in parts]
    assert sum("\n" in text for text in raw) >= 2 and sum(breaks) > sum(t.count("\n") for t in raw)
    expected = [" ".join(p)[:-1] for p in parts]
    assert [h.text for h in hyps] == expected and [h.line_breaks for h in hyps] == breaks
    assert captured.out == "".join(t + "\n" for t in expected)
    assert len(captured.out.splitlines()) == len(lines)
    first = next(i for i, n in enumerate(breaks) if n) + 1
    assert (
        f"{src}: {sum(breaks)} line break(s) in the translations of "
        f"{sum(n > 0 for n in breaks)} line(s) replaced by spaces (first: line {first})"
    ) in captured.err

    out = tmp_path / "bulk"
    argv = ["--workdir", str(byte_run), "--input", str(src), "--output-dir", str(out)]
    assert cli.translate_main([*argv, "--chunk-lines", "12", *sampling]) == 0  # plain's shapes
    merged = (out / "translations.txt").read_text(encoding="utf-8")
    assert merged == captured.out and len(merged.splitlines()) == len(lines)
    totals = json.loads((out / "report.json").read_text(encoding="utf-8"))["totals"]
    assert (totals["lines"], totals["line_breaks"]) == (len(lines), sum(breaks))
    err = capsys.readouterr().err
    assert f"{len(lines)} lines in 1 chunks" in err
    assert f"{sum(breaks)} line breaks in translations replaced by spaces" in err
    # every character str.splitlines splits on, and no other, is a break; CRLF is one
    every = "".join(map(chr, range(0x110000)))  # each break ends one part (the last: none)
    splits = {part[-1] for part in every.splitlines(keepends=True)[:-1]}
    assert set(LINE_BREAKS.findall(every)) == splits and len(splits) == 10
    assert one_line("a\r\nb\u2028") == ("a b ", 2)
