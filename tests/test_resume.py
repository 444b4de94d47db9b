"""Resume: bitwise-exact continuation, patience across restarts, divergence, preemption, crashes,
other device counts, a self-describing pickle-free run directory."""

import json
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from tiny_run import (
    ROOT,
    assert_trees_equal,
    cli_env,
    run,
    tiny_config,
    tiny_overrides,
    train_command,
    write_corpus,
    xla_flags,
)

from seq2seq import cli
from seq2seq.config import ConfigError, TokenizerConfig, load_config
from seq2seq.data.tokenizer import Tokenizer, TokenizerError, train_or_load
from seq2seq.run import prepare_run
from seq2seq.trained import load_trained
from seq2seq.training.checkpoints import Checkpointer
from seq2seq.training.checks import check_train_config
from seq2seq.training.loop import fit
from seq2seq.training.metrics import read_metrics
from seq2seq.training.progress import TrainingDiverged
from seq2seq.training.step import abstract_train_state
from seq2seq.workdir import checkpoint_dir, checkpoint_steps


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A 400-pair corpus and one shared SentencePiece model (so every run tokenizes alike)."""
    d = tmp_path_factory.mktemp("corpus")
    paths = write_corpus(d)
    sentences = []
    for lang in ("en", "es"):
        sentences += (d / f"train.{lang}").read_text(encoding="utf-8").splitlines()
    train_or_load(sentences, TokenizerConfig(vocab_size=200), d / "spm")
    paths["spm"] = str(d / "spm" / "spm.model")
    return paths


def _config(corpus, workdir, *extra):
    return tiny_config(corpus, workdir, f"tokenizer.model_file={corpus['spm']}", *extra)


def _fit(corpus, workdir, *extra):
    config, data, _ = prepare_run(_config(corpus, workdir, *extra))
    return fit(config, data)


@pytest.mark.slow
def test_resume_is_bitwise_exact(corpus, tmp_path):
    # dropout on, 2 micro-batches per step, an evaluation at the interruption point
    extra = ("train.grad_accum_steps=2", "train.eval_every=3")
    whole = _fit(corpus, tmp_path / "whole", "train.steps=6", *extra)
    first = _fit(corpus, tmp_path / "split", "train.steps=3", *extra)
    assert int(first.state.step) == 3 and checkpoint_steps(tmp_path / "split") == [3]
    resumed = _fit(corpus, tmp_path / "split", "train.steps=6", *extra)

    assert int(whole.state.step) == int(resumed.state.step) == 6
    assert_trees_equal(whole.state.params, resumed.state.params)
    assert_trees_equal(whole.state.opt_state, resumed.state.opt_state)
    assert_trees_equal(whole.state.rng, resumed.state.rng)
    # the data position, counters and best/patience bookkeeping continue too
    for key in ("micro_batches", "tokens_seen", "target_tokens_seen", "dev", "best"):
        assert getattr(whole.progress, key) == getattr(resumed.progress, key), key
    assert resumed.progress.micro_batches == 12 and resumed.progress.tokens_seen > 0
    # and what is on disk is what was in memory
    config = load_config(tmp_path / "split" / "config.yaml")
    ck = Checkpointer(checkpoint_dir(tmp_path / "split"))
    restored, meta = ck.restore(abstract_train_state(config)[1], 6)
    ck.close()
    assert_trees_equal(whole.state.params, restored.params)
    assert meta["step"] == 6 and meta["data_epoch"] == 0
    # the interrupted run's train records are not duplicated by the resumed one
    steps = [r["step"] for r in read_metrics(tmp_path / "split") if r["split"] == "train"]
    assert steps == [2, 3, 4, 6]


@pytest.mark.slow
def test_patience_survives_resume(corpus, tmp_path):
    # learning rate 0: the dev loss never improves after the first evaluation
    extra = ("train.learning_rate=0", "train.eval_every=1", "train.patience=3")
    first = _fit(corpus, tmp_path / "run", "train.steps=2", *extra)
    assert first.stopped == "finished"
    assert first.best.step == 1 and first.best.evals_without_improvement == 1
    resumed = _fit(corpus, tmp_path / "run", "train.steps=10", *extra)
    # evaluations at 3 and 4 bring the count to 3: stopped at 4, as an uninterrupted run would
    assert resumed.stopped == "early_stopping" and int(resumed.state.step) == 4
    assert resumed.best.step == 1 and resumed.best.evals_without_improvement == 3
    assert resumed.best_checkpoint == 1 and 1 in resumed.checkpoints and 4 in resumed.checkpoints
    whole = _fit(corpus, tmp_path / "whole", "train.steps=10", *extra)
    assert whole.stopped == "early_stopping" and int(whole.state.step) == 4


@pytest.mark.slow
def test_best_checkpoint_is_kept_and_tested(corpus, tmp_path):
    # keep only the last checkpoint; the best by dev loss must survive beside it
    extra = (
        "train.eval_every=2",
        "train.checkpoint_every=2",
        "train.keep_checkpoints=1",
        "train.learning_rate=3e-3",
    )
    result = _fit(corpus, tmp_path / "run", "train.steps=8", *extra)
    dev = {r["step"]: r["loss"] for r in read_metrics(tmp_path / "run") if r["split"] == "dev"}
    best_step = min(dev, key=dev.get)
    assert result.best.step == best_step and result.best.value == pytest.approx(dev[best_step])
    assert checkpoint_steps(tmp_path / "run") == sorted({best_step, 8})
    assert result.test_step == best_step


def test_invalid_train_settings_are_config_errors(corpus, tmp_path):
    bad = {
        "train.grad_accum_steps=0": "train.grad_accum_steps",
        "train.best_metric=accuracy": "train.best_metric",
        "train.dev_bleu=false train.best_metric=bleu": "dev_bleu",
        "train.test_checkpoint=first": "train.test_checkpoint",
        "train.schedule=cosine": "train.schedule",
        "train.schedule=linear train.init_optimizer=true train.init_from=p": "init_optimizer",
    }
    for overrides, key in bad.items():
        with pytest.raises(ConfigError, match=key):
            check_train_config(_config(corpus, tmp_path, *overrides.split()))


def test_stops_after_max_skipped_steps(corpus, tmp_path):
    # an absurd learning rate blows the parameters up; every later step is non-finite
    with pytest.raises(TrainingDiverged) as err:
        _fit(
            corpus,
            tmp_path / "run",
            "train.steps=40",
            "train.learning_rate=1e30",
            "train.max_skipped_steps=3",
            "train.clip_norm=0",
        )
    step = err.value.step
    assert step < 40
    assert f"stopped at step {step}: steps {step - 2}..{step} (3 in a row" in str(err.value)
    assert "no checkpoint was saved" in str(err.value)


def _no_pickle(directory):
    """Files that look like pickles: a pickle suffix, or protocol 2-5 header and STOP byte."""
    found = []
    for p in directory.rglob("*"):
        if not p.is_file():
            continue
        head = p.read_bytes()[:2]
        tail = p.read_bytes()[-1:] if p.stat().st_size else b""
        if p.suffix in (".pkl", ".pickle", ".pt", ".npy") or (
            len(head) == 2 and head[0] == 0x80 and 2 <= head[1] <= 5 and tail == b"."
        ):
            found.append(p)
    return found


def _wait_for(predicate, timeout, proc, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(
                f"process exited ({proc.returncode}) before {what}:\n{err[-3000:]}"
            )
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
def test_sigterm_saves_exits_and_the_same_command_resumes_exactly(corpus, tmp_path):
    workdir = tmp_path / "run"
    overrides = tiny_overrides(
        corpus,
        workdir,
        f"tokenizer.model_file={corpus['spm']}",
        "train.steps=150",
        "train.eval_every=50",
        "train.checkpoint_every=50",
        "decode.test_limit=3",
    )
    proc = subprocess.Popen(
        train_command(overrides),
        env=cli_env(),
        cwd=ROOT,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    _wait_for(
        lambda: any(r["split"] == "train" and r["step"] >= 4 for r in read_metrics(workdir)),
        240,
        proc,
        "the first training steps",
    )
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]  # 143, the shell convention
    stopped = int(
        re.search(r"interrupted at step (\d+); checkpoint saved, rerun the same command", err)[1]
    )
    assert 4 <= stopped < 150 and checkpoint_steps(workdir)[-1] == stopped
    assert "received SIGTERM" in err
    assert f"Status: interrupted at step {stopped}" in (workdir / "summary.md").read_text()

    again = run(train_command(overrides), cli_env())
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resumed from step {stopped}" in again.stderr
    assert "test BLEU" in again.stdout and "tokens seen" in again.stdout
    summary = json.loads((workdir / "test.json").read_text())
    assert summary["step"] == 150 and summary["status"] == "finished"
    steps = [r["step"] for r in read_metrics(workdir) if r["split"] == "train"]
    assert steps == sorted(set(steps)) and steps[-1] == 150

    # bitwise equal to an uninterrupted run (in this process)
    whole = _fit(
        corpus,
        tmp_path / "whole",
        "train.steps=150",
        "train.eval_every=50",
        "train.checkpoint_every=50",
    )
    config = load_config(workdir / "config.yaml")
    ck = Checkpointer(checkpoint_dir(workdir))
    final, meta = ck.restore(abstract_train_state(config)[1], 150)
    ck.close()
    assert_trees_equal(whole.state.params, final.params)
    assert_trees_equal(whole.state.opt_state, final.opt_state)
    assert meta["tokens_seen"] == whole.progress.tokens_seen

    # the run directory describes itself and holds no pickle
    text = (workdir / "summary.md").read_text()
    for needle in (
        "Status: finished at step 150",
        "best dev loss",
        "test BLEU",
        "tokens seen",
        "## Checkpoints",
        "| 150 |",
        "## Config",
        "model_file",
        "`metrics.jsonl`",
    ):
        assert needle in text, needle
    assert (workdir / "tensorboard").is_dir() and (workdir / "train.log").is_file()
    assert _no_pickle(workdir) == []

    # an average of the last two checkpoints is a run directory evaluate can use
    assert cli.average_main(["--workdir", str(workdir), "--last", "2"]) == 0
    assert (
        cli.evaluate_main(
            [
                "--workdir",
                str(workdir / "average"),
                "--src",
                corpus["test"] + ".en",
                "--ref",
                corpus["test"] + ".es",
            ]
        )
        == 0
    )
    assert _no_pickle(workdir) == []


@pytest.mark.slow
def test_kill_during_save_keeps_last_checkpoint(corpus, tmp_path):
    workdir = tmp_path / "run"
    overrides = tiny_overrides(
        corpus,
        workdir,
        f"tokenizer.model_file={corpus['spm']}",
        "train.steps=12",
        "train.checkpoint_every=4",
        "decode.test_limit=2",
    )
    # the save of step 8 hangs half-written (tests/hang_save.py), then the process is killed
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("hang_save.py")), "8", *overrides],
        env=cli_env(),
        cwd=ROOT,
        text=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    ckdir = checkpoint_dir(workdir)
    _wait_for(lambda: any(ckdir.rglob("hang_marker")), 240, proc, "the save of step 8 to start")
    # the save of step 8 is half-written in its temporary folder; 4 is the last complete one
    assert [p.name for p in ckdir.iterdir() if p.name.startswith("8.orbax-checkpoint-tmp")]
    assert checkpoint_steps(workdir) == [4]
    proc.kill()
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL

    config = load_config(workdir / "config.yaml")
    ck = Checkpointer(ckdir)
    assert ck.all_steps() == [4]
    state, meta = ck.restore(abstract_train_state(config)[1])
    ck.close()
    assert int(state.step) == 4 and meta["micro_batches"] == 4
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(state.params))

    again = run(train_command(overrides), cli_env())
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resumed from step 4" in again.stderr
    # the torn save is named in the log and in summary.md
    note = "step 8 was incomplete (interrupted save); resumed from step 4"
    assert note in again.stderr and note in (workdir / "train.log").read_text(encoding="utf-8")
    assert f"**Resume: {note}.**" in (workdir / "summary.md").read_text(encoding="utf-8")
    assert json.loads((workdir / "test.json").read_text())["discarded_checkpoints"] == [8]
    assert checkpoint_steps(workdir) == [4, 8, 12]
    assert not [p for p in ckdir.iterdir() if "tmp" in p.name]  # the torn save was cleaned up
    _, _, _, params = load_trained(workdir)
    assert jax.tree.structure(params) == jax.tree.structure(state.params)


EIGHT_DEVICES = textwrap.dedent("""
    import json, sys
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P
    from seq2seq.config import load_config
    from seq2seq.data.pipeline import prepare
    from seq2seq.training.checkpoints import Checkpointer
    from seq2seq.training.batches import train_batch
    from seq2seq.training.step import make_optimizer, make_train_step
    from seq2seq.training.step import abstract_train_state
    from seq2seq.workdir import checkpoint_dir

    assert jax.device_count() == 8
    workdir = sys.argv[1]
    config = load_config(workdir + "/config.yaml")
    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    spec = lambda x: P("data") if x.ndim and x.shape[0] % 8 == 0 else P()
    graphdef, abstract = abstract_train_state(config)
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(
        x.shape, x.dtype, sharding=NamedSharding(mesh, spec(x))), abstract)
    ck = Checkpointer(checkpoint_dir(workdir))
    state, meta = ck.restore(abstract)
    data = prepare(config, workdir, need_test=False)
    batch = train_batch(data.train, meta["micro_batches"], 1)
    batch = {k: jax.device_put(v, NamedSharding(mesh, P(None, "data"))) for k, v in batch.items()}
    train_step = make_train_step(graphdef, make_optimizer(config.train),
                                 bos_id=data.tokenizer.bos_id,
                                 label_smoothing=config.train.label_smoothing)
    state, m = jax.jit(train_step, donate_argnums=0)(state, batch)
    step = int(state.step)
    ck.save(step, state, {**meta, "step": step, "micro_batches": meta["micro_batches"] + 1})
    ck.close()
    devices = max(len(x.sharding.device_set) for x in jax.tree.leaves(state.params))
    total = sum(float(abs(x).sum()) for x in jax.tree.leaves(state.params))
    print(json.dumps({"step": step, "devices": devices, "abs_sum": total,
                      "loss": float(m["loss"])}))
