"""SentencePiece options, reuse, separate vocabularies, user models and vocabulary-size errors."""

from __future__ import annotations

import dataclasses
import io
import json
import re

import numpy as np
import pytest
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2

from seq2seq.config import TokenizerConfig
from seq2seq.data import tokenizer as tokenizer_module
from seq2seq.data.tokenizer import (
    Tokenizer,
    TokenizerError,
    TokenizerPair,
    check_options,
    load_pair,
    train_or_load,
    train_or_load_pair,
)

_EN_SUBJ = ["I", "You", "We", "They", "Tom", "Mary", "The boy", "My friend"]
_EN_VERB = ["see", "want", "like", "have", "need", "found", "bought", "lost"]
_EN_OBJ = [
    "the cat",
    "a dog",
    "the book",
    "some water",
    "the house",
    "a window",
    "two keys",
    "my bike",
]
_ES_SUBJ = ["Yo", "Tú", "Nosotros", "Ellos", "Tom", "María", "El niño", "Mi amigo"]
_ES_VERB = ["veo", "quiero", "tengo", "necesito", "encontré", "compré", "perdí", "busco"]
_ES_OBJ = [
    "el gato",
    "un perro",
    "el libro",
    "agua",
    "la casa",
    "una ventana",
    "dos llaves",
    "mi bici",
]


def corpus(n: int = 200, seed: int = 0) -> tuple[list[str], list[str]]:
    """n aligned toy sentence pairs; Spanish adds ¿, ñ and accents English never has."""
    rng = np.random.default_rng(seed)
    en, es = [], []
    for _ in range(n):
        s, v, o = rng.integers(0, 8, 3)
        en.append(f"{_EN_SUBJ[s]} {_EN_VERB[v]} {_EN_OBJ[o]}.")
        es.append(f"¿{_ES_SUBJ[s]} {_ES_VERB[v]} {_ES_OBJ[o]} mañana?")
    return en, es


def cfg(**changes) -> TokenizerConfig:
    return dataclasses.replace(TokenizerConfig(vocab_size=48), **changes)


def trainer_spec(tok: Tokenizer):
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(tok.path.read_bytes())
    return proto.trainer_spec


def pieces(tok: Tokenizer) -> list[str]:
    return [tok.sp.id_to_piece(i) for i in range(tok.vocab_size)]


def test_special_ids_encode_and_decode(tmp_path):
    en, es = corpus()
    tok = train_or_load(en + es, cfg(), tmp_path)
    assert (tok.pad_id, tok.unk_id, tok.bos_id, tok.eos_id) == (0, 1, 2, 3)
    assert tok.vocab_size == 48
    ids = tok.encode(["Tom sees the cat.", "¿Tom veo agua?"])
    assert all(x.dtype == np.int32 and x[-1] == 3 and 3 not in x[:-1] for x in ids)
    assert tok.encode(["Tom"], add_eos=False)[0][-1] != 3
    # decode stops at the first EOS and ignores padding and BOS
    padded = [[2, *ids[0].tolist(), 0, 0], [*ids[1].tolist(), *ids[0].tolist()]]
    assert tok.decode(padded) == ["Tom sees the cat.", "¿Tom veo agua?"]


def test_trained_once_then_reused(tmp_path, monkeypatch):
    en, es = corpus()
    first = train_or_load(en + es, cfg(), tmp_path)
    assert (tmp_path / "spm.model").is_file() and (tmp_path / "spm.json").is_file()

    def no_training(**kwargs):
        raise AssertionError("retrained although nothing changed")

    monkeypatch.setattr(spm.SentencePieceTrainer, "train", no_training)
    again = train_or_load(en + es, cfg(), tmp_path)
    assert again.sha256 == first.sha256


@pytest.mark.parametrize(
    "change",
    [
        {"texts": "one line more"},
        {"vocab_size": 70},
        {"model_type": "bpe"},
        {"user_defined_symbols": ["<2es>"]},
        {"normalization": "identity"},
        {"byte_fallback": True, "vocab_size": 300},
    ],
)
def test_changed_text_or_training_option_retrains(tmp_path, change):
    en, es = corpus()
    first = train_or_load(en + es, cfg(), tmp_path)
    texts = en + es + [change.pop("texts")] if "texts" in change else en + es
    second = train_or_load(texts, cfg(**change), tmp_path)
    assert second.sha256 != first.sha256
    assert Tokenizer(tmp_path / "spm.model").sha256 == second.sha256


