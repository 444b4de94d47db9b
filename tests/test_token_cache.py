"""The token-id cache: plain int32/int64 arrays, keyed by text and model, never stale."""

from __future__ import annotations

import numpy as np
import pytest

from seq2seq.config import TokenizerConfig
from seq2seq.data.token_cache import content_key, encode_cached, from_flat, to_flat
from seq2seq.data.tokenizer import Tokenizer, train_or_load

TEXTS = [f"sentence {i} about {'cats' if i % 2 else 'dogs'} and {i % 7} birds." for i in range(300)]


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> Tokenizer:
    return train_or_load(TEXTS, TokenizerConfig(vocab_size=40), tmp_path_factory.mktemp("spm"))


@pytest.fixture(scope="module")
def other_tok(tmp_path_factory) -> Tokenizer:
    return train_or_load(TEXTS, TokenizerConfig(vocab_size=44), tmp_path_factory.mktemp("spm2"))


def assert_same_ids(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == np.int32
        np.testing.assert_array_equal(x, y)


def test_flat_layout_round_trips_including_empty():
    ids = [np.array([5, 6, 3], np.int32), np.array([3], np.int32), np.array([], np.int32)]
    flat, offsets = to_flat(ids)
    assert flat.dtype == np.int32 and offsets.dtype == np.int64
    np.testing.assert_array_equal(flat, [5, 6, 3, 3])
    np.testing.assert_array_equal(offsets, [0, 3, 4, 4])
    assert_same_ids(from_flat(flat, offsets), ids)
    assert from_flat(*to_flat([])) == []


def test_second_call_reads_the_file_instead_of_tokenizing(tmp_path, tok, monkeypatch):
    ids, hit, seconds = encode_cached(tok, TEXTS, tmp_path, "train.source")
    assert not hit and seconds > 0
    assert_same_ids(ids, tok.encode(TEXTS))
    files = list(tmp_path.glob("train.source.*.npz"))
    assert len(files) == 1
    with np.load(files[0], allow_pickle=False) as f:  # plain arrays, no pickled objects
        assert sorted(f.files) == ["ids", "offsets"]
        assert f["ids"].dtype == np.int32 and f["offsets"].shape == (len(TEXTS) + 1,)

    monkeypatch.setattr(Tokenizer, "encode", lambda *a, **k: pytest.fail("tokenized again"))
    again, hit, _ = encode_cached(tok, TEXTS, tmp_path, "train.source")
    assert hit
    assert_same_ids(again, ids)


def test_changed_text_or_model_tokenizes_again_and_drops_the_old_file(tmp_path, tok, other_tok):
    encode_cached(tok, TEXTS, tmp_path, "train.source")
    encode_cached(tok, TEXTS, tmp_path, "dev.source")
    changed = TEXTS[:-1] + [TEXTS[-1] + "!"]
    ids, hit, _ = encode_cached(tok, changed, tmp_path, "train.source")
    assert not hit
    assert_same_ids(ids, tok.encode(changed))
    ids, hit, _ = encode_cached(other_tok, changed, tmp_path, "train.source")
    assert not hit
    assert_same_ids(ids, other_tok.encode(changed))
    # one file per split side; the other split's file is untouched
    assert len(list(tmp_path.glob("train.source.*.npz"))) == 1
    assert len(list(tmp_path.glob("dev.source.*.npz"))) == 1


def test_key_separates_sentence_boundaries_and_models(tok, other_tok):
    assert content_key(["a b", "c"], tok) != content_key(["a", "b c"], tok)
    assert content_key(["ab"], tok) != content_key(["a", "b"], tok)
    assert content_key(TEXTS, tok) != content_key(TEXTS, other_tok)
    assert content_key(TEXTS, tok) == content_key(list(TEXTS), tok)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "wrong_offsets", "float_ids"])
def test_damaged_file_is_never_trusted(tmp_path, tok, damage):
    ids, _, _ = encode_cached(tok, TEXTS, tmp_path, "train.target")
    path = next(tmp_path.glob("train.target.*.npz"))
    flat, offsets = to_flat(ids)
    if damage == "garbage":
        path.write_bytes(b"not an npz file")
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:100])
    elif damage == "wrong_offsets":
        np.savez(path, ids=flat, offsets=offsets[:-1])
    else:
        np.savez(path, ids=flat.astype(np.float32), offsets=offsets)
    again, hit, _ = encode_cached(tok, TEXTS, tmp_path, "train.target")
    assert not hit
    assert_same_ids(again, ids)
    with np.load(path, allow_pickle=False) as f:  # rewritten correctly
        np.testing.assert_array_equal(f["ids"], flat)


def test_no_cache_dir_and_bad_names(tmp_path, tok):
    ids, hit, _ = encode_cached(tok, TEXTS[:3], None, "train.source")
    assert not hit and len(ids) == 3
    with pytest.raises(ValueError, match="split.side"):
        encode_cached(tok, TEXTS[:3], tmp_path, "train")
