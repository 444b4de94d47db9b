"""Best-metric tracking and patience, including the JSON round trip that carries them across
resume."""

import math

import pytest

from seq2seq.training.early_stopping import BestTracker


def test_bleu_higher_is_better_and_patience_counts_evaluations():
    t = BestTracker("bleu")
    assert t.update(10.0, 100) and (t.value, t.step) == (10.0, 100)
    assert not t.update(10.0, 200)  # equal is not an improvement
    assert not t.update(9.5, 300)
    assert t.evals_without_improvement == 2 and not t.should_stop(3) and t.should_stop(2)
    assert t.update(11.0, 400) and t.evals_without_improvement == 0 and t.step == 400
    assert not t.should_stop(0)  # patience 0: never stop


def test_loss_lower_is_better_and_nan_never_improves():
    t = BestTracker("loss")
    assert not t.update(math.nan, 1) and t.value is None
    assert t.update(3.0, 2) and not t.update(3.5, 3) and t.update(2.0, 4)
    assert (t.value, t.step, t.evals_without_improvement) == (2.0, 4, 0)


def test_json_round_trip_and_metric_change_resets():
    t = BestTracker("bleu")
    t.update(5.0, 10)
    t.update(4.0, 20)
    saved = t.to_json()
    assert saved == {
        "metric": "bleu",
        "value": 5.0,
        "step": 10,
        "loss": None,
        "evals_without_improvement": 1,
    }
    assert BestTracker.from_json(saved, "bleu") == t
    assert BestTracker.from_json(saved, "loss") == BestTracker("loss")
    assert BestTracker.from_json(None, "bleu") == BestTracker("bleu")
    with pytest.raises(ValueError, match="unknown best metric"):
        BestTracker("accuracy")


def test_equal_bleu_with_lower_dev_loss_improves():
    t = BestTracker("bleu")
    assert t.update(0.0, 4, loss=5.9)
    assert not t.update(0.0, 8, loss=6.0)  # equal BLEU, higher loss
    assert t.update(0.0, 12, loss=5.5) and (t.step, t.loss, t.evals_without_improvement) == (
        12,
        5.5,
        0,
    )
    assert not t.update(0.0, 16)  # no loss given: a tie does not improve
    assert t.update(0.5, 20, loss=7.0)  # higher BLEU wins whatever the loss
    loss = BestTracker("loss")
    assert loss.update(3.0, 1, loss=3.0) and not loss.update(3.0, 2, loss=3.0)


def test_chrf_higher_is_better_with_the_loss_tie_break():
    t = BestTracker("chrf")
    assert t.mode == "max" and t.update(40.0, 2, loss=5.0) and not t.update(39.0, 4, loss=4.0)
    assert not t.update(40.0, 6, loss=5.5) and t.update(40.0, 8, loss=4.5) and t.step == 8


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from tiny_run import write_corpus

    from seq2seq.config import TokenizerConfig
    from seq2seq.data.tokenizer import train_or_load

    d = tmp_path_factory.mktemp("corpus")
    paths = write_corpus(d)
    sentences = []
    for lang in ("en", "es"):
        sentences += (d / f"train.{lang}").read_text(encoding="utf-8").splitlines()
    train_or_load(sentences, TokenizerConfig(vocab_size=200), d / "spm")
    paths["spm"] = str(d / "spm" / "spm.model")
    return paths


@pytest.mark.slow
@pytest.mark.parametrize("metric, best", [("chrf", 4), ("bleu", 2)])
def test_a_run_keeps_and_tests_the_best_checkpoint_by_dev_chrf(corpus, tmp_path, metric, best):
    """Scripted dev scores (BLEU best at step 2, chrF at step 4): train.best_metric picks the
    checkpoint that is kept beside the last, tested, and the run's default for evaluate."""
    from tiny_run import tiny_config

    from seq2seq.run import prepare_run
    from seq2seq.trained import default_step
    from seq2seq.training.checkpoints import Checkpointer
    from seq2seq.training.loop import fit
    from seq2seq.training.metrics import read_metrics
    from seq2seq.workdir import checkpoint_dir

    scripted = iter([(5.0, 20.0), (4.0, 40.0), (3.0, 30.0), (2.0, 35.0)])

    def dev_scores(params, graphdef, partitioner):
        bleu, chrf = next(scripted)
        return {"bleu": bleu, "chrf": chrf, "bleu_sentences": 16}

    config = tiny_config(
        corpus,
        tmp_path / "run",
        f"tokenizer.model_file={corpus['spm']}",
        "train.steps=8",
        "train.eval_every=2",
        "train.checkpoint_every=2",
        "train.keep_checkpoints=1",
        "train.dev_bleu=true",
        f"train.best_metric={metric}",
    )
    config, data, _ = prepare_run(config)
    result = fit(config, data, dev_bleu=dev_scores)
    assert (result.best.metric, result.best.step) == (metric, best) and result.test_step == best
    dev = [r for r in read_metrics(tmp_path / "run") if r["split"] == "dev"]
    assert [r["chrf"] for r in dev] == [20.0, 40.0, 30.0, 35.0]
    assert dev[-1][f"best_{metric}"] == {"chrf": 40.0, "bleu": 5.0}[metric]
    ck = Checkpointer(checkpoint_dir(tmp_path / "run"), keep=None, async_save=False)
    assert ck.all_steps() == [best, 8] and default_step(ck, config) == best
    ck.close()