@pytest.mark.parametrize("model_type, proto_type", [("unigram", 1), ("bpe", 2)])
def test_model_type_and_sampling_options_reach_the_trainer(tmp_path, model_type, proto_type):
    en, es = corpus(400)
    tok = train_or_load(
        en + es,
        cfg(model_type=model_type, input_sentence_size=300, character_coverage=0.999),
        tmp_path,
    )
    spec = trainer_spec(tok)
    assert spec.model_type == proto_type
    assert spec.vocab_size == 48 and tok.vocab_size == 48
    assert spec.input_sentence_size == 300
    assert spec.character_coverage == pytest.approx(0.999)


def test_the_sample_is_capped_in_characters(tmp_path):
    """``input_character_size`` lowers SentencePiece's sentence count to the cap over the
    mean length (a count that already fits, or no cap, is passed as it is)."""
    from seq2seq.data.tokenizer import sample_size

    texts = ["abcd" * (1 + i % 3) for i in range(3000)]  # 4, 8, 12 characters: mean 8
    assert sample_size(texts, cfg(input_sentence_size=0, input_character_size=8000)) == 1000
    assert sample_size(texts, cfg(input_sentence_size=500, input_character_size=8000)) == 500
    assert sample_size(texts, cfg(input_sentence_size=0, input_character_size=0)) == 0
    assert sample_size(texts, cfg(input_sentence_size=2000, input_character_size=10**6)) == 2000
    assert sample_size(texts, cfg(input_sentence_size=0, input_character_size=80)) == 101
    en, es = corpus(400)
    mean = sum(map(len, en + es)) / 800
    tok = train_or_load(
        en + es, cfg(input_sentence_size=0, input_character_size=400 * mean), tmp_path
    )
    assert trainer_spec(tok).input_sentence_size == pytest.approx(400, abs=40)


def test_user_defined_symbols_are_never_split(tmp_path):
    en, es = corpus()
    tok = train_or_load(en + es, cfg(user_defined_symbols=["<2es>", "<2en>"]), tmp_path)
    assert tok.sp.piece_to_id("<2es>") == 4 and tok.sp.piece_to_id("<2en>") == 5
    text = "<2es> Tom sees the cat."
    assert "<2es>" in tok.sp.encode(text, out_type=str)
    ids = tok.encode([text], add_eos=False)[0]
    assert 4 in ids.tolist() and tok.decode([ids]) == [text]
    plain = train_or_load(en + es, cfg(), tmp_path / "plain")
    assert "<2es>" not in plain.sp.encode(text, out_type=str)  # split into several pieces


def test_character_coverage_maps_rare_characters_to_unk(tmp_path):
    en, es = corpus(300)
    texts = en + es + ["Tom has a żubr."]  # ż: one character in ~15,000
    full = train_or_load(texts, cfg(character_coverage=1.0), tmp_path / "full")
    partial = train_or_load(texts, cfg(character_coverage=0.98), tmp_path / "partial")
    assert full.unk_id not in full.encode(["ż"])[0].tolist()
    assert partial.unk_id in partial.encode(["ż"])[0].tolist()
    assert "ż" in pieces(full) and "ż" not in pieces(partial)


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_vocabulary_too_large_for_the_corpus_suggests_a_size_that_works(tmp_path, model_type):
    en, es = corpus(30)
    with pytest.raises(TokenizerError) as e:
        train_or_load(en + es, cfg(vocab_size=5000, model_type=model_type), tmp_path)
    message = str(e.value)
    assert "tokenizer.vocab_size=5000 is more than the training text supports" in message
    suggested = int(re.search(r"set tokenizer.vocab_size=(\d+) or less", message).group(1))
    assert 10 < suggested < 5000
    tok = train_or_load(en + es, cfg(vocab_size=suggested, model_type=model_type), tmp_path)
    assert tok.vocab_size == suggested


def test_vocabulary_too_small_for_the_alphabet_suggests_a_size_that_works(tmp_path):
    en, es = corpus(30)
    with pytest.raises(TokenizerError) as e:
        train_or_load(en + es, cfg(vocab_size=12), tmp_path)
    message = str(e.value)
    assert "tokenizer.vocab_size=12 is too small" in message
    assert "tokenizer.character_coverage" in message
    needed = int(re.search(r"set tokenizer.vocab_size=(\d+) or more", message).group(1))
    assert needed > 12
    assert train_or_load(en + es, cfg(vocab_size=needed), tmp_path).vocab_size == needed


