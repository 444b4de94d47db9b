"""The recipe (seq2seq/data/recipe.py): batch size, steps, warmup and dropout from the corpus
size, by formula and through the real ``seq2seq-train`` (its log, config.yaml and a resume)."""

import json
import math

import pytest
import yaml
from tiny_run import cli_env, run, tiny_config, tiny_overrides, train_command, write_corpus

from seq2seq.config import ConfigError, replace
from seq2seq.data import recipe
from seq2seq.resolve import resolve_config
from seq2seq.training.checks import check_train_config


def reference_batch(pairs: int, max_len: int) -> int:
    """The README's rule, written out: 4096·√(pairs/100k) clipped to [1024, 2048], then the
    power-of-two row count nearest in log scale (searched over all of them)."""
    target = min(max(4096 * math.sqrt(pairs / 100_000), 1024), 2048)
    rows = min(
        (2**e for e in range(20)), key=lambda r: abs(math.log2(r) - math.log2(target / max_len))
    )
    return rows * max_len


def test_batch_tokens_follow_the_rule():
    # the proxies of docs/benchmarks.md: shipped 136,672 pairs, long 45,527, small 20,000
    assert recipe.batch_tokens(136_672, 64) == 2048
    assert recipe.batch_tokens(45_527, 64) == 2048
    assert recipe.batch_tokens(20_000, 64) == 2048
    assert recipe.batch_tokens(12_000, 64) == 1024
    assert recipe.batch_tokens(5_000, 64) == 1024
    assert recipe.batch_tokens(10**7, 64) == 2048
    previous = 0
    for pairs in [1, 500, 9_000, 12_000, 30_000, 60_000, 99_999, 250_000]:
        for max_len in (16, 32, 64, 128):
            got = recipe.batch_tokens(pairs, max_len)
            assert got == reference_batch(pairs, max_len), (pairs, max_len)
        got = recipe.batch_tokens(pairs, 64)
        assert got >= previous  # more data never gets smaller batches
        previous = got


def test_resolve_fills_only_the_keys_left_at_zero(tmp_path):
    corpus = write_corpus(tmp_path / "data", train=300)
    base = tiny_config(corpus, tmp_path / "run", "train.token_budget=20480", "train.steps=3")
    auto = replace(base, **{"data.max_tokens": 0, "train.steps": 0, "train.warmup_steps": 0})
    config, note = recipe.resolve(auto)
    assert config.data.max_tokens == 1024  # 300 pairs: clipped to 1024 (32 rows of 32)
    assert config.train.steps == 20 and config.train.warmup_steps == 4  # 20480 / 1024; a fifth
    assert note == (
        "recipe for 300 training pairs (1,824 target words): data.max_tokens=1024, "
        "train.steps=20, train.warmup_steps=4"
    )
    accum = replace(auto, **{"train.grad_accum_steps": 2})
    size = recipe.CorpusSize(pairs=300, words=1_824)
    assert recipe.resolve(accum, size)[0].train.steps == 10  # 2 micro-batches per step
    kept, _ = recipe.resolve(replace(auto, **{"train.steps": 7}))
    assert kept.train.steps == 7 and kept.train.warmup_steps == 1 and kept.data.max_tokens == 1024
    assert recipe.resolve(base) == (base, "")  # nothing left to it: the corpus is not read
    # dropout left to it (null): 20 steps of 1024 tokens over 1,824 words are 11.2 passes
    config, note = recipe.resolve(replace(auto, **{"model.dropout_rate": None}), size)
    assert config.model.dropout_rate == 0.22 and note.endswith("model.dropout_rate=0.22")
    given = replace(base, **{"model.dropout_rate": 0.0})  # 0 is a rate like any other
    assert recipe.resolve(given) == (given, "")


def test_a_time_budget_counts_the_steps_it_buys(tmp_path):
    # the steps the budget buys at the timed speed replace the token budget's provisional
    # count, and the warmup and dropout count them: 2-core CPU, 20,000 pairs, 780 s bought
    # ~510 steps of 2048 tokens, not 960 (docs/data/quality_before_timed_steps/small/)
    corpus = write_corpus(tmp_path / "data", train=300)
    base = tiny_config(corpus, tmp_path / "run", "train.token_budget=20480", "train.steps=3")
    auto = replace(
        base,
        **{
            "train.steps": 0,
            "train.warmup_steps": 0,
            "model.dropout_rate": None,
            "train.time_budget": 780.0,
        },
    )
    size = recipe.CorpusSize(pairs=20_000, words=119_474)
    provisional, _ = recipe.resolve(auto, size)
    assert provisional.train.steps == 20480 // base.data.max_tokens  # the token budget's
    config, note = recipe.resolve(auto, size, budget_steps=510)
    assert config.train.steps == 510 and config.train.warmup_steps == 102  # a fifth
    tokens = 510 * base.data.max_tokens
    assert config.model.dropout_rate == recipe.dropout_rate(tokens, 119_474)
    assert "train.steps: what train.time_budget=780 buys at the step's timed speed" in note
    small = replace(auto, **{"data.max_tokens": 2048})  # small's batch: 8.7 passes, not 16.5
    assert recipe.resolve(small, size, budget_steps=510)[0].model.dropout_rate == 0.17
    small = replace(small, **{"train.token_budget": 960 * 2048})
    assert recipe.resolve(small, size)[0].model.dropout_rate == 0.3  # the provisional 960
    no_budget = replace(auto, **{"train.time_budget": 0.0})  # only a time budget buys steps
    assert (
        recipe.resolve(no_budget, size, budget_steps=510)[0].train.steps
        == 20480 // base.data.max_tokens
    )
    # a given warmup longer than the steps bought still raises them (the budget then chooses)
    long_warmup = replace(auto, **{"train.warmup_steps": 600})
    assert recipe.resolve(long_warmup, size, budget_steps=510)[0].train.steps == 600