""")


@pytest.mark.slow
def test_checkpoint_from_8_devices_restores_on_1_and_continues(corpus, tmp_path):
    workdir = tmp_path / "run"
    _fit(corpus, workdir, "train.steps=2")
    proc = run([sys.executable, "-c", EIGHT_DEVICES, str(workdir)], cli_env(XLA_FLAGS=xla_flags(8)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["step"] == 3 and report["devices"] == 8 and np.isfinite(report["loss"])
    assert jax.device_count() == 1

    config = load_config(workdir / "config.yaml")
    ck = Checkpointer(checkpoint_dir(workdir))
    state, _ = ck.restore(abstract_train_state(config)[1])
    ck.close()
    assert int(state.step) == 3
    leaf = jax.tree.leaves(state.params)[0]
    assert len(leaf.sharding.device_set) == 1
    total = sum(float(abs(x).sum()) for x in jax.tree.leaves(state.params))
    assert total == pytest.approx(report["abs_sum"], rel=1e-6)

    resumed = _fit(corpus, workdir, "train.steps=5")
    assert int(resumed.state.step) == 5 and resumed.progress.micro_batches == 5
    losses = [r["loss"] for r in read_metrics(workdir) if r["split"] == "train" and r["step"] == 4]
    assert losses and np.isfinite(losses[-1])


def test_an_added_action_runs_at_its_period_and_sees_the_step(corpus, tmp_path):
    """A periodic action plugs into the loop without touching the others: it runs after every
    3rd step and the last, after that step's checkpoint."""
    from seq2seq.training.actions import Action

    seen = []
    config, data, _ = prepare_run(
        _config(corpus, tmp_path / "run", "train.steps=7", "train.checkpoint_every=3")
    )
    fit(
        config,
        data,
        actions=[
            Action(
                "record",
                3,
                lambda loop: seen.append(
                    (loop.progress.step, loop.progress.last_saved, int(loop.state.step))
                ),
            )
        ],
    )
    assert seen == [(3, 3, 3), (6, 6, 6), (7, 7, 7)]


