"""A bad value or a combination that cannot work stops ``seq2seq-train`` before any work,
with an error naming the key (exit status 2, no tokenizer trained, no data read); and the
bad-input sweep of docs/bad_inputs.md over train, translate, evaluate and average."""

import pytest
from tiny_run import tiny_overrides, write_corpus

from seq2seq import cli


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["decode.length_penalty=gnmt2"], "decode.length_penalty must be one of gnmt, plain, none"),
        (["decode.beam_size=0"], "decode.beam_size must be ≥ 1"),
        (["decode.top_p=1.5"], "decode.top_p"),
        (
            ["data.test.format=parquet"],
            "data.test.format must be one of text, tsv, csv, jsonl, hub, disk",
        ),
        (["data.max_tokens=16"], "data.max_tokens=16 is less than one row of data.max_len=32"),
        (
            ["model.positions=learned", "model.max_len=16"],
            "model.max_len=16 positions, fewer than data.max_len=32",
        ),
        (
            ["model.positions=learned", "model.max_len=128"],  # decodes 1.0 × 128 + 4 tokens
            "model.positions=learned has a table of model.max_len=128 positions, but outputs may "
            "reach decode.max_len_a=1.0 × 128 source tokens (the test decode's source limit "
            "max(data.max_len, 256) up to model.max_len) + decode.max_len_b=4 = 132 tokens; "
            "set model.max_len=260 or more, or lower decode.max_len_a / decode.max_len_b",
        ),
        (
            ["model.positions=learned", "decode.max_len_a=2.5"],
            "outputs may reach decode.max_len_a=2.5 × 256 source tokens",
        ),
        (["model.positions=absolute"], "model.positions must be one of sinusoidal, learned"),
        (["model.num_heads=3"], "model.d_model=16 is not divisible by model.num_heads=3"),
        (["tokenizer.model_type=word"], "tokenizer.model_type='word'"),
        (["tokenizer.joint=false", "model.share_embeddings=all"], "model.share_embeddings=target"),
        (["train.best_metric=bleu", "train.dev_bleu=false"], "train.best_metric=bleu needs"),
        (["mesh.data=2"], "mesh data=2, fsdp=1, tensor=1 needs 2 devices but there are 1"),
        (["mesh.tensor=3", "mesh.data=1"], "mesh data=1, fsdp=1, tensor=3 needs 3 devices"),
    ],
)
def test_bad_value_is_named_before_any_work(tmp_path, capsys, overrides, message):
    corpus = write_corpus(tmp_path / "corpus", train=50, dev=4, test=2)
    workdir = tmp_path / "run"
    assert cli.train_main(tiny_overrides(corpus, workdir, *overrides)) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
    assert not workdir.exists()  # no run directory, no train.log: nothing started
    assert "config:" not in err  # refused before the resolved config is logged


