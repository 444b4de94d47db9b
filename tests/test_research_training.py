"""Research workflows of training (issue 16): several corpora with weights, target-language
tags, EMA of the weights and fine-tuning from a trained run (``train.init_from``).

The fast tests check the mixture sampler and the config checks without training; the slow
ones run the real ``seq2seq-train`` on a tiny model: a two-direction run with tags, weights
and EMA (against the brute-force EMA recurrence and an interrupted-and-resumed twin), and a
fine-tuning run from it (against the parent's own loss on the same batch)."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import pytest
from tiny_run import assert_trees_equal, tiny_config, tiny_overrides, write_corpus

from seq2seq import cli
from seq2seq.config import ConfigError, load_config
from seq2seq.data.batching import MIX_BLOCK, MixedBatches, PackedBatches
from seq2seq.data.pipeline import prepare
from seq2seq.data.tokenizer import load_pair
from seq2seq.model import build_model
from seq2seq.run import check_run_config
from seq2seq.trained import average_checkpoints, load_trained
from seq2seq.training.batches import remap_position
from seq2seq.training.checkpoints import Checkpointer
from seq2seq.training.metrics import read_metrics
from seq2seq.training.step import (
    abstract_train_state,
    create_train_state,
    learning_rate_schedule,
    make_eval_step,
    make_optimizer,
)
from seq2seq.workdir import checkpoint_dir

# --- the mixture sampler, without training ---------------------------------------------------


def _corpus(token: int, pairs: int, seed: int = 0) -> PackedBatches:
    """A corpus whose every token is ``token`` (so a batch tells which corpus it came from)."""
    rng = np.random.default_rng(token)
    seqs = [np.full(int(n), token, np.int32) for n in rng.integers(2, 9, pairs)]
    return PackedBatches(seqs, seqs, max_len=16, rows=4, seed=seed)


@pytest.mark.parametrize("weights", [(0.7, 0.3), (5.0, 3.0, 2.0), (0.25, 0.0, 0.75)])
def test_corpus_shares_over_1000_batches_follow_the_weights(weights):
    corpora = [_corpus(10 + i, 30 + 17 * i) for i in range(len(weights))]
    mixed = MixedBatches(corpora, weights, seed=3)
    seen = np.zeros(len(weights))
    for k in range(1000):  # the corpus of each batch, read from the batch itself
        tokens = set(np.unique(mixed.batch_at(k)["src"])) - {0}
        assert len(tokens) == 1
        seen[tokens.pop() - 10] += 1
    expected = np.asarray(weights) / sum(weights)
    np.testing.assert_allclose(seen / 1000, expected, atol=0.02)
    np.testing.assert_array_equal(mixed.counts(1000), seen)  # what the log reports
    # each corpus serves its own batches in order: its j-th turn is its batch j
    turns = np.zeros(len(weights), int)
    for k in range(300):
        c, j = mixed.corpus_at(k)
        assert j == turns[c]
        turns[c] += 1
        for key, value in corpora[c].batch_at(j).items():
            np.testing.assert_array_equal(mixed.batch_at(k)[key], value)


def test_the_mixture_is_a_function_of_seed_and_step():
    def order(seed, steps):
        mixed = MixedBatches([_corpus(10, 40), _corpus(11, 40)], [0.6, 0.4], seed=seed)
        return [mixed.corpus_at(k) for k in steps]

    steps = list(range(3 * MIX_BLOCK))
    forward = order(0, steps)
    assert order(0, steps[::-1])[::-1] == forward  # random access, any order
    assert order(0, [250, 7]) == [forward[250], forward[7]]  # a fresh sampler: same answer
    assert [c for c, _ in order(1, steps)] != [c for c, _ in forward]  # the seed shuffles
    with pytest.raises(ValueError, match="positive sum"):
        MixedBatches([_corpus(10, 5), _corpus(11, 5)], [0.0, 0.0], seed=0)


def _mix_overrides(corpus: dict[str, str], weights=(0.7, 0.3)) -> list[str]:
    """en→es with <2es> and es→en with <2en> from the same files, for all three splits."""

    def entries(split: str, weighted: bool) -> str:
        a, b = (f", weight: {w}" if weighted else "" for w in weights)
        path = corpus[split]
        return (
            f"data.{split}=[{{path: {path}, tag: '<2es>'{a}}}, "
            f"{{path: {path}, src_lang: es, tgt_lang: en, tag: '<2en>'{b}}}]"
        )

    return [entries("train", True), entries("dev", False), entries("test", False)]


def test_corpus_lists_load_and_bad_values_are_named_errors(tmp_path):
    corpus = {s: str(tmp_path / s) for s in ("train", "dev", "test")}
    config = tiny_config(corpus, tmp_path / "run", *_mix_overrides(corpus))
    first, second = config.data.train
    assert (first.tag, first.weight, config.data.direction(first)) == ("<2es>", 0.7, ("en", "es"))
    assert (second.tag, second.weight, config.data.direction(second)) == (
        "<2en>",
        0.3,
        ("es", "en"),
    )
    # one entry of the list by index
    config = tiny_config(corpus, tmp_path / "run", *_mix_overrides(corpus), "data.train.1.weight=2")
    assert config.data.train[1].weight == 2.0
    bad = {
        "data.train.1.weight=-1": "data.train.1.weight must be a finite number >= 0, got -1",
        "data.train.0.weight=0": "must sum to a positive number",
        "data.dev.0.weight=2": "data.dev.0.weight=2.0: weights are for the entries of a data.train",
        "data.train.0.tag='<2 es>'": "data.train.0.tag must be one token",
        "data.test.1.src_lang=en": "data.test.1: source and target language are both 'en'",
        "train.ema_decay=1.0": "train.ema_decay must be in [0, 1) (0 = off; e.g. 0.999), got 1.0",
        "train.init_optimizer=true": "train.init_optimizer=true needs train.init_from",
        f"train.init_from={tmp_path / 'nowhere'}": "not a run directory",
    }
    for override, message in bad.items():
        extra = _mix_overrides(corpus) + (
            ["data.train.1.weight=0"] if "weight=0" in override else []
        )
        with pytest.raises(ConfigError) as e:
            check_run_config(tiny_config(corpus, tmp_path / "run", *extra, override))
        assert message in str(e.value), (override, str(e.value))
    with pytest.raises(ConfigError, match=r"data.train is a list of 2 corpora.*data.train.2"):
        tiny_config(corpus, tmp_path / "run", *_mix_overrides(corpus), "data.train.2.path=x")


def test_bad_corpus_values_stop_seq2seq_train_before_any_work(tmp_path, capsys):
    corpus = {s: str(tmp_path / s) for s in ("train", "dev", "test")}  # never read
    workdir = tmp_path / "run"
    zero = [*_mix_overrides(corpus), "data.train.0.weight=0", "data.train.1.weight=0"]
    assert cli.train_main(tiny_overrides(corpus, workdir, *zero)) == 2
    err = capsys.readouterr().err
    assert "the weights of data.train (0.0, 0.0) must sum to a positive number" in err
    assert "Traceback" not in err and not workdir.exists()
    # a mixture's data position cannot be remapped to another batching
    mixed = MixedBatches([_corpus(10, 20), _corpus(11, 20)], [1, 1], seed=0)
    with pytest.raises(ConfigError, match="several training corpora"):
        remap_position(mixed, 3, None)


# --- the real seq2seq-train on a tiny model --------------------------------------------------

STEPS, DECAY = 4, 0.9


def _run(overrides: list[str], capsys) -> None:
    assert cli.train_main(overrides) == 0, capsys.readouterr().err


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


def _both(corpus, workdir: Path, *extra: str) -> list[str]:
    return tiny_overrides(
        corpus,
        workdir,
        *_mix_overrides(corpus),
        f"train.ema_decay={DECAY}",
        "train.checkpoint_every=1",
        "train.keep_checkpoints=0",
        "train.log_every=1",
        "decode.test_limit=2",
        *extra,
    )


@pytest.fixture(scope="module")
def both(corpus, tmp_path_factory):
    """A two-direction run with tags, weights 0.7/0.3 and EMA: every step checkpointed."""
    workdir = tmp_path_factory.mktemp("both") / "run"
    assert cli.train_main(_both(corpus, workdir, f"train.steps={STEPS}")) == 0
    return workdir


def _restore(workdir: Path, step: int):
    config = load_config(workdir / "config.yaml")
    ck = Checkpointer(checkpoint_dir(workdir), async_save=False)
    try:
        return config, *ck.restore(abstract_train_state(config)[1], step)
    finally:
        ck.close()


@pytest.mark.slow
def test_ema_equals_the_recurrence_of_the_saved_params(both):
    config = load_config(both / "config.yaml")
    t = config.train
    _, init = create_train_state(build_model(config.model, t.seed), make_optimizer(t), t.seed)
    ema = jax.tree.map(np.asarray, init.params)  # the EMA starts at the initial weights
    for step in range(1, STEPS + 1):
        _, state, _ = _restore(both, step)
        params = jax.tree.map(np.asarray, state.params)
        ema = jax.tree.map(
            lambda e, p: np.float32(DECAY) * e + np.float32(1 - DECAY) * p, ema, params
        )
        for want, got in zip(jax.tree.leaves(ema), jax.tree.leaves(state.ema)):
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=1e-7)
    # and it is not the parameters themselves
    assert not np.allclose(jax.tree.leaves(state.ema)[0], jax.tree.leaves(state.params)[0])


@pytest.mark.slow
def test_translate_and_average_read_the_ema(both, tmp_path):
    config = load_config(both / "config.yaml")
    _, state3, _ = _restore(both, 3)
    _, state4, _ = _restore(both, 4)
    assert_trees_equal(load_trained(both, 4)[3], state4.ema)
    output, steps = average_checkpoints(both, tmp_path / "avg", steps=[3, 4])
    averaged = load_trained(output, 4)[3]
    mean = jax.tree.map(
        lambda a, b: ((np.asarray(a, np.float64) + np.asarray(b)) / 2).astype(np.float32),
        state3.ema,
        state4.ema,
    )
    assert_trees_equal(averaged, mean)
    assert config.train.ema_decay == DECAY and steps == [3, 4]


@pytest.mark.slow
def test_a_mixture_with_ema_resumes_exactly(both, corpus, tmp_path, capsys):
    split = tmp_path / "split"
    _run(_both(corpus, split, "train.steps=2"), capsys)
    _run(_both(corpus, split, f"train.steps={STEPS}"), capsys)
    _, whole, whole_meta = _restore(both, STEPS)
    _, resumed, meta = _restore(split, STEPS)
    for part in ("params", "ema", "opt_state", "rng"):
        assert_trees_equal(getattr(whole, part), getattr(resumed, part))
    assert meta["corpus_batches"] == whole_meta["corpus_batches"]
    assert sum(meta["corpus_batches"]) == STEPS


@pytest.mark.slow
def test_tags_are_pieces_and_each_direction_is_scored(both):
    config, _, _ = _restore(both, STEPS)
    data = prepare(config, both)
    sp = data.tokenizer.source.sp
    for tag in ("<2es>", "<2en>"):
        assert sp.piece_to_id(tag) != sp.unk_id()
    assert all(s.startswith("<2es> ") for s in data.dev_text.sources[:16])
    assert all(s.startswith("<2en> ") for s in data.dev_text.sources[16:])
    summary = json.loads((both / "test.json").read_text())
    assert set(summary["test_by_corpus"]) == {"en-es", "es-en"}
    assert [p["sentences"] for p in summary["test_by_corpus"].values()] == [1, 1]
    shares = summary["corpus_shares"]
    counts = data.train.counts(STEPS)
    assert shares == {"en-es": [counts[0] / STEPS, 0.7], "es-en": [counts[1] / STEPS, 0.3]}
    text = (both / "summary.md").read_text(encoding="utf-8")
    assert "| test BLEU en-es |" in text and "| test BLEU es-en |" in text
    assert "| corpus share es-en |" in text and "EMA, decay 0.9" in text
    log = (both / "train.log").read_text(encoding="utf-8")
    assert "corpus shares of the 4 micro-batches so far: en-es" in log
    assert "test es-en: BLEU" in log


@pytest.mark.slow
def test_fine_tuning_starts_from_the_parent_and_resumes_from_itself(both, corpus, tmp_path, capsys):
    child = tmp_path / "child"
    base = tiny_overrides(
        corpus,
        child,
        f"train.init_from={both}",
        "model.dropout_rate=0",  # so the first step's loss is the parent's teacher-forced loss
        "train.log_every=1",
        "decode.test_limit=1",
    )
    _run(base + ["train.steps=1"], capsys)
    assert (child / "spm.model").read_bytes() == (both / "spm.model").read_bytes()
    first = [r for r in read_metrics(child) if r["split"] == "train"][0]
    # independently: the parent's newest parameters on the child's first batch
    parent_config, parent, _ = _restore(both, STEPS)
    config = load_config(child / "config.yaml")
    d = config.data  # the run's own (copied) tokenizer, as seq2seq-train passes it
    reused = load_pair(config.tokenizer, child, src_lang=d.src_lang, tgt_lang=d.tgt_lang)
    data = prepare(config, child, tokenizer=reused)
    batch = data.train.batch_at(0)
    graphdef = abstract_train_state(parent_config)[0]
    step = make_eval_step(
        graphdef, bos_id=data.tokenizer.bos_id, label_smoothing=config.train.label_smoothing
    )
    m = jax.device_get(jax.jit(step)(parent.params, batch))
    assert first["step"] == 1
    np.testing.assert_allclose(first["loss"], m["loss"] / m["tokens"], rtol=1e-5)
    # a rerun resumes the child's own checkpoint, it does not start from the parent again
    _run(base + ["train.steps=2"], capsys)
    log = (child / "train.log").read_text(encoding="utf-8")
    assert log.count("initialised from") == 1 and "resumed from step 1" in log
    # the optimizer state too: the schedule goes on from the parent's step
    again = tmp_path / "again"
    _run(
        tiny_overrides(
            corpus,
            again,
            f"train.init_from={both}/checkpoints/2",
            "train.init_optimizer=true",
            "train.schedule=rsqrt",
            "train.steps=1",
            "train.log_every=1",
            "decode.test_limit=1",
        ),
        capsys,
    )
    lr = [r for r in read_metrics(again) if r["split"] == "train"][0]["learning_rate"]
    schedule = learning_rate_schedule(load_config(again / "config.yaml").train)
    np.testing.assert_allclose(lr, float(schedule(2)), rtol=1e-6)
    _, state, _ = _restore(again, 1)
    count = [x for x in jax.tree.leaves(state.opt_state) if np.ndim(x) == 0]
    assert int(count[0]) == 3  # the parent's two updates and this run's one


@pytest.mark.slow
def test_fine_tuning_refuses_another_model_and_an_unknown_tag(both, corpus, tmp_path, capsys):
    child = tmp_path / "child"
    code = cli.train_main(tiny_overrides(corpus, child, f"train.init_from={both}", "model.d_ff=64"))
    err = capsys.readouterr().err
    assert code == 2 and "model.d_ff is 32 in" in err and "but 64 here" in err
    tagged = f"data.train=[{{path: {corpus['train']}, tag: '<2fr>'}}]"
    code = cli.train_main(tiny_overrides(corpus, child, f"train.init_from={both}", tagged))
    err = capsys.readouterr().err
    assert code == 2 and "data.train.0.tag='<2fr>' is not a piece" in err
