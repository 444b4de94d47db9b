"""Resolving a config once (seq2seq/resolve.py) and the keys' rules in the schema
(seq2seq/config.py): every shipped config resolves to concrete values, fresh and resumed, and
every key states how it behaves on resume and on fine-tuning."""

from __future__ import annotations

import dataclasses

import pytest
from tiny_run import ROOT

from seq2seq.config import (
    BATCHING,
    FINETUNE_RULES,
    FIXED,
    FREE,
    MODEL_CHOICES,
    RESUMABLE,
    RESUME_RULES,
    Config,
    ConfigError,
    ModelConfig,
    choices,
    flatten,
    load_config,
    replace,
    rule,
    rule_of,
    rules,
    save_config,
)
from seq2seq.data.tokenizer import MODEL_TYPES, NORMALIZATIONS
from seq2seq.decoding import LENGTH_PENALTIES
from seq2seq.resolve import resolve
from seq2seq.training.early_stopping import MODES
from seq2seq.training.init_from import FREE_MODEL_KEYS
from seq2seq.training.step import SCHEDULES
from seq2seq.workdir import checkpoint_dir, config_path

CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
# The keys a config file may leave to resolution (0 or null) and that must be concrete after it.
FILLED = ("data.max_tokens", "train.steps", "train.warmup_steps", "model.dropout_rate")


def _assert_concrete(config: Config) -> None:
    flat = flatten(config)
    for key in FILLED:
        assert flat[key] is not None and flat[key] > 0, key
    assert config.model.vocab_size > 0
    if not config.tokenizer.joint:
        assert config.model.src_vocab_size > 0
    assert 0 < config.train.warmup_steps <= config.train.steps


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_every_shipped_config_resolves_to_concrete_values_fresh_and_resumed(path, tmp_path):
    given = load_config(path, [f"workdir={tmp_path}"])
    fresh = resolve(path, [f"workdir={tmp_path}"])
    _assert_concrete(fresh.config)
    assert fresh.saved is None and fresh.changes == () and fresh.resumed_step == 0
    assert fresh.config.model.vocab_size == (given.model.vocab_size or given.tokenizer.vocab_size)
    for key in FILLED:  # what the file gives is kept
        if flatten(given)[key]:
            assert flatten(fresh.config)[key] == flatten(given)[key], key

    # A run of it at step 100 whose saved values differ from the recipe's: a resume with the
    # same command takes the run's own values for what the file leaves open (no corpus read).
    own = {"data.max_tokens": 2 * fresh.config.data.max_len, "train.steps": 50}
    own |= {"train.warmup_steps": 7, "model.dropout_rate": 0.25, "model.vocab_size": 123}
    left = [k for k, v in flatten(given).items() if k in own and v in (0, None)]
    saved = replace(fresh.config, **{k: own[k] for k in left})
    save_config(saved, config_path(tmp_path))
    (checkpoint_dir(tmp_path) / "100").mkdir(parents=True)
    resumed = resolve(path, [f"workdir={tmp_path}"])
    _assert_concrete(resumed.config)
    assert resumed.config == saved and resumed.changes == () and resumed.resumed_step == 100
    # a given step count is a free change; a wider model is refused, naming the key
    longer = resolve(path, [f"workdir={tmp_path}", "train.steps=500"])
    changes = {c.key: (c.new, c.free) for c in longer.changes}
    assert changes["train.steps"] == (500, True) and all(free for _, free in changes.values())
    with pytest.raises(ConfigError, match=r"model.d_ff: \d+ → 8"):
        resolve(path, [f"workdir={tmp_path}", "model.d_ff=8"])


def test_every_key_has_a_rule_and_a_field_without_one_fails():
    table = rules()
    for key in flatten(Config()):
        assert rule_of(key) in table.values(), key
    assert {r.resume for r in table.values()} <= set(RESUME_RULES)
    assert {r.finetune for r in table.values()} <= set(FINETUNE_RULES)
    # every field of every section states a rule
    sections = [f.default_factory for f in dataclasses.fields(Config) if f.name != "workdir"]
    for section in sections:
        for f in dataclasses.fields(section):
            assert "rule" in f.metadata, f"{section.__name__}.{f.name}"

    @dataclasses.dataclass(frozen=True)
    class Section:
        ruled: int = rule(1, resume=FREE)
        unruled: int = 2

    with pytest.raises(ConfigError, match="x.unruled has no rule"):
        rules(Section, "x.")
    with pytest.raises(KeyError):
        rule_of("model.d_modle")


def test_the_tables_derive_from_the_rules():
    assert "train.steps" in RESUMABLE and "decode.beam_size" in RESUMABLE
    assert "train.learning_rate" not in RESUMABLE and "data.train" not in RESUMABLE
    assert set(BATCHING) == {"data.max_tokens", "data.max_len", "data.packing"}
    assert rule_of("data.dev.path").resume == FREE and rule_of("data.train.0.path").resume == FIXED
    assert rule_of("tokenizer.vocab_size").finetune == "parent"
    # the choice lists of the modules that check them are the schema's
    assert MODEL_CHOICES == {
        f.name: choices(f"model.{f.name}")
        for f in dataclasses.fields(ModelConfig)
        if choices(f"model.{f.name}")
    }
    assert len(MODEL_CHOICES) == 8 and MODEL_CHOICES["attention"] == ("dense", "chunked", "cudnn")
    assert SCHEDULES == choices("train.schedule") == ("rsqrt", "linear")
    assert tuple(MODES) == choices("train.best_metric")
    assert LENGTH_PENALTIES == choices("decode.length_penalty")
    assert MODEL_TYPES == choices("tokenizer.model_type")
    assert NORMALIZATIONS == choices("tokenizer.normalization")
    with pytest.raises(ConfigError, match="model.attention must be one of dense, chunked, cudnn"):
        load_config(None, ["model.attention=flash"])


def test_resume_and_fine_tuning_agree_on_the_model_keys():
    """A model key that changes no parameter (dropout, dtypes, the attention kernel and its
    blocks) may change on resume and on fine-tuning alike; every other one on neither."""
    for f in dataclasses.fields(ModelConfig):
        r = rule_of(f"model.{f.name}")
        assert (r.resume == FREE) == (r.finetune == FREE), f.name
        assert (f.name in FREE_MODEL_KEYS) == (f"model.{f.name}" in RESUMABLE), f.name
    for key in ("dropout_rate", "attention", "dtype", "matmul_dtype"):
        assert key in FREE_MODEL_KEYS and f"model.{key}" in RESUMABLE
    for key in ("d_model", "vocab_size", "positions", "max_len"):
        assert key not in FREE_MODEL_KEYS


def test_scripts_resolve_and_never_call_the_recipe():
    scripts = sorted([*(ROOT / "benchmarks").glob("*.py"), *(ROOT / "tools").glob("*.py")])
    assert scripts
    for script in scripts:
        text = script.read_text(encoding="utf-8")
        assert "recipe.resolve" not in text and "from seq2seq.data import recipe" not in text, (
            script.name
        )
