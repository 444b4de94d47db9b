"""Config loading: defaults, YAML, overrides, and errors that name the key."""

import re

import pytest

from seq2seq.config import Config, ConfigError, load_config, save_config


def test_yaml_and_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  d_model: 128\ntrain:\n  steps: 10\n")
    cfg = load_config(path, ["train.steps=20", "data.packing=false"])
    assert cfg.model.d_model == 128 and cfg.train.steps == 20 and cfg.data.packing is False
    assert cfg.model.num_heads == Config().model.num_heads


@pytest.mark.parametrize(
    "text,key",
    [
        ("model:\n  d_modle: 128\n", "d_modle"),
        ("train:\n  steps: many\n", "train.steps"),
        ("data:\n  train:\n    formt: text\n", "formt"),
    ],
)
def test_bad_keys_and_types_are_named(tmp_path, text, key):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=key):
        load_config(path)


def test_bad_override_is_named():
    with pytest.raises(ConfigError, match="train.stepz"):
        load_config(None, ["train.stepz=3"])
    with pytest.raises(ConfigError, match="key=value"):
        load_config(None, ["train.steps"])


def test_missing_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="nope.yaml"):
        load_config(tmp_path / "nope.yaml")


def test_saved_config_round_trips(tmp_path):
    cfg = load_config(None, ["model.d_model=64", "tokenizer.user_defined_symbols=[<x>]"])
    save_config(cfg, tmp_path / "config.yaml")
    assert load_config(tmp_path / "config.yaml") == cfg


def test_an_override_error_names_the_override_not_the_file(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("model: {d_model: 64}\n")
    for item, message in (
        ("model.d_modle=64", "Did you mean: 'd_model'"),
        ("model.positions=absolute", "model.positions must be one of"),
        ("train.steps=abc", "could not be converted to Integer"),
    ):
        with pytest.raises(ConfigError) as e:
            load_config(path, [item])
        assert str(e.value).startswith(f"override {item!r}: ") and message in str(e.value)
    path.write_text("model: {d_modle: 64}\n")  # the file's own mistake names the file
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: Key 'd_modle'"):
        load_config(path, ["train.steps=3"])