@pytest.mark.parametrize(
    "change, key",
    [
        ({"model_type": "word"}, "tokenizer.model_type='word'"),
        (
            {"character_coverage": 0.9},
            "tokenizer.character_coverage must be in [0.98, 1] (SentencePiece's; 1 for small "
            "alphabets, 0.9995 for large ones), got 0.9",
        ),
        ({"input_sentence_size": 50}, "tokenizer.input_sentence_size=50"),
        ({"input_sentence_size": -1}, "tokenizer.input_sentence_size must be ≥ 0"),
        ({"input_character_size": -1}, "tokenizer.input_character_size must be ≥ 0"),
        ({"vocab_size": 5, "user_defined_symbols": ["<a>"]}, "tokenizer.vocab_size=5"),
        ({"user_defined_symbols": ["<a>", "<a>"]}, "tokenizer.user_defined_symbols"),
        ({"src_model_file": "x.model"}, "tokenizer.src_model_file"),
        ({"joint": False, "model_file": "x.model"}, "tokenizer.model_file"),
        (
            {"normalization": "nfc"},
            "tokenizer.normalization='nfc': expected one of nmt_nfkc, nfkc, "
            "nmt_nfkc_cf, nfkc_cf, identity",
        ),
        (
            {"byte_fallback": True},
            "tokenizer.vocab_size=48: with tokenizer.byte_fallback=true it "
            "must exceed the 4 special ids, 0 user-defined symbols and the "
            "256 byte pieces",
        ),
        (
            {"model_file": "x.model", "normalization": "identity"},
            "tokenizer.normalization='identity' applies to models trained by the run",
        ),
    ],
)
def test_invalid_options_are_named_before_training(tmp_path, change, key):
    with pytest.raises(TokenizerError, match=re.escape(key)):
        check_options(cfg(**change))
    with pytest.raises(TokenizerError, match=re.escape(key)):
        train_or_load(["a b"] * 200, cfg(**change), tmp_path)
    assert not list(tmp_path.iterdir())


def test_default_options_hash_as_before_the_newer_options(tmp_path):
    """Runs trained before tokenizer.normalization/byte_fallback existed keep their models."""
    en, es = corpus()
    train_or_load(en + es, cfg(), tmp_path)
    options = json.loads((tmp_path / "spm.json").read_text())["options"]
    assert set(options) == {
        "vocab_size",
        "model_type",
        "character_coverage",
        "input_sentence_size",
        "user_defined_symbols",
    }


ZWNJ = "\u200c"  # Persian zero-width non-joiner: part of the spelling of a word


@pytest.mark.parametrize(
    "rule, name", [("nmt_nfkc", "nmt_nfkc"), ("identity", "identity"), ("nfkc_cf", "nfkc_cf")]
)
def test_normalization_rule_reaches_the_model(tmp_path, rule, name):
    en, es = corpus()
    persian = [f"می{ZWNJ}خواهم بروم.", f"نمی{ZWNJ}دانم.", "Tom has a ︰ sign."] * 5
    tok = train_or_load(en + es + persian, cfg(vocab_size=80, normalization=rule), tmp_path)
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(tok.path.read_bytes())
    assert proto.normalizer_spec.name == name
    [out] = tok.decode(tok.encode([f"می{ZWNJ}خواهم ︰ Tom"]))
    expected = {
        "nmt_nfkc": "می خواهم .. Tom",  # ZWNJ → space (nmt_), U+FE30 → ".." (NFKC)
        "identity": f"می{ZWNJ}خواهم ︰ Tom",
        "nfkc_cf": f"می{ZWNJ}خواهم .. tom",
    }
    assert out == expected[rule]


def test_byte_fallback_spells_unknown_characters_in_bytes_that_decode_back(tmp_path):
    en, es = corpus()
    text = "Tom sees 5 Ω."  # Ω and 5 are in no training sentence
    plain = train_or_load(en + es, cfg(), tmp_path / "plain")
    assert plain.decode(plain.encode([text])) == ["Tom sees  ⁇   ⁇ ."]
    tok = train_or_load(en + es, cfg(vocab_size=300, byte_fallback=True), tmp_path / "bytes")
    ids = tok.encode([text])[0].tolist()
    assert tok.unk_id not in ids
    assert [tok.sp.id_to_piece(i) for i in ids if tok.sp.is_byte(i)] == [
        "<0x35>",
        "<0xCE>",
        "<0xA9>",
    ]
    assert tok.decode([ids]) == [text]


