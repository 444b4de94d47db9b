"""Search strategies (``seq2seq.search``): one per ``decode.search``; MBR against a brute-force
reference with sacreBLEU's chrF; epsilon sampling's filter by its definition."""

import builtins
from dataclasses import replace

import jax
import numpy as np
import pytest
from sacrebleu.metrics import CHRF
from test_translation import tiny_parts, tokenizer_path  # noqa: F401 (a fixture)

from seq2seq.config import ConfigError, DecodeConfig, load_config, save_config
from seq2seq.decoding import NEG_INF, filter_logits
from seq2seq.search import MBR, Beam, Candidates, Greedy, Sampling, chrf_matrix, strategy
from seq2seq.translation import Translator

TEXTS = [
    "No puedo comer pollo.",
    "No puedo comer el pollo.",
    "Yo no puedo comer pollo.",
    "No como pollo.",
    "",
    "No puedo comer pollo.",  # a duplicate: counted twice as a reference, once as a candidate
]


def test_the_search_key_chooses_the_strategy():
    d = DecodeConfig(beam_size=5, alpha=0.8, temperature=0.7, epsilon=0.02, mbr_size=8)
    assert strategy(d) == Beam(alpha=0.8, beam_size=5)
    assert strategy(replace(d, search="greedy")) == Greedy(alpha=0.8)
    sampled = strategy(replace(d, search="sampling"))
    assert sampled == Sampling(alpha=0.8, temperature=0.7, epsilon=0.02)
    assert strategy(replace(d, search="mbr")) == MBR(sampled, 8)
    beam_mbr = strategy(replace(d, search="mbr", mbr_candidates="beam"))
    assert beam_mbr == MBR(Beam(alpha=0.8, beam_size=8), 8)
    assert [s.max_nbest() for s in (strategy(d), Greedy(), sampled, beam_mbr)] == [5, 1, None, 8]
    assert [s.samples() for s in (strategy(d), Greedy(), sampled, beam_mbr, MBR(sampled))] == [
        False,
        False,
        True,
        False,
        True,
    ]


def test_epsilon_left_to_the_search_is_002_for_mbr_samples_only(tmp_path):
    """``decode.epsilon`` null (the default, kept in a run's config.yaml) is the search's:
    0.02 for MBR's sampled candidates (Freitag et al. 2023), 0 for sampling; a value wins."""
    path = tmp_path / "config.yaml"
    save_config(load_config(None, []), path)
    d = load_config(path).decode  # a beam-search run, as translate reads it
    assert (d.search, d.epsilon) == ("beam", None)
    assert strategy(replace(d, search="mbr")) == MBR(Sampling(epsilon=0.02), 16)
    assert strategy(replace(d, search="sampling")) == Sampling(epsilon=0.0)
    assert strategy(replace(d, search="mbr", epsilon=0.0)) == MBR(Sampling(epsilon=0.0), 16)
    assert strategy(replace(d, search="sampling", epsilon=0.1)) == Sampling(epsilon=0.1)
    assert load_config(None, ["decode.search=mbr"]).decode.sampling_epsilon == 0.02


def test_former_sampling_key_reads_as_search_sampling(tmp_path):
    assert load_config(None, ["decode.sampling=true"]).decode.search == "sampling"
    assert load_config(None, ["decode.sampling=false"]).decode.search == "beam"
    old = tmp_path / "config.yaml"  # a run directory written before decode.search
    old.write_text("decode:\n  sampling: true\n  top_k: 5\n")
    assert load_config(old).decode.search == "sampling"
    both = tmp_path / "both.yaml"
    both.write_text("decode:\n  sampling: true\n  search: mbr\n")
    with pytest.raises(ConfigError, match="both.yaml: decode.sampling=true contradicts decode"):
        load_config(both)
    with pytest.raises(ConfigError, match="decode.search must be one of"):
        load_config(None, ["decode.search=viterbi"])


@pytest.mark.parametrize("fast", [True, False])
def test_chrf_matrix_is_sacrebleus_sentence_chrf(fast, monkeypatch):
    if fast:
        pytest.importorskip("fastchrf")
    else:  # the fallback without the package
        real_import = builtins.__import__

        def no_fastchrf(name, *args, **kwargs):
            if name == "fastchrf":
                raise ImportError(name)
            return real_import(name, *args, **kwargs)

        monkeypatch.setattr(builtins, "__import__", no_fastchrf)
    chrf = CHRF()
    groups = [TEXTS, TEXTS[:2]]
    for group, matrix in zip(groups, chrf_matrix(groups)):
        expected = [[chrf.sentence_score(h, [r]).score for r in group] for h in group]
        np.testing.assert_allclose(matrix, expected, atol=1e-9)


