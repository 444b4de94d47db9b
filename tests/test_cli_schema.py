"""The flags that set config keys take their ranges, choices and sampling-only rule from the
schema (``seq2seq.config.rule``): a value just outside a key's ``Range`` is refused by the flag
and by config validation with the same rule, so the two cannot drift (issue 51)."""

import argparse
import dataclasses
import math

import pytest
from tiny_run import tiny_config, write_corpus

from seq2seq import config
from seq2seq.cli import common
from seq2seq.config import ConfigError, DecodeConfig, Range, range_of, replace
from seq2seq.model.lora import TARGETS as LORA_TARGETS
from seq2seq.resolve import check_run_config
from seq2seq.translation import check_decode_config


def _parser_actions() -> dict[str, argparse.Action]:
    """The decoding commands' parser: option (``--top-p``) → its action."""
    parser = common._decode_parser("t", "")
    return {a.option_strings[0]: a for a in parser._actions if a.option_strings}


RANGED = {  # flag dest → decode key, for every decode flag whose key has a range
    opt: key for opt, key in common._DECODE_OPTIONS.items() if range_of(f"decode.{key}")
}


def _outside(bounds: Range, kind: type) -> list:
    """Values just outside ``bounds`` (one per bound): the bound itself when it is open, else
    one step past it (1 for an int key, 1e-3 for a float one)."""
    step = 1 if kind is int else 1e-3
    out = []
    if bounds.low is not None:
        out.append(kind(bounds.low) if bounds.low_open else kind(bounds.low) - step)
    if bounds.high is not None:
        out.append(kind(bounds.high) if bounds.high_open else kind(bounds.high) + step)
    return out


def test_every_ranged_decode_key_has_a_flag():
    assert set(RANGED.values()) == {
        "beam_size",
        "alpha",
        "min_length",
        "max_tokens",
        "temperature",
        "top_k",
        "top_p",
        "epsilon",
        "mbr_size",
    }


@pytest.mark.parametrize("opt", sorted(RANGED))
def test_a_flag_and_config_validation_refuse_the_same_value_with_the_same_rule(opt, capsys):
    key = f"decode.{RANGED[opt]}"
    bounds, kind = range_of(key), config.key_type(key)
    flag = "--" + opt.replace("_", "-")
    parser = common._decode_parser("t", "")
    for value in _outside(bounds, kind):
        with pytest.raises(SystemExit):
            parser.parse_args(["--workdir", "RUN", flag, str(value)])
        err = capsys.readouterr().err
        with pytest.raises(ValueError) as refused:
            check_decode_config(replace(DecodeConfig(), **{RANGED[opt]: kind(str(value))}))
        rule = f"must be {bounds.text()}, got {kind(str(value))}"
        assert f"argument {flag}: {rule}" in err, err
        assert f"{key} {rule}" in str(refused.value)
    # accepted by both: a closed bound, and a value between the bounds (or past the low one)
    closed = [(bounds.low, bounds.low_open), (bounds.high, bounds.high_open)]
    inside = [kind(b) for b, is_open in closed if b is not None and not is_open]
    low = bounds.low if bounds.low is not None else bounds.high - 2
    inside.append(kind((low + bounds.high) / 2) if bounds.high is not None else kind(low) + 1)
    for value in inside:
        assert getattr(parser.parse_args(["--workdir", "RUN", flag, str(value)]), opt) == value
        check_decode_config(replace(DecodeConfig(), **{RANGED[opt]: value}))


def test_the_defaults_are_in_range():
    defaults = config.Config()
    for f in dataclasses.fields(defaults):
        section = getattr(defaults, f.name)
        if dataclasses.is_dataclass(section):
            assert config.range_problems(section, f"{f.name}.") == [], f.name


# every key of the schema with a Range, and the values just outside each of its bounds
OUTSIDE = [
    (key, value)
    for key, r in config.rules().items()
    if r.range is not None
    for value in _outside(r.range, config.key_type(key))
]