def test_user_supplied_model_is_used_as_is(tmp_path, monkeypatch):
    en, es = corpus()
    own = train_or_load(en + es, cfg(vocab_size=50), tmp_path / "mine")
    monkeypatch.setattr(spm.SentencePieceTrainer, "train", lambda **kw: pytest.fail("trained"))
    tok = train_or_load(["anything"], cfg(model_file=str(own.path)), tmp_path / "run")
    assert tok.path == own.path and tok.vocab_size == 50
    assert not (tmp_path / "run").exists()
    pair = load_pair(cfg(model_file=str(own.path)), tmp_path / "run", src_lang="en", tgt_lang="es")
    assert pair.joint and pair.source.sha256 == own.sha256


def test_missing_or_broken_model_file_is_named(tmp_path):
    with pytest.raises(TokenizerError, match="tokenizer model not found: .*nope.model"):
        Tokenizer(tmp_path / "nope.model")
    (tmp_path / "bad.model").write_bytes(b"not a model")
    with pytest.raises(TokenizerError, match="bad.model: not a SentencePiece model"):
        Tokenizer(tmp_path / "bad.model")
    en, es = corpus()
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(en + es), model_writer=model, vocab_size=48, pad_id=-1, minloglevel=2
    )  # no pad piece
    (tmp_path / "nopad.model").write_bytes(model.getvalue())
    with pytest.raises(TokenizerError, match="must define pad, bos and eos.*pad=-1"):
        Tokenizer(tmp_path / "nopad.model")


def test_joint_vocabulary_is_one_model_for_both_sides(tmp_path):
    en, es = corpus()
    pair = train_or_load_pair(en, es, cfg(), tmp_path, src_lang="en", tgt_lang="es")
    assert pair.joint and pair.source is pair.target
    assert pair.vocab_size == pair.src_vocab_size == 48
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spm.json", "spm.model"]
    assert "¿" in pieces(pair.source)  # trained on both sides


def test_separate_vocabularies_each_trained_on_its_own_side(tmp_path):
    en, es = corpus()
    pair = train_or_load_pair(en, es, cfg(joint=False), tmp_path, src_lang="en", tgt_lang="es")
    assert not pair.joint
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "spm.en.json",
        "spm.en.model",
        "spm.es.json",
        "spm.es.model",
    ]
    assert "¿" in pieces(pair.target) and "¿" not in pieces(pair.source)
    assert not any("ñ" in p for p in pieces(pair.source))
    # as a Tokenizer for translation: encode with the source model, decode with the target one
    np.testing.assert_array_equal(
        pair.encode(["Tom sees the cat."])[0], pair.source.encode(["Tom sees the cat."])[0]
    )
    es_ids = pair.target.encode(["¿Tom busco agua?"])
    assert pair.decode(es_ids) == ["¿Tom busco agua?"]
    assert pair.source.decode(es_ids) != ["¿Tom busco agua?"]
    loaded = load_pair(cfg(joint=False), tmp_path, src_lang="en", tgt_lang="es")
    assert (loaded.source.sha256, loaded.target.sha256) == (pair.source.sha256, pair.target.sha256)


def test_separate_vocabularies_with_one_given_model(tmp_path, monkeypatch):
    en, es = corpus()
    given = train_or_load(en, cfg(vocab_size=40), tmp_path / "given")
    calls = []
    real_train = train_or_load

    def spy(texts, config, workdir, **kw):
        calls.append(kw["name"])
        return real_train(texts, config, workdir, **kw)

    monkeypatch.setattr(tokenizer_module, "train_or_load", spy)
    pair = train_or_load_pair(
        en,
        es,
        cfg(joint=False, src_model_file=str(given.path)),
        tmp_path / "run",
        src_lang="en",
        tgt_lang="es",
    )
    assert calls == ["spm.es"]  # only the target side was trained
    assert pair.src_vocab_size == 40 and pair.vocab_size == 48
    assert pair.source.path == given.path


def test_pair_needs_the_same_special_ids(tmp_path):
    en, es = corpus()
    ours = train_or_load(en, cfg(), tmp_path / "ours")
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(es),
        model_writer=model,
        vocab_size=48,
        pad_id=3,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        minloglevel=2,
    )
    (tmp_path / "other.model").write_bytes(model.getvalue())
    with pytest.raises(TokenizerError, match="disagree on pad_id"):
        TokenizerPair(ours, Tokenizer(tmp_path / "other.model"))