def test_the_application_passes_extra_actions_to_the_loop(corpus, tmp_path):
    """``seq2seq.run.train(config, actions=[...])``: a Python user's action runs with the
    loop at its period and after the last step, and the run still ends with its test report."""
    from seq2seq import run
    from seq2seq.training.actions import Action

    seen = []
    summary = run.train(
        _config(corpus, tmp_path / "run", "train.steps=5", "decode.test_limit=2"),
        actions=[Action("record", 2, lambda loop: seen.append(loop.progress.step))],
    )
    assert seen == [2, 4, 5]
    assert summary.step == 5 and (tmp_path / "run" / "test.json").is_file()


@pytest.mark.slow
def test_the_time_budget_compiles_the_step_once_and_a_resume_keeps_its_horizon(
    corpus, tmp_path, monkeypatch
):
    """train.time_budget sets the schedule's horizon at the end of the warmup as a value the
    compiled step reads: one trace per run, the horizon in the checkpoint, and a run resumed
    after the choice continues with it, bitwise as the uninterrupted run."""
    from seq2seq import run as run_module
    from seq2seq.training import actions as actions_module
    from seq2seq.training import step as step_module
    from seq2seq.training.actions import Action

    chosen = []  # the steps at which the budget chose; the count is fixed to compare runs

    def choose(step, *_):
        chosen.append(step)
        return 14

    traces = []
    trace = step_module.accumulate_gradients

    def counted(*args, **kwargs):  # runs when the train step is traced, not when it runs
        traces.append(1)
        return trace(*args, **kwargs)

    monkeypatch.setattr(actions_module, "steps_for_time_budget", choose)
    monkeypatch.setattr(step_module, "accumulate_gradients", counted)
    # the step timed before resolving (seq2seq.run.budget_steps): 60 s a step buys 10 of 600
    monkeypatch.setattr(run_module, "step_seconds", lambda *_: (60.0, 0.0))
    # steps bought: 10 (the token budget's would be 20); the budget makes them 14 at step 8
    extra = (
        "train.steps=0",
        "train.token_budget=5120",
        "train.warmup_steps=8",
        "train.schedule=linear",
        "train.time_budget=600",
    )
    whole = _fit(corpus, tmp_path / "whole", *extra)
    assert int(whole.state.step) == 14 and chosen == [8] and len(traces) == 1
    train = [r for r in read_metrics(tmp_path / "whole") if r["split"] == "train"]
    assert train[-1]["step"] == 14  # the linear decay ends at the chosen step
    assert np.isclose(train[-1]["learning_rate"], 2e-3 / (14 - 8 + 1), rtol=1e-5)

    split = tmp_path / "split"
    halt = Action("halt", 10, lambda loop: setattr(loop, "stopped", "max_seconds"), at_end=False)
    config, data, _ = prepare_run(_config(corpus, split, *extra))
    assert config.train.steps == 10 and config.train.time_budget == 600
    first = fit(config, data, actions=[halt])
    assert int(first.state.step) == 10 and chosen == [8, 8] and len(traces) == 2
    ck = Checkpointer(checkpoint_dir(split))
    assert ck.metadata(10)["horizon"] == 14
    ck.close()
    resumed = _fit(corpus, split, *extra)
    assert chosen == [8, 8] and len(traces) == 3  # not chosen again; one trace per run
    assert int(resumed.state.step) == 14
    assert_trees_equal(whole.state.params, resumed.state.params)
    assert_trees_equal(whole.state.opt_state, resumed.state.opt_state)
    # training never rewrites config.yaml: it keeps the count resolved before training
    assert load_config(split / "config.yaml").train.steps == 10


