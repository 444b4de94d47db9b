"""prepare(): filters and counts, the token cache across runs, separate vocabularies, and the
real-token share on the shipped corpus."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import datasets
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sentencepiece as spm
from flax import nnx
from test_tokenizer import corpus

from seq2seq.config import (
    Config,
    ConfigError,
    DataConfig,
    DecodeConfig,
    ModelConfig,
    SourceConfig,
    TokenizerConfig,
    replace,
)
from seq2seq.data import pipeline, token_cache
from seq2seq.data.batching import FIELDS, PackedBatches, real_token_share
from seq2seq.data.pipeline import decode_source_limit, fill_vocab_sizes, prepare
from seq2seq.data.tokenizer import Tokenizer, train_or_load
from seq2seq.model import build_model
from seq2seq.resolve import resolve
from seq2seq.training.step import make_eval_step
from seq2seq.translation import Translator

ROOT = Path(__file__).resolve().parents[1]
TATOEBA = ROOT / "data" / "tatoeba-en-es"

LONG_EN = " ".join(["Tom sees the cat and"] * 10)  # ~190 tokens with the toy vocabulary
LONG_ES = " ".join(["Tom veo el gato y"] * 10)
SHORT_EN, WORDY_ES = "Tom.", "¿Tom veo el gato mañana?"  # ~6 vs ~24 tokens: ratio > 3
HUGE_EN = "Tom sees the cat " * 80  # > 256 tokens


@pytest.fixture(autouse=True, scope="module")
def _private_hf_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path_factory.mktemp("hf_cache"))
        yield


def write_split(directory: Path, name: str, en: list[str], es: list[str]) -> str:
    for lang, lines in (("en", en), ("es", es)):
        (directory / f"{name}.{lang}").write_text(
            "".join(s + "\n" for s in lines), encoding="utf-8"
        )
    return str(directory / name)


@pytest.fixture
def toy(tmp_path) -> dict:
    """A toy corpus with one over-long and one ill-proportioned training pair, one over-long
    dev pair and one over-long test source."""
    en, es = corpus(300, seed=0)
    train_en, train_es = en + [LONG_EN, SHORT_EN], es + [LONG_ES, WORDY_ES]
    dev_en, dev_es = corpus(20, seed=1)
    dev_en, dev_es = dev_en + [LONG_EN], dev_es + [LONG_ES]
    test_en, test_es = corpus(10, seed=2)
    test_en, test_es = test_en + [HUGE_EN], test_es + ["Tom."]
    return {
        "dir": tmp_path,
        "train": (train_en, train_es),
        "dev": (dev_en, dev_es),
        "test": (test_en, test_es),
        "paths": {
            s: write_split(tmp_path, s, *v)
            for s, v in (
                ("train", (train_en, train_es)),
                ("dev", (dev_en, dev_es)),
                ("test", (test_en, test_es)),
            )
        },
    }


def toy_config(toy: dict, **changes) -> Config:
    paths = toy["paths"]
    config = Config(
        workdir=str(toy["dir"] / "run"),
        data=DataConfig(
            train=SourceConfig(path=paths["train"]),
            dev=SourceConfig(path=paths["dev"]),
            test=SourceConfig(path=paths["test"]),
            max_len=40,
            max_tokens=160,
        ),
        tokenizer=TokenizerConfig(vocab_size=48),
        model=ModelConfig(
            d_model=16,
            num_heads=2,
            num_encoder_layers=1,
            num_decoder_layers=1,
            d_ff=32,
            dropout_rate=0.0,
        ),
    )
    return replace(config, **changes)


def test_only_training_pairs_are_dropped_and_every_cut_is_counted(toy):
    config = toy_config(toy)
    data = prepare(config, config.workdir)
    tok = data.tokenizer
    # the premises of the toy corpus hold for the trained vocabulary
    assert len(tok.encode([LONG_EN])[0]) > 40 and len(tok.encode([HUGE_EN])[0]) > 256
    short, wordy = len(tok.source.encode([SHORT_EN])[0]), len(tok.target.encode([WORDY_ES])[0])
    assert wordy / short > 3 and wordy <= 40
    s = data.stats
    assert (
        s["train_pairs_read"],
        s["train_pairs_dropped_length"],
        s["train_pairs_dropped_ratio"],
        s["train_pairs"],
    ) == (302, 1, 1, 300)
    assert (s["dev_pairs"], s["dev_pairs_truncated"]) == (21, 1)
    assert (s["test_pairs"], s["test_sources_truncated"]) == (11, 1)
    assert decode_source_limit(config) == 256
    train_sources = set(toy["train"][0])
    assert s["dev_sources_in_train"] == sum(x in train_sources for x in toy["dev"][0])
    assert s["test_sources_in_train"] == sum(x in train_sources for x in toy["test"][0])
    assert s["tokenize_sentences"] == 2 * 302 + 2 * 21 + 2 * 11  # test targets: unknown rate
    assert [
        s[f"{split}_{side}_unknown_rate"]
        for split in ("train", "dev", "test")
        for side in ("source", "target")
    ] == [0.0] * 6  # the toy text is all in the vocabulary
    assert s["tokenize_sentences_per_second"] > 0 and s["token_cache_hits"] == 0
    assert 0.5 < s["train_real_token_share"] <= 1
    # every dev pair is in the dev batches, the long one cut to max_len and ending in EOS
    dev_segments = [b["src_segments"] for b in data.dev.epoch(0)]
    assert sum(len(np.unique(row[row > 0])) for segs in dev_segments for row in segs) == 21
    assert max(len(x) for x in data.dev.src) == 40 and data.dev.src[-1][-1] == tok.eos_id
    assert len(data.test_text.sources) == 11 and data.test_text.sources[-1] == HUGE_EN.strip()


def test_a_second_run_neither_retrains_nor_retokenizes(toy, monkeypatch):
    config = toy_config(toy)
    first = prepare(config, config.workdir)
    cached = sorted(
        p.name.split(".")[0] + "." + p.name.split(".")[1]
        for p in (Path(config.workdir) / "tokens").glob("*.offsets")
    )
    assert cached == [
        "dev.source",
        "dev.target",
        "test.source",
        "test.target",
        "train.source",
        "train.target",
    ]

    monkeypatch.setattr(spm.SentencePieceTrainer, "train", lambda **kw: pytest.fail("retrained"))
    monkeypatch.setattr(Tokenizer, "encode", lambda *a, **kw: pytest.fail("tokenized again"))
    for module in (token_cache, pipeline):
        monkeypatch.setattr(module, "encode_blocks", lambda *a: pytest.fail("tokenized again"))
    read = []  # the splits whose text is read: the training text is not
    real_load = pipeline.load_parallel
    monkeypatch.setattr(
        pipeline,
        "load_parallel",
        lambda *a, **kw: read.append(kw["split_name"]) or real_load(*a, **kw),
    )
    second = prepare(config, config.workdir)
    assert read == ["dev", "test"]
    s = second.stats
    assert s["token_cache_hits"] == 6 and s["tokenize_sentences"] == 0
    assert "tokenize_sentences_per_second" not in s
    for key in (
        "train_pairs_read",
        "dev_sources_in_train",
        "test_sources_in_train",
        "train_pairs",
        "train_pairs_dropped_length",
        "train_pairs_dropped_ratio",
        "dev_pairs_truncated",
        "test_sources_truncated",
        "train_real_token_share",
    ):
        assert s[key] == first.stats[key]
    for step in (0, 3, first.train.batches_in_epoch(0) + 1):
        a, b = first.train.batch_at(step), second.train.batch_at(step)
        for key in FIELDS:
            np.testing.assert_array_equal(a[key], b[key])


def test_changed_training_text_is_read_retrained_and_tokenized_again(toy):
    config = toy_config(toy)
    first = prepare(config, config.workdir)
    path = Path(config.data.train.path + ".es")
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:-1] + ["una frase nueva que nadie ha visto"]) + "\n")
    second = prepare(config, config.workdir)
    s = second.stats
    assert second.tokenizer.source.sha256 != first.tokenizer.source.sha256  # retrained
    assert s["token_cache_hits"] == 0 and s["tokenize_sentences"] > 0
    # the files' fingerprints were recorded: a third run reads nothing of the training text
    third = prepare(config, config.workdir)
    assert third.stats["token_cache_hits"] == 6
    assert third.tokenizer.source.sha256 == second.tokenizer.source.sha256


def test_a_same_size_rewrite_with_its_mtime_put_back_is_tokenized_again(toy):
    """A training line replaced by another of the same length and the file's modification
    time put back (``touch -r``, an archive extraction): the store is built again from the
    new text (issue 49; size and mtime alone saw no change)."""
    config = toy_config(toy)
    first = prepare(config, config.workdir)
    path = Path(config.data.train.path + ".es")
    lines = path.read_text(encoding="utf-8").splitlines()
    other = next(x for x in lines if len(x) == len(lines[2]) and x != lines[2])
    assert first.tokenizer.target.decode([first.train.tgt[2]]) == [lines[2]]
    before = path.stat()
    path.write_text("\n".join([*lines[:2], other, *lines[3:]]) + "\n", encoding="utf-8")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    second = prepare(config, config.workdir)
    assert second.tokenizer.target.decode([second.train.tgt[2]]) == [other]


def test_separate_vocabularies_with_shared_embeddings_fail_before_reading(tmp_path):
    config = Config(
        workdir=str(tmp_path / "run"),
        data=DataConfig(train=SourceConfig(path=str(tmp_path / "missing"))),
        tokenizer=TokenizerConfig(joint=False),
    )
    with pytest.raises(ConfigError, match="model.share_embeddings=target or none"):
        prepare(config, config.workdir)
    with pytest.raises(
        ConfigError, match=r"tokenizer.character_coverage must be in \[0.98, 1\].*, got 0.5"
    ):
        prepare(
            replace(config, **{"tokenizer.joint": True, "tokenizer.character_coverage": 0.5}),
            config.workdir,
        )


def test_separate_vocabularies_feed_a_model_with_two_embedding_tables(toy):
    en, _ = toy["train"]
    given = train_or_load(en, TokenizerConfig(vocab_size=40), toy["dir"] / "given")
    config = toy_config(
        toy,
        **{
            "tokenizer.joint": False,
            "tokenizer.src_model_file": str(given.path),
            "model.share_embeddings": False,
        },
    )
    data = prepare(config, config.workdir)
    assert not data.tokenizer.joint
    assert (Path(config.workdir) / "spm.es.model").is_file()
    assert not (Path(config.workdir) / "spm.en.model").exists()  # given, not trained
    config = fill_vocab_sizes(config, data.tokenizer)
    assert (config.model.src_vocab_size, config.model.vocab_size) == (40, 48)

    batch = data.train.batch_at(0)
    assert batch["src"].max() < 40 and batch["tgt"].max() < 48
    first = batch["src"][0][batch["src_segments"][0] == 1]
    assert data.tokenizer.source.decode([first])[0] in set(en)

    model = build_model(config.model, seed=0)
    assert model.embed.embedding.shape == (40, 16)
    assert model.target_embed.embedding.shape == (48, 16)
    graphdef, params = nnx.split(model, nnx.Param)
    eval_step = make_eval_step(graphdef, bos_id=data.tokenizer.bos_id, label_smoothing=0.0)
    m = jax.jit(eval_step)(params, {k: jnp.asarray(v) for k, v in batch.items()})
    tokens = float(m["tokens"])
    assert tokens == float((batch["tgt_segments"] > 0).sum())
    # an untrained model is close to uniform over the 48 target pieces
    assert float(m["nll"]) / tokens == pytest.approx(np.log(48), rel=0.2)

    # the pair stands in for a Tokenizer in translation: source ids in, target text out
    translator = Translator(
        graphdef,
        params,
        data.tokenizer,
        DecodeConfig(beam_size=2, max_len_a=0.0, max_len_b=6),
        max_src_len=decode_source_limit(config),
    )
    [[hyp]] = translator.translate(["Tom sees the cat."])
    assert len(hyp.tokens) > 0 and max(hyp.tokens) < 48
    assert hyp.text == data.tokenizer.target.decode([hyp.tokens])[0]


def test_vocabulary_sizes_are_filled_or_checked(toy):
    config = toy_config(toy)
    data = prepare(config, config.workdir)
    assert fill_vocab_sizes(config, data.tokenizer).model.vocab_size == 48
    assert fill_vocab_sizes(config, data.tokenizer).model.src_vocab_size == 0  # joint
    with pytest.raises(ConfigError, match="model.vocab_size=50 but the target tokenizer has 48"):
        fill_vocab_sizes(replace(config, **{"model.vocab_size": 50}), data.tokenizer)
    with pytest.raises(ConfigError, match="model.src_vocab_size=30 but the vocabulary is joint"):
        fill_vocab_sizes(replace(config, **{"model.src_vocab_size": 30}), data.tokenizer)
    with pytest.raises(ValueError, match="set model.share_embeddings to 'target' or 'none'"):
        build_model(ModelConfig(vocab_size=48, src_vocab_size=40, d_model=16, num_heads=2), 0)


def _shipped_subset(split: str, n: int) -> tuple[list[str], list[str]]:
    sides = []
    for lang in ("en", "es"):
        with gzip.open(TATOEBA / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
            sides.append(f.read().split("\n")[:n])
    return sides[0], sides[1]


def test_packing_fills_over_90_percent_of_tokens_on_the_shipped_corpus(tmp_path):
    """The shipped settings (configs/tatoeba_en_es.yaml) on the first 20,000 training pairs,
    with the tokenizer trained on them (the full corpus is the slow test below)."""
    # the batch size the recipe picks for the whole shipped corpus (2,048 tokens)
    path = ROOT / "configs" / "tatoeba_en_es.yaml"
    config = resolve(path, [f"workdir={tmp_path}"], validate=False).config
    d = config.data
    assert d.max_tokens == 2048
    en, es = _shipped_subset("train", 20_000)
    tok = train_or_load(en + es, config.tokenizer, tmp_path)
    assert tok.vocab_size == config.tokenizer.vocab_size == 8000
    src, tgt = tok.encode(en), tok.encode(es)
    keep = [i for i in range(len(src)) if max(len(src[i]), len(tgt[i])) <= d.max_len]
    batches = PackedBatches(
        [src[i] for i in keep],
        [tgt[i] for i in keep],
        max_len=d.max_len,
        rows=d.max_tokens // d.max_len,
        seed=config.train.seed,
        packing=d.packing,
    )
    shares = [real_token_share(batches.batch_at(k)) for k in range(5)]
    assert min(shares) >= 0.9, shares
    assert batches.real_token_share(0) >= 0.9


@pytest.mark.slow
def test_shipped_corpus_end_to_end_share_and_cache(tmp_path):
    """prepare() on the whole shipped corpus with the shipped config, twice."""
    config = resolve(ROOT / "configs" / "tatoeba_en_es.yaml", [f"workdir={tmp_path}"]).config
    first = prepare(config, tmp_path)
    s = first.stats
    assert (s["train_pairs_read"], s["dev_pairs"], s["test_pairs"]) == (136_672, 1_416, 2_780)
    assert (
        s["train_pairs"] + s["train_pairs_dropped_length"] + s["train_pairs_dropped_ratio"]
        == s["train_pairs_read"]
    )
    assert s["train_pairs_dropped_length"] + s["train_pairs_dropped_ratio"] < 100
    assert s["train_real_token_share"] >= 0.9
    assert all(real_token_share(first.train.batch_at(k)) >= 0.9 for k in range(10))
    assert s["tokenize_sentences"] == 2 * 136_672 + 2 * 1_416 + 2 * 2_780
    second = prepare(config, tmp_path)
    assert second.stats["token_cache_hits"] == 6 and second.stats["tokenize_sentences"] == 0
    for key in FIELDS:
        np.testing.assert_array_equal(first.train.batch_at(7)[key], second.train.batch_at(7)[key])
