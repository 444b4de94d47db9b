"""Checkpoints: save → restore equality, mismatch errors, no pickle."""

from pathlib import Path

import jax
import numpy as np
import pytest
from conftest import tiny_config

from seq2seq.config import TrainConfig
from seq2seq.model import build_model
from seq2seq.training.checkpoints import Checkpointer, CheckpointError
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
    assert not list((tmp_path / "ck").rglob("*.pkl")) and not list(
        (tmp_path / "ck").rglob("*.pickle")
    )


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


def _leaves_equal(a, b):
    return all(
        np.array_equal(np.asarray(x), np.asarray(y))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
    )


def test_keeps_last_k_and_the_best_across_reopening(tmp_path):
    state = _state(tiny_config())
    ck = Checkpointer(tmp_path / "ck", keep=2, best_mode="max", async_save=False)
    bleu = {2: 5.0, 4: 9.0, 6: 7.0}
    for step in range(1, 8):
        ck.save(step, state, {"step": step}, metric=bleu.get(step))
    assert ck.all_steps() == [4, 6, 7] and ck.best_step() == 4
    ck.close()
    ck = Checkpointer(tmp_path / "ck", keep=2, best_mode="max", async_save=False)
    assert ck.best_step() == 4  # metrics are read back from disk
    ck.save(8, state, {"step": 8}, metric=9.5)
    ck.save(9, state, {"step": 9})
    assert ck.all_steps() == [8, 9] and ck.best_step() == 8
    assert ck.metadata(8) == {"step": 8}
    ck.close()
    low = Checkpointer(tmp_path / "low", keep=1, best_mode="min", async_save=False)
    for step, loss in ((1, 3.0), (2, 2.0), (3, 2.5), (4, None)):
        low.save(step, state, {}, metric=loss)
    assert low.all_steps() == [2, 4] and low.best_step() == 2
    low.close()
    # equal metrics (a BLEU tie won on dev loss): the newer one is the best
    tie = Checkpointer(tmp_path / "tie", keep=1, best_mode="max", async_save=False)
    for step, value in ((1, 0.0), (2, 0.0), (3, None)):
        tie.save(step, state, {}, metric=value)
    assert tie.all_steps() == [2, 3] and tie.best_step() == 2
    tie.close()


def test_restore_of_a_missing_step_names_the_available_ones(tmp_path):
    ck = Checkpointer(tmp_path / "ck", async_save=False)
    with pytest.raises(CheckpointError, match="no checkpoint in"):
        ck.restore(jax.eval_shape(lambda: _state(tiny_config())))
    ck.save(3, _state(tiny_config()), {})
    with pytest.raises(CheckpointError, match=r"no checkpoint of step 5 .*available: \[3\]"):
        ck.restore(jax.eval_shape(lambda: _state(tiny_config())), 5)
    ck.close()


# Saves step 4, then starts the save of step 8 with the hanging item of tests/hang_save.py that
# holds it open; the test kills the process there, as a crash mid-save would.
_SAVE_THEN_HANG = """
import sys
import jax.numpy as jnp
from hang_save import hang_at
from seq2seq.training.checkpoints import Checkpointer
hang_at(8)
state = {"w": jnp.arange(6.0).reshape(2, 3), "step": jnp.asarray(4)}
ck = Checkpointer(sys.argv[1], async_save=False)
ck.save(4, state, {"step": 4})
ck.save(8, state, {"step": 8})
"""


def test_a_save_killed_midway_is_discarded_and_named(tmp_path):
    import subprocess
    import sys
    import time

    from hang_save import HANG_MARKER
    from tiny_run import ROOT, cli_env

    from seq2seq.training.checkpoints import incomplete_steps

    directory = tmp_path / "ck"
    proc = subprocess.Popen(
        [sys.executable, "-c", _SAVE_THEN_HANG, str(directory)],
        env=cli_env(PYTHONPATH=f"{ROOT}:{Path(__file__).parent}"),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not any(directory.rglob(HANG_MARKER)):
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert time.monotonic() < deadline, "the save of step 8 did not start"
        time.sleep(0.1)
    proc.kill()  # kill -9 in the middle of the save of step 8
    proc.wait(timeout=60)
    # what orbax leaves: step 4 complete, step 8 in its temporary folder
    names = sorted(p.name for p in directory.iterdir())
    assert names[0] == "4" and names[1].startswith("8.orbax-checkpoint-tmp"), names
    assert incomplete_steps(directory) == [8]

    reader = Checkpointer(directory)  # a reader leaves it alone and names nothing
    assert reader.discarded == [] and reader.all_steps() == [4]
    reader.close()
    assert incomplete_steps(directory) == [8]

    # the training process deletes it (orbax, in the background: done by its next save)
    writer = Checkpointer(directory, cleanup_tmp=True)
    assert writer.discarded == [8] and writer.all_steps() == [4]
    writer.close()
    deadline = time.monotonic() + 30
    while incomplete_steps(directory) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [p.name for p in directory.iterdir()] == ["4"]


def test_discarded_message_names_the_steps_and_where_the_run_resumed():
    from seq2seq.training.checkpoints import discarded_message

    assert discarded_message([], 50) == ""
    assert (
        discarded_message([100], 50) == "step 100 was incomplete (interrupted save); resumed "
        "from step 50"
    )
    assert discarded_message([100, 150], None) == (
        "steps 100, 150 were incomplete (interrupted save); no complete checkpoint was left: "
        "the run started anew"
    )


def test_summary_md_names_a_discarded_save(tmp_path):
    from seq2seq.config import load_config
    from seq2seq.summary import RunSummary, summary_markdown

    config = load_config(None, [f"workdir={tmp_path}"])
    note = "step 100 was incomplete (interrupted save); resumed from step 50"
    text = summary_markdown(tmp_path, config, RunSummary("finished", 120, resume_note=note))
    assert f"**Resume: {note}.**" in text.split("## Results")[0]  # next to the status
    plain = summary_markdown(tmp_path, config, RunSummary("finished", 120))
    assert "Resume:" not in plain and "interrupted save" not in plain