@pytest.mark.slow
def test_resume_refuses_settings_that_change_the_run_and_remaps_data_on_request(
    corpus, tmp_path, capsys
):
    workdir = tmp_path / "run"
    base = tiny_overrides(
        corpus,
        workdir,
        f"tokenizer.model_file={corpus['spm']}",
        "train.steps=6",
        "train.checkpoint_every=6",
        "train.eval_every=6",
        "decode.test_limit=2",
        "data.max_tokens=512",
    )
    assert cli.train_main(base) == 0
    saved = (workdir / "config.yaml").read_text()
    before = {p.name: p.stat().st_mtime_ns for p in workdir.iterdir() if p.is_file()}

    # what the run is: refused with key, saved and new value; nothing in the run directory moves
    capsys.readouterr()
    assert (
        cli.train_main(base + ["train.steps=8", "train.warmup_steps=7", "data.max_tokens=256"]) == 2
    )
    err = capsys.readouterr().err
    assert "train.warmup_steps: 4 → 7" in err and "data.max_tokens: 512 → 256" in err
    assert "train.steps" not in err.split("differs")[1]  # steps may change
    assert "train.allow_config_change=true" in err
    assert (workdir / "config.yaml").read_text() == saved
    assert {p.name: p.stat().st_mtime_ns for p in workdir.iterdir() if p.is_file()} == before

    # how it goes on: logged, and config.yaml records the new value
    assert cli.train_main(base + ["train.steps=8", "train.log_every=1"]) == 0
    assert "resuming step 6 with train.steps changed: 6 → 8" in capsys.readouterr().err
    changes = [json.loads(x) for x in (workdir / "config_changes.jsonl").read_text().splitlines()]
    assert [(c["step"], c["key"], c["saved"], c["new"]) for c in changes] == [
        (6, "train.steps", 6, 8),
        (6, "train.log_every", 2, 1),
    ]

    # allowed on request: the batching changes and the position is remapped by examples
    assert (
        cli.train_main(
            base + ["train.steps=9", "data.max_tokens=256", "train.allow_config_change=true"]
        )
        == 0
    )
    err = capsys.readouterr().err
    moved = re.search(r"data position remapped by examples from micro-batch (\d+) to (\d+)", err)
    assert moved and (int(moved[1]), int(moved[2])) == (8, 16)  # half the rows per batch
    text = (workdir / "summary.md").read_text()
    assert "## Config changes on resume" in text and "| 8 | `data.max_tokens` | 512 | 256 |" in text


