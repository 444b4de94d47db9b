"""seq2seq-average (elementwise mean into a new run directory) and seq2seq-plot (a PNG)."""

import json
import struct

import jax
import jax.numpy as jnp
import numpy as np
from conftest import tiny_config

from seq2seq import cli
from seq2seq.config import Config, load_config, save_config
from seq2seq.model import build_model
from seq2seq.training.checkpoints import Checkpointer
from seq2seq.training.step import abstract_train_state, create_train_state, make_optimizer
from seq2seq.workdir import checkpoint_dir, config_path


def _run_dir(tmp_path, seeds):
    """A run directory with one checkpoint per (step, seed) of the conftest tiny model."""
    workdir = tmp_path / "run"
    workdir.mkdir()
    config = Config(workdir=str(workdir), model=tiny_config())
    save_config(config, config_path(workdir))
    tx = make_optimizer(config.train)
    states = {}
    ck = Checkpointer(checkpoint_dir(workdir), keep=None, async_save=False)
    for step, seed in seeds.items():
        fresh = create_train_state(build_model(config.model, seed), tx, seed)[1]
        states[step] = fresh.replace(step=jnp.asarray(step, jnp.int32))
        ck.save(step, states[step], {"step": step})
    ck.close()
    return workdir, config, states


def _restore(workdir, config, step=None):
    ck = Checkpointer(checkpoint_dir(workdir), async_save=False)
    try:
        return ck.restore(abstract_train_state(config)[1], step)
    finally:
        ck.close()


def test_average_of_two_checkpoints_is_the_elementwise_mean(tmp_path, capsys):
    workdir, config, states = _run_dir(tmp_path, {10: 1, 20: 2, 30: 3})
    out = tmp_path / "avg"
    assert (
        cli.average_main(["--workdir", str(workdir), "--steps", "10,30", "--output", str(out)]) == 0
    )
    assert "averaged checkpoints [10, 30]" in capsys.readouterr().out
    avg_config = load_config(config_path(out))
    assert avg_config.workdir == str(out) and avg_config.model == config.model
    state, meta = _restore(out, avg_config)
    assert int(state.step) == 30 and meta["averaged_from"] == [10, 30]
    a, b = jax.tree.leaves(states[10].params), jax.tree.leaves(states[30].params)
    got = jax.tree.leaves(state.params)
    assert len(got) == len(a) > 0
    for x, y, m in zip(a, b, got):
        x, y, m = np.asarray(x, np.float64), np.asarray(y, np.float64), np.asarray(m)
        assert m.dtype == np.float32
        np.testing.assert_allclose(m, (x + y) / 2, rtol=1e-6, atol=1e-7)
    assert sum(not np.allclose(x, y) for x, y in zip(a, b)) >= 20  # the weight matrices differ
    # optimizer state comes from the newest checkpoint
    for x, y in zip(jax.tree.leaves(state.opt_state), jax.tree.leaves(states[30].opt_state)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))

    # --last 2 picks 20 and 30; an existing output is refused; bad steps are named
    assert cli.average_main(["--workdir", str(workdir), "--last", "2"]) == 0
    state, meta = _restore(workdir / "average", avg_config)
    assert meta["averaged_from"] == [20, 30]
    assert cli.average_main(["--workdir", str(workdir), "--last", "2"]) == 2
    assert "already holds checkpoints" in capsys.readouterr().err
    assert (
        cli.average_main(
            ["--workdir", str(workdir), "--steps", "10,15", "--output", str(tmp_path / "x")]
        )
        == 2
    )
    assert "no checkpoint of step(s) [15]" in capsys.readouterr().err
    # the source run is untouched
    assert Checkpointer(checkpoint_dir(workdir)).all_steps() == [10, 20, 30]


def test_plot_writes_a_png_with_all_curves(tmp_path, capsys):
    records = []
    for step in range(10, 110, 10):
        records.append(
            {
                "step": step,
                "split": "train",
                "time": 0.0,
                "loss": 5.0 - step / 50,
                "learning_rate": 1e-3 * min(step / 40, (40 / step) ** 0.5),
                "grad_norm": 1.0,
            }
        )
        if step % 50 == 0:
            records.append(
                {
                    "step": step,
                    "split": "dev",
                    "time": 0.0,
                    "loss": 4.0 - step / 100,
                    "nll": 3.5,
                    "bleu": step / 10,
                }
            )
    records.append({"step": 100, "split": "test", "time": 0.0, "bleu": 9.5})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert cli.plot_main(["--workdir", str(tmp_path)]) == 0
    png = (tmp_path / "curves.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    width, height = struct.unpack(">II", png[16:24])
    assert (width, height) == (1100, 700)
    assert "curves.png" in capsys.readouterr().out
    assert cli.plot_main(["--workdir", str(tmp_path / "missing")]) == 2


def test_average_copies_each_sides_tokenizer_with_separate_vocabularies(tmp_path):
    """With tokenizer.joint=false the run reads spm.<lang>.model; before, only spm.model was
    copied and the averaged directory could not translate."""
    workdir, config, _ = _run_dir(tmp_path, {10: 1, 20: 2})
    from seq2seq.config import replace

    config = replace(config, **{"tokenizer.joint": False})  # only the file names matter here
    save_config(config, config_path(workdir))
    for name in ("spm.en.model", "spm.en.json", "spm.es.model", "spm.es.json"):
        (workdir / name).write_text(name)
    out = tmp_path / "avg"
    from seq2seq.trained import average_checkpoints

    average_checkpoints(workdir, out, last=2)
    for name in ("spm.en.model", "spm.en.json", "spm.es.model", "spm.es.json"):
        assert (out / name).read_text() == name
    assert not (out / "spm.model").exists()
