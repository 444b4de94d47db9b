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