def test_the_ranged_keys_cover_every_section():
    sections = {key.split(".")[0] for key, _ in OUTSIDE}
    assert sections == {"data", "tokenizer", "model", "train", "decode", "distributed"}
    assert {"data.max_len", "train.ema_decay", "model.attention_q_block"} <= {k for k, _ in OUTSIDE}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("ranges")
    return tiny_config(write_corpus(root / "data", train=40), root / "run")


@pytest.mark.parametrize("key, value", OUTSIDE, ids=[f"{k}={v}" for k, v in OUTSIDE])
def test_config_validation_refuses_a_value_just_outside_each_bound(tiny, key, value):
    """Through the run's validation (``check_run_config``), whichever module checks the
    section: the error names the key, its rule and the value."""
    with pytest.raises(ConfigError) as refused:
        check_run_config(replace(tiny, **{key: value}), mesh=False)
    assert f"{key} must be {range_of(key).text()}, got {value}" in str(refused.value)


def test_choices_and_sampling_only_options_come_from_the_schema():
    actions = _parser_actions()
    for opt, key in common._DECODE_OPTIONS.items():
        found = config.choices(f"decode.{key}")
        if found:
            assert tuple(actions["--" + opt.replace("_", "-")].choices) == found, opt
    sampling = {f"decode.{common._DECODE_OPTIONS[o]}" for o in common._SAMPLING_ONLY}
    assert (
        sampling
        == set(config.SAMPLING_ONLY)
        == {
            "decode.temperature",
            "decode.top_k",
            "decode.top_p",
            "decode.epsilon",
            "decode.seed",
        }
    )


def test_the_choice_lists_the_modules_keep_are_the_schemas():
    from seq2seq.training.early_stopping import MODES

    assert LORA_TARGETS == config.choices("train.lora_targets")
    assert tuple(MODES) == config.choices("train.best_metric")


def test_the_matmul_option_has_the_schemas_choices():
    parser = argparse.ArgumentParser()
    common._add_matmul_option(parser)
    action = next(a for a in parser._actions if a.dest == "matmul_dtype")
    assert tuple(action.choices) == config.choices("model.matmul_dtype")


@pytest.mark.parametrize(
    "flag, value, rule",
    [
        ("--num-processes", "0", "must be ≥ 1, got 0"),
        ("--process-id", "-1", "must be ≥ 0, got -1"),
    ],
)
def test_the_bulk_job_flags_take_the_distributed_keys_ranges(flag, value, rule, capsys):
    from seq2seq.cli import translate_main

    with pytest.raises(SystemExit):
        translate_main(["--workdir", "RUN", "--output-dir", "OUT", flag, value])
    assert f"argument {flag}: {rule}" in capsys.readouterr().err
    key = "distributed." + flag[2:].replace("-", "_")
    assert range_of(key).problem(int(value)) == rule


@pytest.mark.parametrize(
    "bounds, text, inside, outside",
    [
        (Range(1), "≥ 1", [1, 7], [0, -1]),
        (Range(0, low_open=True), "> 0", [1e-9, 5.0], [0.0, -1.0, math.nan]),
        (Range(0, 1, low_open=True, note="1 = off"), "in (0, 1] (1 = off)", [1.0, 0.5], [0.0]),
        (Range(0, 1, high_open=True), "in [0, 1)", [0.0, 0.99], [1.0, -0.01]),
        (Range(high=3, high_open=True), "< 3", [2, -5], [3, 4]),
    ],
)
def test_range_rule_text_and_membership(bounds, text, inside, outside):
    assert bounds.text() == text
    assert all(bounds.contains(v) and bounds.problem(v) is None for v in inside)
    assert all(bounds.problem(v) == f"must be {text}, got {v}" for v in outside)
    assert bounds.problem(None) is None  # an optional key left unset


def test_a_flag_of_the_wrong_type_names_the_keys_type(capsys):
    with pytest.raises(SystemExit):
        common._decode_parser("t", "").parse_args(["--workdir", "RUN", "--beam", "four"])
    assert "argument --beam: invalid int value: 'four'" in capsys.readouterr().err