# The bad-input sweep of docs/bad_inputs.md: every entry point, each input of the table gives
# exit status 2 and a message naming what is wrong (no traceback). {tmp}: the test's files,
# {run}: a tiny trained run, {broken}: the same run with its checkpoint emptied.
SWEEP = [
    ("train", ["--config", "{tmp}/nope.yaml"], "config file not found: {tmp}/nope.yaml"),
    ("train", ["--config", "{tmp}/list.yaml"], "{tmp}/list.yaml: top level must be a mapping"),
    ("train", ["--config", "{tmp}/bad.yaml"], "{tmp}/bad.yaml:3: invalid YAML: expected the node"),
    ("train", ["train.steps"], "override 'train.steps' must look like key=value"),
    (
        "train",
        ["data.train.path={tmp}/mis"],
        "train: {tmp}/mis.en has 2 lines but {tmp}/mis.es has 1",
    ),
    ("train", ["data.train.path={tmp}/u8"], "{tmp}/u8.en:2: invalid UTF-8 (byte 0xff at byte 1"),
    (
        "train",
        ["data.tgt_lang=de"],
        "file not found: {corpus}/train.de (nor train.de.gz) for "
        "language 'de'; languages found for {corpus}/train: en, es",
    ),
    ("train", ["workdir={tmp}/afile"], "workdir={tmp}/afile: cannot hold the run"),
    ("train", ["tokenizer.vocab_size=50000"], "set tokenizer.vocab_size="),
    (
        "translate",
        ["--workdir", "{tmp}", "--input", "{tmp}/in.txt"],
        "{tmp} is not a run directory (no config.yaml)",
    ),
    ("translate", ["--workdir", "{run}", "--input", "{tmp}/nope"], "{tmp}/nope: cannot read"),
    (
        "translate",
        ["--workdir", "{run}", "--input", "{tmp}/in.txt", "--output", "{tmp}/no/out.txt"],
        "--output {tmp}/no/out.txt: no directory {tmp}/no",
    ),
    (
        "translate",
        ["--workdir", "{run}", "--input", "{tmp}/bad.txt"],
        "{tmp}/bad.txt:2: invalid UTF-8 (byte 0xe9 at byte 4 of the line)",
    ),
    (
        "translate",
        ["--workdir", "{run}", "--input", "{tmp}/in.txt", "--step", "999"],
        "no checkpoint of step 999 in {run}/checkpoints; available: [1]",
    ),
    (
        "translate",
        ["--workdir", "{run}", "--input", "{tmp}/in.txt", "--nbest", "5"],
        "nbest=5 must be between 1 and the beam size 1",
    ),
    (
        "translate",
        ["--workdir", "{broken}", "--input", "{tmp}/in.txt"],
        "checkpoint {broken}/checkpoints/1 cannot be read, it is incomplete or damaged",
    ),
    ("evaluate", ["--workdir", "{run}", "--src", "{tmp}/in.txt"], "give both --src and --ref"),
    (
        "evaluate",
        ["--workdir", "{run}", "--src", "{tmp}/in.txt", "--ref", "{tmp}/two.txt"],
        "{tmp}/in.txt has 1 lines but {tmp}/two.txt has 2",
    ),
    (
        "evaluate",
        ["--workdir", "{run}", "--src", "{tmp}/in.txt", "--ref", "{tmp}/pieces.txt"],
        "{tmp}/pieces.txt: 1 of 1 lines contain SentencePiece pieces",
    ),
    (
        "evaluate",
        ["--workdir", "{run}", "--src", "{tmp}/empty.txt", "--ref", "{tmp}/empty.txt"],
        "need as many hypotheses as references (> 0)",
    ),
    (
        "average",
        ["--workdir", "{run}", "--last", "5"],
        "asked for the last 5 checkpoints but {run}/checkpoints has 1: [1]",
    ),
    ("average", ["--workdir", "{run}", "--steps", "1,x"], "--steps must be comma-separated"),
    ("average", ["--workdir", "{run}", "--steps", "999"], "no checkpoint of step(s) [999]"),
    ("average", ["--workdir", "{broken}", "--last", "1"], "incomplete or damaged"),
]


@pytest.fixture(scope="module")
def sweep_files(tmp_path_factory):
    """The bad files of the sweep, and a tiny run trained for one step (and a broken copy)."""
    import shutil

    tmp = tmp_path_factory.mktemp("sweep")
    corpus = write_corpus(tmp / "corpus", train=100, dev=4, test=2)
    for name, data in {
        "list.yaml": b"- 1\n",
        "bad.yaml": b"train:\n  steps: [1,\n",
        "mis.en": b"a\nb\n",
        "mis.es": b"a\n",
        "u8.en": b"a\n\xff\n",
        "u8.es": b"a\nb\n",
        "afile": b"x",
        "bad.txt": b"ok\ncaf\xe9\n",
        "in.txt": b"Hello.\n",
        "two.txt": b"a\nb\n",
        "pieces.txt": "\u2581Hola .\n".encode(),
        "empty.txt": b"",
    }.items():
        (tmp / name).write_bytes(data)
    run = tmp / "run"
    assert cli.train_main(tiny_overrides(corpus, run, "train.steps=1")) == 0
    shutil.copytree(run, tmp / "broken")
    for item in (tmp / "broken" / "checkpoints" / "1").iterdir():
        shutil.rmtree(item) if item.is_dir() else item.unlink()
    return {
        "tmp": str(tmp),
        "run": str(run),
        "broken": str(tmp / "broken"),
        "corpus": str(tmp / "corpus"),
        "overrides": tiny_overrides(corpus, tmp / "w", "train.steps=1"),
    }


@pytest.mark.parametrize(
    "command, args, message", SWEEP, ids=[f"{c}-{i}" for i, (c, _, _) in enumerate(SWEEP)]
)
def test_bad_input_sweep(sweep_files, capsys, command, args, message):
    fill = lambda text: text.format(**sweep_files)  # noqa: E731
    argv = [fill(a) for a in args]
    if command == "train" and not argv[0].startswith("--config"):
        argv = sweep_files["overrides"] + argv
    main = getattr(cli, f"{command}_main")
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2 and fill(message) in err and "Traceback" not in err, err


def test_translate_checks_the_run_before_it_waits_for_standard_input(tmp_path):
    import subprocess
    import sys

    from tiny_run import ROOT, cli_env

    # standard input stays open: the error must not wait for it
    proc = subprocess.Popen(
        [sys.executable, "-m", "seq2seq", "translate", "--workdir", str(tmp_path / "nothing")],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=cli_env(),
    )
    try:
        proc.wait(timeout=120)  # not communicate(): it would close standard input
    finally:
        proc.kill()
    err = proc.stderr.read()
    assert proc.returncode == 2 and "is not a run directory (no config.yaml)" in err
