"""The end-to-end matrix (tests/test_matrix.py) covers every choice in the code, and the
README lists exactly those choices: a value that is not run is not documented."""

import re

from test_matrix import CHAINS
from tiny_run import ROOT

from seq2seq import config
from seq2seq.config import GPU_ONLY_CHOICES, MODEL_CHOICES
from seq2seq.data.sources import FORMATS
from seq2seq.data.tokenizer import MODEL_TYPES, NORMALIZATIONS
from seq2seq.training.step import SCHEDULES
from seq2seq.translation import LENGTH_PENALTIES

CHOICES = {
    **{f"model.{k}": v for k, v in MODEL_CHOICES.items()},
    "tokenizer.model_type": MODEL_TYPES,
    "tokenizer.normalization": NORMALIZATIONS,
    "decode.length_penalty": LENGTH_PENALTIES,
    "decode.search": config.choices("decode.search"),
    "train.schedule": SCHEDULES,
}


def _values(key):
    return {
        str(c[key]).lower() if isinstance(c[key], bool) else c[key]
        for c in CHAINS.values()
        if key in c
    }


GPU_ONLY = {f"model.{k}": v for k, v in GPU_ONLY_CHOICES.items()}


def test_matrix_covers_every_choice():
    for key, choices in CHOICES.items():
        # a GPU-only choice cannot run on the CPU matrix: its refusal there is tested instead
        # (tests/test_attention.py), and the README must call it GPU-only
        assert set(choices) - set(GPU_ONLY.get(key, ())) <= _values(key), key
    assert set(FORMATS) <= _values("format")
    assert {"true", "false"} <= _values("tokenizer.joint")
    assert "true" in _values("tokenizer.byte_fallback") and "true" in _values("decode.allow_unk")
    assert "false" in _values("tokenizer.remove_extra_whitespaces")
    # each position scheme in both dtypes, the separate vocabularies with both untied modes
    pairs = {(c["model.positions"], c["model.dtype"]) for c in CHAINS.values()}
    assert pairs == {(p, d) for p in MODEL_CHOICES["positions"] for d in MODEL_CHOICES["dtype"]}
    assert {
        c.get("model.share_embeddings")
        for c in CHAINS.values()
        if c.get("tokenizer.joint") is False
    } >= {"target", "none"}
    full = [c for c in CHAINS.values() if not c.get("light")]
    assert {c["model.positions"] for c in full} == set(MODEL_CHOICES["positions"])


def test_readme_lists_the_choices_the_code_has():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for key, choices in CHOICES.items():
        name = key.split(".")[1]
        assert f"`{name}` ({'/'.join(choices)})" in readme, key
    for key, choices in GPU_ONLY.items():
        for choice in choices:
            assert f"`{choice}` is GPU-only" in readme, key
    formats = re.search(r"per-split sources \(([^)]*)\)", readme).group(1)
    assert re.findall(r"`(\w+)`", formats) == list(FORMATS)
