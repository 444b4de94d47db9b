"""Checkpoints: save → restore equality, mismatch errors, no pickle."""

import jax
import numpy as np
import pytest

from conftest import tiny_config
from seq2seq.config import TrainConfig
from seq2seq.model import build_model
from seq2seq.training.checkpoints import CheckpointError, Checkpointer
from seq2seq.training.step import create_train_state, make_optimizer


def _state(cfg, seed=0):
    tx = make_optimizer(TrainConfig())
    return create_train_state(build_model(cfg, seed), tx, seed)[1]


def test_save_restore_gives_equal_state(tmp_path):
    state = _state(tiny_config(), seed=3)
    ck = Checkpointer(tmp_path / "ck")
    ck.save(5, state, {"step": 5, "dev": {"bleu": 1.5}})
    ck.close()
    ck = Checkpointer(tmp_path / "ck")
    assert ck.latest_step() == 5
    abstract = jax.eval_shape(lambda: _state(tiny_config(), seed=0))
    restored, meta = ck.restore(abstract)
    assert meta == {"step": 5, "dev": {"bleu": 1.5}}
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    ck.close()
    assert not list((tmp_path / "ck").rglob("*.pkl")) and not list((tmp_path / "ck").rglob("*.pickle"))


def test_mismatched_architecture_is_a_clear_error(tmp_path):
    ck = Checkpointer(tmp_path / "ck", async_save=False)
    ck.save(1, _state(tiny_config()), {})
    ck.wait()
    abstract = jax.eval_shape(lambda: _state(tiny_config(d_ff=48, num_decoder_layers=3)))
    with pytest.raises(CheckpointError) as err:
        ck.restore(abstract)
    msg = str(err.value)
    assert "wi" in msg and "(32, 64)" in msg and "(32, 48)" in msg
    assert "decoder_layers" in msg and "missing in checkpoint" in msg
    ck.close()
