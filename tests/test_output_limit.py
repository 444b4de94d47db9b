"""The output length limit, ``DecodeConfig.output_limit``: one rule, ``ceil(a·|x| + b)`` tokens
with EOS, for the JAX search (every line, also one that fills its bucket) and the export."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from test_translation import tiny_parts, tokenizer_path  # noqa: F401 (a fixture)

from seq2seq.config import DecodeConfig
from seq2seq.translation import Translator


@pytest.mark.parametrize("a", [0.0, 0.1, 0.5, 0.55, 1.0, 1.3, 1.5, 2.0])
def test_output_limit_is_the_ceiling_of_a_times_the_source_plus_b(a):
    for b in (1, 4, 10):
        decode = DecodeConfig(max_len_a=a, max_len_b=b)
        for n in range(0, 300):  # exact rational arithmetic: 0.1 · 30 is 3, not 3.0000000000000004
            assert decode.output_limit(n) == math.ceil(Fraction(str(a)) * n + b), (a, b, n)


def test_a_line_that_fills_its_bucket_gets_the_documented_limit(tokenizer_path):  # noqa: F811
    """A model that never ends (EOS logit −100) stops at the limit: limit − 1 tokens and EOS.
    With a = 0.55, b = 4: a 16-token line (its bucket's width) may have ceil(12.8) = 13 tokens
    with EOS, as a 15-token line in the same bucket has ceil(12.25) = 13 (the bucket's limit
    was int(12.8) = 12 before); prefixes are checked against the same limit."""
    tokenizer, graphdef, params = tiny_parts(tokenizer_path, eos_bias=-100.0)
    decode = DecodeConfig(beam_size=1, max_len_a=0.55, max_len_b=4, max_tokens=4096)
    words = "Tom is here and he can not eat the chicken that we made for him today".split()
    lines = {}
    for k in range(1, len(words) + 1):  # lines of 15 and 16 tokens (EOS included)
        line = " ".join(words[:k])
        lines.setdefault(len(tokenizer.encode([line])[0]), line)
    assert {15, 16} <= set(lines)
    translator = Translator(graphdef, params, tokenizer, decode, max_src_len=64)
    chosen = [lines[15], lines[16]]
    results = translator.translate(chosen)
    for n, hyps in zip((15, 16), results):
        assert len(hyps[0].tokens) + 1 == decode.output_limit(n) == 13, n
    # a prefix of 12 tokens leaves room for EOS in 13
    prefix = " ".join(["a"] * 40)
    ids = tokenizer.encode([prefix], add_eos=False)[0][:12]
    text = tokenizer.decode([ids])[0]
    assert len(tokenizer.encode([text], add_eos=False)[0]) == 12
    translator.check_prefixes([lines[16]], [text])
