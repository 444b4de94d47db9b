"""The token store: flat uint16/int32 ids and int64 offsets, memory-mapped, keyed by text (or
the files' fingerprint) and model, never stale."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from seq2seq.config import TokenizerConfig
from seq2seq.data import token_cache
from seq2seq.data.token_cache import (
    TokenIds,
    content_key,
    encode_cached,
    file_fingerprint,
    from_flat,
    read_store,
    to_flat,
    write_store,
)
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


def test_second_call_maps_the_store_instead_of_tokenizing(tmp_path, tok, monkeypatch):
    ids, hit, seconds = encode_cached(tok, TEXTS, tmp_path, "train.source")
    assert not hit and seconds > 0
    assert_same_ids(ids, tok.encode(TEXTS))
    files = sorted(p.name.split(".", 2)[2].split(".")[1] for p in tmp_path.glob("train.source.*"))
    assert files == ["ids", "json", "offsets"]
    meta = json.loads(next(tmp_path.glob("train.source.*.json")).read_text())
    assert meta["dtype"] == np.dtype(np.uint16).str  # 40 pieces fit in 16 bits
    assert meta["sentences"] == len(TEXTS) and meta["tokens"] == sum(len(x) for x in ids)
    assert next(tmp_path.glob("*.ids")).stat().st_size == 2 * meta["tokens"]

    monkeypatch.setattr(token_cache, "encode_blocks", lambda *a: pytest.fail("tokenized again"))
    again, hit, _ = encode_cached(tok, TEXTS, tmp_path, "train.source")
    assert hit
    assert isinstance(again.flat, np.memmap) and isinstance(again.offsets, np.memmap)
    assert_same_ids(again, ids)


def test_large_vocabularies_are_stored_as_int32(tmp_path):
    blocks = iter([[[70_000, 3], [5, 3]], [[65_536, 1, 3]]])
    ids = write_store(tmp_path, "train.target", "k" * 32, blocks, vocab_size=70_001)
    assert ids.flat.dtype == np.int32
    assert_same_ids(ids, [np.array(x, np.int32) for x in ([70_000, 3], [5, 3], [65_536, 1, 3])])
    np.testing.assert_array_equal(ids.lengths, [2, 2, 3])


def test_selection_gathers_without_copying_the_store():
    ids = TokenIds.from_list([np.arange(n, dtype=np.int32) + 10 * n for n in (3, 1, 4, 2)])
    part = ids.select(np.array([2, 0]))
    assert part.flat is ids.flat
    assert_same_ids(part, [ids[2], ids[0]])
    np.testing.assert_array_equal(part.gather(np.array([1, 0])), np.concatenate([ids[0], ids[2]]))
    assert ids.count(40) == 1 and part.select(np.array([1])).count(40) == 0
    assert_same_ids(ids[1:3], [ids[1], ids[2]])
    assert ids[-1].tolist() == [20, 21]


def test_file_fingerprint_reads_a_file_only_when_it_changed(tmp_path, monkeypatch):
    data, registry = tmp_path / "train.en", tmp_path / "tokens" / "files.json"
    data.write_text("one\ntwo\n")
    first = file_fingerprint([data], registry)
    real = token_cache._file_sha256
    monkeypatch.setattr(token_cache, "_file_sha256", lambda p: pytest.fail(f"read {p}"))
    assert file_fingerprint([data], registry) == first  # size and mtime unchanged: no read
    monkeypatch.setattr(token_cache, "_file_sha256", real)
    data.write_text("one\nTWO\n")  # same size, new mtime: read, and the change is seen
    assert file_fingerprint([data], registry) != first
    data.write_text("one\ntwo\n")  # the old content again: the old fingerprint
    assert file_fingerprint([data], registry) == first


def test_file_fingerprint_sees_a_same_size_rewrite_whatever_its_times_say(tmp_path):
    """Issue 49: a same-size rewrite with its mtime put back (``touch -r``) is seen (the change
    time moved), and so is one that no time shows (a coarse clock), by the sampled blocks."""
    data, registry = tmp_path / "train.en", tmp_path / "tokens" / "files.json"
    data.write_text("one\ntwo\n")
    first = file_fingerprint([data], registry)
    before = data.stat()
    data.write_text("one\nTWO\n")
    os.utime(data, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert data.stat().st_mtime_ns == before.st_mtime_ns
    assert file_fingerprint([data], registry) == file_fingerprint([data], None) != first

    data.write_text("one\ntwo\n")  # the registry's entry then says this stat is known
    entries = json.loads(registry.read_text())
    st = data.stat()
    times = dict(size=st.st_size, inode=st.st_ino, mtime_ns=st.st_mtime_ns, ctime_ns=st.st_ctime_ns)
    entries[str(data.resolve())].update(times)
    registry.write_text(json.dumps(entries))
    assert file_fingerprint([data], registry) == first


def test_changed_text_or_model_tokenizes_again_and_drops_the_old_store(tmp_path, tok, other_tok):
    encode_cached(tok, TEXTS, tmp_path, "train.source")
    encode_cached(tok, TEXTS, tmp_path, "dev.source")
    changed = TEXTS[:-1] + [TEXTS[-1] + "!"]
    ids, hit, _ = encode_cached(tok, changed, tmp_path, "train.source")
    assert not hit
    assert_same_ids(ids, tok.encode(changed))
    ids, hit, _ = encode_cached(other_tok, changed, tmp_path, "train.source")
    assert not hit
    assert_same_ids(ids, other_tok.encode(changed))
    # one store per split side; the other split's store is untouched
    assert len(list(tmp_path.glob("train.source.*"))) == 3
    assert len(list(tmp_path.glob("dev.source.*"))) == 3


def test_key_separates_sentence_boundaries_and_models(tok, other_tok):
    assert content_key(["a b", "c"], tok) != content_key(["a", "b c"], tok)
    assert content_key(["ab"], tok) != content_key(["a", "b"], tok)
    assert content_key(TEXTS, tok) != content_key(TEXTS, other_tok)
    assert content_key(TEXTS, tok) == content_key(list(TEXTS), tok)
    assert content_key(None, tok, inputs="a") != content_key(None, tok, inputs="b")


@pytest.mark.parametrize("damage", ["garbage_meta", "truncated_ids", "wrong_offsets", "float_ids"])
def test_damaged_store_is_never_trusted(tmp_path, tok, damage):
    ids = encode_cached(tok, TEXTS, tmp_path, "train.target")[0].to_list()  # not the mapping
    meta_path = next(tmp_path.glob("train.target.*.json"))
    stem = str(meta_path)[: -len(".json")]
    if damage == "garbage_meta":
        meta_path.write_text("not json")
    elif damage == "truncated_ids":
        Path(stem + ".ids").write_bytes(Path(stem + ".ids").read_bytes()[:100])
    elif damage == "wrong_offsets":
        offsets = np.fromfile(stem + ".offsets", np.int64)
        offsets[5] = offsets[4] - 1
        offsets.tofile(stem + ".offsets")
    else:
        meta = json.loads(meta_path.read_text())
        meta_path.write_text(json.dumps({**meta, "dtype": "<f4"}))
    again, hit, _ = encode_cached(tok, TEXTS, tmp_path, "train.target")
    assert not hit
    assert_same_ids(again, ids)
    assert_same_ids(read_store(tmp_path, "train.target", content_key(TEXTS, tok))[0], ids)


def test_no_cache_dir_and_bad_names(tmp_path, tok):
    ids, hit, _ = encode_cached(tok, TEXTS[:3], None, "train.source")
    assert not hit and len(ids) == 3
    with pytest.raises(ValueError, match="split.side"):
        encode_cached(tok, TEXTS[:3], tmp_path, "train")


@pytest.mark.parametrize(
    "which",
    [None, "most", "few", "repeats"],
)
def test_count_equals_a_brute_force_count(which):
    """``count`` over the whole flat array (minus the sentences left out) or by gathering gives
    the same as counting sentence by sentence."""
    rng = np.random.default_rng(0)
    ids = TokenIds.from_list([rng.integers(0, 5, size=rng.integers(0, 9)) for _ in range(200)])
    selection = {
        None: None,
        "most": np.sort(rng.choice(200, 150, replace=False)),  # the flat array minus the rest
        "few": np.sort(rng.choice(200, 20, replace=False)),
        "repeats": rng.integers(0, 200, 180),  # a sentence twice counts twice
    }[which]
    held = ids if selection is None else ids.select(selection)
    for value in range(5):
        assert held.count(value) == sum(int(np.sum(x == value)) for x in held)


def test_worker_processes_give_the_ids_of_one_process(tmp_path, tok, monkeypatch):
    """``encode_blocks`` in spawned worker processes (blocks of 7 sentences here) yields the
    same ids, in the same order, as SentencePiece in this process; the store matches too."""
    monkeypatch.setattr(token_cache, "BLOCK", 7)
    texts = [f"sentence number {i} of the corpus" * (1 + i % 3) for i in range(40)]
    want = [tok.sp.encode(t, out_type=int, add_eos=True) for t in texts]
    blocks = list(token_cache.encode_blocks(tok, texts, workers=2))
    assert len(blocks) == 6
    lengths = np.concatenate([b[0] for b in blocks])
    flat = np.concatenate([b[1] for b in blocks])
    assert lengths.tolist() == [len(x) for x in want]
    assert flat.tolist() == [i for x in want for i in x]
    ids = write_store(tmp_path, "train.source", "k" * 32, iter(blocks), tok.vocab_size)
    assert_same_ids(ids, [np.array(x, np.int32) for x in want])


def test_the_store_numbers_pieces_through_a_vocabulary_map(tmp_path, monkeypatch):
    """With a Marian ``vocab.json`` (``</s>`` 0, ``<unk>`` 1, the other pieces shuffled, a
    ``>>es<<`` code, a piece SentencePiece does not know), the store, in this process and in
    worker processes, holds ``Tokenizer.encode``'s ids, and both equal the map's numbering
    of SentencePiece's pieces (as Hugging Face's ``MarianTokenizer`` numbers them)."""
    import io
    import random

    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(TEXTS),
        model_writer=model,
        vocab_size=50,
        unk_id=0,
        eos_id=1,
        bos_id=-1,
        pad_id=-1,
        minloglevel=2,
        num_threads=1,
    )
    (tmp_path / "source.spm").write_bytes(model.getvalue())
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    pieces = [sp.id_to_piece(i) for i in range(2, sp.get_piece_size())] + [">>es<<", "ø"]
    random.Random(0).shuffle(pieces)
    mapping = {"</s>": 0, "<unk>": 1, **{p: i + 2 for i, p in enumerate(pieces)}}
    mapping["<pad>"] = len(mapping)
    (tmp_path / "vocab.json").write_text(json.dumps(mapping), encoding="utf-8")
    tok = Tokenizer(tmp_path / "source.spm", tmp_path / "vocab.json")
    assert (tok.eos_id, tok.unk_id) == (0, 1)
    texts = [*TEXTS[:30], ">>es<< sentence 3 about dogs.", "ø and ☃ birds.", "", ">>xx<< cats"]

    def reference(text: str) -> list[int]:
        code = [mapping[">>es<<"]] if text.startswith(">>es<< ") else []
        body = text.removeprefix(">>es<< ")
        return code + [mapping.get(p, 1) for p in sp.encode(body, out_type=str)] + [0]

    want = [np.array(reference(t), np.int32) for t in texts]
    assert sum(int(np.sum(w[:-1] == 1)) for w in want) >= 2  # unknown pieces are in the test
    assert any(mapping["ø"] in w for w in want)  # SentencePiece's unknown, the map's piece
    assert_same_ids(tok.encode(texts), want)
    assert_same_ids(encode_cached(tok, texts, None, "train.source")[0], want)
    assert_same_ids(encode_cached(tok, texts, tmp_path / "tokens", "train.source")[0], want)
    monkeypatch.setattr(token_cache, "BLOCK", 7)
    blocks = list(token_cache.encode_blocks(tok, texts, workers=2))
    assert len(blocks) == 5
    ids = write_store(tmp_path / "workers", "train.source", "k" * 32, iter(blocks), tok.vocab_size)
    assert_same_ids(ids, want)