def test_dropout_rate_follows_the_rule():
    # the proxies of docs/benchmarks.md at the token budget (960 steps of 2048 tokens)
    budget = 960 * 2048
    assert recipe.dropout_rate(budget, 817_864) == 0.1  # shipped and long: 2.4 passes
    assert recipe.dropout_rate(budget, 119_474) == 0.3  # small: 16.5 passes
    previous = 0.0
    for passes in [0.1, 1, 5, 6, 7.5, 10, 12.5, 15, 16, 100]:
        got = recipe.dropout_rate(round(passes * 100_000), 100_000)
        assert got == round(min(max(0.02 * passes, 0.1), 0.3), 2), passes
        assert got >= previous  # more passes never get less dropout
        previous = got
    assert recipe.dropout_rate(budget, 0) == 0.3  # an empty corpus is no division by zero


def test_train_command_uses_the_recipe_and_a_resume_keeps_it(tmp_path):
    corpus = write_corpus(tmp_path / "data", train=300)
    workdir = tmp_path / "run"
    args = tiny_overrides(
        corpus,
        workdir,
        "data.max_tokens=0",
        "train.steps=0",
        "train.warmup_steps=0",
        "model.dropout_rate=null",
        "train.token_budget=10240",
    )
    proc = run(train_command(args), cli_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    log = (workdir / "train.log").read_text(encoding="utf-8")
    # 10 steps of 1024 tokens over 1,824 target words: 5.6 passes, dropout 0.02 · 5.6
    assert (
        "recipe for 300 training pairs (1,824 target words): data.max_tokens=1024, "
        "train.steps=10, train.warmup_steps=2, model.dropout_rate=0.11" in log
    )
    saved = yaml.safe_load((workdir / "config.yaml").read_text(encoding="utf-8"))
    assert saved["data"]["max_tokens"] == 1024 and saved["model"]["dropout_rate"] == 0.11
    assert (saved["train"]["steps"], saved["train"]["warmup_steps"]) == (10, 2)
    # Going on with more steps: the recipe would now pick warmup 4 and dropout 0.22, but the
    # run keeps its own (a changed warmup would be refused as a change of schedule).
    proc = run(train_command([*args, "train.steps=20"]), cli_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    saved = yaml.safe_load((workdir / "config.yaml").read_text(encoding="utf-8"))
    assert (saved["train"]["steps"], saved["train"]["warmup_steps"]) == (20, 2)
    assert saved["model"]["dropout_rate"] == 0.11
    assert "resuming step 10 with train.steps changed: 10 → 20" in (
        workdir / "train.log"
    ).read_text(encoding="utf-8")


def test_steps_for_time_budget_follow_the_measured_rate():
    # 9 steps in 9 s after the first step's 3 s: 1 step/s, so 18 s left are 18 more steps
    assert recipe.steps_for_time_budget(10, 12.0, 1, 3.0, 30.0) == 28
    assert recipe.steps_for_time_budget(10, 12.0, 1, 7.5, 30.0) == 10 + math.floor(18 * 9 / 4.5)
    # a budget already spent ends the run where it is
    assert recipe.steps_for_time_budget(10, 40.0, 1, 3.0, 30.0) == 10
    # no measured interval (the first step of this process is this one): step / seconds
    assert recipe.steps_for_time_budget(10, 5.0, 10, 5.0, 30.0) == 10 + 50


def test_time_budget_chooses_the_steps_at_the_end_of_the_warmup(tmp_path):
    corpus = write_corpus(tmp_path / "data", train=300)
    workdir = tmp_path / "run"
    args = tiny_overrides(
        corpus,
        workdir,
        "train.steps=0",  # provisional: token_budget / max_tokens = 10
        "train.token_budget=2560",
        "train.warmup_steps=8",
        "train.schedule=linear",
        "train.time_budget=4",
        "train.log_every=1",
    )
    proc = run(train_command(args), cli_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    log = (workdir / "train.log").read_text(encoding="utf-8")
    # before the config is resolved, the compiled step is timed: the steps the budget buys
    timed = [line for line in log.splitlines() if "train.time_budget=4s: the step timed" in line]
    assert len(timed) == 1, log[-3000:]
    seconds = float(timed[0].split("timed at ")[1].split(" s")[0])
    bought = int(timed[0].rsplit(": ", 1)[1].split()[0])
    assert 4 / (seconds + 5e-4) - 1 <= bought <= 4 / max(seconds - 5e-4, 1e-9)  # %.3f s
    chosen = [line for line in log.splitlines() if "train.time_budget=4s:" in line]
    chosen.remove(timed[0])
    assert len(chosen) == 1, log[-3000:]
    steps = int(chosen[0].rsplit("train.steps=", 1)[1].split()[0])
    assert steps >= 8 and f"(was {max(bought, 8)})" in chosen[0]  # never fewer than done
    # A 20k-parameter step takes milliseconds, so the budget adds steps; on a machine so busy
    # that the 8 warmup steps spent half the budget, the count may stay where it is. Up to
    # 2.5 s spent the formula adds more than 3: (4 - s) · 7 / s > 3 (rate: steps 2-8 over s).
    spent = float(chosen[0].split(" s of 4 spent")[0].rsplit(" ", 1)[1])
    if spent <= 2:
        assert steps > 10, chosen[0]
    # config.yaml is the resolved config (the steps bought, not the token budget's 10):
    # training never rewrites it
    saved = yaml.safe_load((workdir / "config.yaml").read_text(encoding="utf-8"))
    assert saved["train"]["steps"] == max(bought, 8) and saved["train"]["warmup_steps"] == 8
    summary = json.loads((workdir / "test.json").read_text(encoding="utf-8"))
    assert summary["status"] == "finished" and summary["step"] == summary["steps"] == steps
    assert f"at step {steps} of {steps}." in (workdir / "summary.md").read_text(encoding="utf-8")
    # the linear decay ends at the chosen step: peak · 1 / (T - W + 1) at the last step
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").open(encoding="utf-8")]
    train = [r for r in rows if r["split"] == "train"]
    assert train[-1]["step"] == steps
    assert math.isclose(train[-1]["learning_rate"], 2e-3 / (steps - 8 + 1), rel_tol=1e-5)
    assert math.isclose(train[7]["learning_rate"], 2e-3, rel_tol=1e-5)  # step 8: the peak
    # a rerun resumes the finished run with its chosen steps: nothing is chosen again
    proc = run(train_command(args), cli_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    log = (workdir / "train.log").read_text(encoding="utf-8")
    assert sum("train.time_budget=4s:" in line for line in log.splitlines()) == 2  # not timed
    summary = json.loads((workdir / "test.json").read_text(encoding="utf-8"))
    assert summary["step"] == summary["steps"] == steps


def test_a_given_step_count_turns_the_time_budget_off(tmp_path):
    corpus = write_corpus(tmp_path / "data", train=300)
    given = tiny_config(corpus, tmp_path / "run", "train.steps=7", "train.time_budget=840")
    run = resolve_config(given)
    assert run.config.train.steps == 7 and run.config.train.time_budget == 0
    assert run.notes == ("train.steps=7 is given: train.time_budget=840 does not apply",)
    left = tiny_config(corpus, tmp_path / "run", "train.steps=0", "train.time_budget=840")
    run = resolve_config(left)  # provisional steps from the token budget
    assert run.config.train.time_budget == 840 and run.config.train.steps > 0
    assert not any("train.time_budget" in note for note in run.notes)


def test_a_negative_time_budget_is_a_named_error(tmp_path):
    corpus = write_corpus(tmp_path / "data", train=300)
    for key in ("time_budget", "max_seconds"):
        config = tiny_config(corpus, tmp_path / "run", f"train.{key}=-5")
        rule = rf"train.{key} must be ≥ 0 \(seconds; 0 = off\), got -5.0"
        with pytest.raises(ConfigError, match=rule):
            check_train_config(config)


def test_a_time_budget_applies_when_the_warmup_is_longer_than_the_provisional_steps(
    tmp_path, caplog
):
    """train.warmup_steps (12) > the recipe's provisional steps (10): the provisional count
    is raised to the warmup, and the budget chooses the steps at its end (this budget is
    spent by then: the run ends there, at 12, not silently at 10 without the budget)."""
    from seq2seq.run import prepare_run
    from seq2seq.training.loop import fit

    corpus = write_corpus(tmp_path / "data", train=300)
    config = tiny_config(
        corpus,
        tmp_path / "run",
        "train.steps=0",
        "train.token_budget=2560",  # provisional: 2560 / 256 = 10 steps
        "train.warmup_steps=12",
        "train.time_budget=0.001",
    )
    run = resolve_config(config)
    assert run.config.train.steps == 12
    assert any("raised to train.warmup_steps" in note for note in run.notes), run.notes
    shorter = resolve_config(replace(config, **{"train.warmup_steps": 4})).config
    assert shorter.train.steps == 10  # a warmup that ends within the count: unchanged
    caplog.set_level("INFO", logger="seq2seq")
    prepared, data, _ = prepare_run(run)
    result = fit(prepared, data)
    assert int(result.state.step) == 12 and result.progress.steps(prepared) == 12
    assert "train.time_budget=0.001s:" in caplog.text and "train.steps=12 (was 12)" in caplog.text