def test_mbr_chooses_by_expected_chrf_against_all_candidates():
    n, width = len(TEXTS), 3
    tokens = np.arange(n * width).reshape(1, n, width)  # the slot's tokens identify it
    lengths = np.array([[3, 3, 3, 3, 1, 3, 0]])[:, :n]
    lengths = np.concatenate([lengths, [[0]]], axis=1)  # an empty last slot
    tokens = np.concatenate([tokens, np.zeros((1, 1, width), int)], axis=1)
    logprobs = -np.arange(n + 1, dtype=np.float64)[None]
    found = Candidates(tokens, lengths, logprobs, logprobs.copy())
    chosen = MBR(Sampling(), size=n).choose([TEXTS], found)
    chrf = CHRF()
    expected = {h: np.mean([chrf.sentence_score(h, [r]).score for r in TEXTS]) for h in set(TEXTS)}
    order = sorted(expected, key=lambda h: -expected[h])
    slots = [TEXTS.index(h) for h in order]  # a duplicate keeps its first slot
    assert list(chosen.lengths[0, : len(order)]) == [lengths[0, j] for j in slots]
    np.testing.assert_array_equal(chosen.tokens[0, : len(order)], tokens[0, slots])
    np.testing.assert_allclose(chosen.scores[0, : len(order)], [expected[h] for h in order])
    np.testing.assert_array_equal(chosen.logprobs[0, : len(order)], logprobs[0, slots])
    assert (chosen.lengths[0, len(order) :] == 0).all()  # the remaining slots are empty


def test_epsilon_sampling_drops_tokens_below_epsilon_but_never_the_best():
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.04, 0.01], [0.009, 0.008, 0.3, 0.3, 0.383]]))
    kept = np.asarray(filter_logits(logits, epsilon=0.05)) > NEG_INF / 2
    np.testing.assert_array_equal(kept, [[1, 1, 1, 0, 0], [0, 0, 1, 1, 1]])
    flat = np.log(np.full((1, 4), 0.25))
    assert (np.asarray(filter_logits(flat, epsilon=0.9)) > NEG_INF / 2).sum() == 4  # all tied
    np.testing.assert_array_equal(filter_logits(logits), filter_logits(logits, epsilon=0.0))
    with pytest.raises(ValueError, match="epsilon must be in"):
        filter_logits(logits, epsilon=1.0)


@pytest.fixture(scope="module")
def tiny(tokenizer_path):  # noqa: F811 (the fixture of test_translation)
    """A random 1-layer model with an EOS bias (short outputs) and a real tokenizer."""
    return tiny_parts(tokenizer_path, eos_bias=2.0)


LINES = ["I can't eat chicken.", "Tom is here.", "", "Yes."]
DECODE = DecodeConfig(beam_size=4, alpha=0.6, max_len_a=0.5, max_len_b=4, max_tokens=4096)


def _brute_force_mbr(candidates: list[str]) -> list[str]:
    chrf = CHRF()
    utility = {
        h: np.mean([chrf.sentence_score(h, [r]).score for r in candidates]) for h in candidates
    }
    return sorted(dict.fromkeys(candidates), key=lambda h: -utility[h])


@pytest.mark.parametrize("candidates", ["beam", "sampling"])
def test_translator_mbr_is_brute_force_mbr_over_the_same_candidates(tiny, candidates):
    tokenizer, graphdef, params = tiny
    mbr = replace(DECODE, search="mbr", mbr_candidates=candidates, mbr_size=4, epsilon=0.02)
    source = (
        replace(DECODE, search="sampling", epsilon=0.02)
        if candidates == "sampling"
        else replace(DECODE, beam_size=4)
    )
    chosen = Translator(graphdef, params, tokenizer, mbr).translate(LINES, nbest=2)
    pool = Translator(graphdef, params, tokenizer, source).translate(LINES, nbest=4)
    for line, hyps, cands in zip(LINES, chosen, pool):
        if not line:
            assert [h.text for h in hyps] == [""]
            continue
        ranked = _brute_force_mbr([h.text for h in cands])
        assert [h.text for h in hyps] == ranked[:2]
        logprob = {h.text: h.logprob for h in cands}
        assert [h.logprob for h in hyps] == [logprob[t] for t in ranked[:2]]
    with pytest.raises(ValueError, match="the MBR candidates decode.mbr_size=4"):
        Translator(graphdef, params, tokenizer, mbr).translate(LINES, nbest=5)


def test_greedy_search_is_a_beam_of_one(tiny):
    tokenizer, graphdef, params = tiny
    greedy = Translator(graphdef, params, tokenizer, replace(DECODE, search="greedy"))
    beam1 = Translator(graphdef, params, tokenizer, replace(DECODE, beam_size=1))
    assert greedy.translate(LINES) == beam1.translate(LINES)
    assert jax.tree.leaves(greedy.params)  # the translators place the parameters