def test_remove_extra_whitespaces_false_keeps_the_spaces_as_written(tmp_path):
    en, es = corpus()
    line = "Tom  sees the cat."
    default = train_or_load(en + es, cfg(), tmp_path / "default")
    kept = train_or_load(en + es, cfg(remove_extra_whitespaces=False), tmp_path / "kept")
    assert default.decode(default.encode([line]))[0] == "Tom sees the cat."
    assert kept.decode(kept.encode([line]))[0] == line


def _piece_map(tok: Tokenizer, path, *, drop=(), code=None) -> dict[str, int]:
    """A Marian-style map of ``tok``'s pieces: ``</s>`` 0, ``<unk>`` 1, the other pieces in
    reverse order (so that map ids differ from SentencePiece's), ``<pad>`` last."""
    mapping = {"</s>": 0, "<unk>": 1}
    if code:
        mapping[code] = len(mapping)
    for i in reversed(range(tok.vocab_size)):
        piece = tok.sp.id_to_piece(i)
        if piece not in mapping and piece not in drop and i not in (0, 2, 3):
            mapping[piece] = len(mapping)
    mapping["<pad>"] = len(mapping)
    path.write_text(json.dumps(mapping), encoding="utf-8")
    return mapping


def test_vocab_file_numbers_pieces_through_the_map(tmp_path):
    en, es = corpus()
    tok = train_or_load(en + es, cfg(), tmp_path)
    text = "We see the cat."
    kept = tok.sp.encode(text, out_type=str)
    dropped = next(p for p in tok.sp.encode("Tom", out_type=str) if p not in kept)
    mapping = _piece_map(tok, tmp_path / "vocab.json", drop=[dropped], code=">>es<<")
    mapped = Tokenizer(tok.path, tmp_path / "vocab.json")
    assert (mapped.eos_id, mapped.unk_id, mapped.pad_id, mapped.bos_id) == (
        0,
        1,
        len(mapping) - 1,
        len(mapping) - 1,
    )
    assert mapped.vocab_size == len(mapping) and mapped.sha256 != tok.sha256
    ids = mapped.encode([text, ">>es<< " + text, "Tom"])
    want = [mapping[p] for p in tok.sp.encode(text, out_type=str)] + [0]
    assert ids[0].tolist() == want and ids[1].tolist() == [mapping[">>es<<"], *want]
    assert 1 in ids[2]  # a piece missing from the map is the unknown piece
    assert [mapped.id_to_piece(i) for i in want[:-1]] == tok.sp.encode(text, out_type=str)
    assert mapped.piece_to_id("no such piece") == 1
    assert mapped.decode([[mapped.pad_id, *ids[0].tolist(), mapped.pad_id]]) == [text]
    pair = TokenizerPair(mapped, Tokenizer(tok.path, tmp_path / "vocab.json"))
    assert pair.shared_ids and not pair.joint
    loaded = load_pair(
        cfg(
            joint=False,
            vocab_file="vocab.json",
            src_model_file=str(tok.path),
            tgt_model_file=str(tok.path),
        ),
        tmp_path,
        src_lang="en",
        tgt_lang="es",
    )
    assert loaded.shared_ids and loaded.encode([text])[0].tolist() == want


@pytest.mark.parametrize(
    "content, message",
    [
        ("[1, 2]", "expected a JSON object of piece"),
        ('{"</s>": 0, "<unk>": 0, "<pad>": 1}', "ids must be distinct"),
        ('{"</s>": 0, "<unk>": 1, "<pad>": 5}', "has id 5"),
        ('{"</s>": 0, "<unk>": 1}', "has no '<pad>' piece"),
        ("{", "not JSON"),
    ],
)
def test_bad_vocab_file_is_named(tmp_path, content, message):
    en, es = corpus()
    tok = train_or_load(en + es, cfg(), tmp_path)
    (tmp_path / "vocab.json").write_text(content, encoding="utf-8")
    with pytest.raises(TokenizerError, match=re.escape(message)):
        Tokenizer(tok.path, tmp_path / "vocab.json")
    with pytest.raises(TokenizerError, match="vocabulary map not found"):
        Tokenizer(tok.path, tmp_path / "missing.json")
    with pytest.raises(TokenizerError, match="numbers the pieces of existing"):
        train_or_load_pair(
            en,
            es,
            cfg(joint=False, vocab_file="vocab.json"),
            tmp_path,
            src_lang="en",
            tgt_lang="es",
        )