def test_a_resume_never_retrains_the_tokenizer_under_its_checkpoint(tmp_path):
    """One training line changed after a checkpoint (issue 49): the resume is refused, naming
    the file, and goes on only with train.allow_data_change, which keeps the run's
    SentencePiece model and tokenizes the new text with it."""
    from seq2seq.model import build_model
    from seq2seq.resolve import resolve_config
    from seq2seq.training.step import create_train_state, make_optimizer

    paths = write_corpus(tmp_path / "data")
    workdir, spm_model = tmp_path / "run", tmp_path / "run" / "spm.model"
    config, data, _ = prepare_run(tiny_config(paths, workdir))  # the run trains its tokenizer
    _, state = create_train_state(build_model(config.model, 0), make_optimizer(config.train), 0)
    ck = Checkpointer(checkpoint_dir(workdir), keep=None, async_save=False)
    try:  # the run's checkpoint at step 2 (what fit saves, without compiling a step)
        ck.save(2, state.replace(step=jax.numpy.asarray(2, jax.numpy.int32)), {"step": 2})
    finally:
        ck.close()
    model, old = spm_model.read_bytes(), Tokenizer(spm_model)
    es = Path(paths["train"] + ".es")
    lines = es.read_text(encoding="utf-8").splitlines()
    np.testing.assert_array_equal(data.train.tgt[3], old.encode([lines[3]])[0])  # pair 3 kept

    same_size = lines[3].replace("los codos", "las manos")  # the case; then another
    assert same_size != lines[3] and len(same_size) == len(lines[3])
    for new in (same_size, "No pongas nada sobre la mesa."):
        es.write_text("\n".join([*lines[:3], new, *lines[4:]]) + "\n", encoding="utf-8")
        with pytest.raises(TokenizerError) as refused:
            prepare_run(tiny_config(paths, workdir))
        message = str(refused.value)
        assert str(es.resolve()) in message and str(spm_model) in message
        assert "train.allow_data_change=true" in message and "new run" in message
        assert str(Path(paths["train"] + ".en").resolve()) not in message  # unchanged
        assert spm_model.read_bytes() == model

    # on purpose: the resume goes on with the old model, the new text tokenized with it
    run = resolve_config(tiny_config(paths, workdir, "train.allow_data_change=true"))
    assert run.resumed_step == 2
    _, data, _ = prepare_run(run)
    assert spm_model.read_bytes() == model and data.tokenizer.source.sha256 == old.sha256
    np.testing.assert_array_equal(data.train.tgt[3], old.encode([new])[0])
    # the next resume needs no key: the kept model now serves this text
    prepare_run(tiny_config(paths, workdir))
    assert spm_model.read_bytes() == model
