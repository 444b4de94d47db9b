"""``seq2seq-import --from marian``: random ``MarianMTModel`` checkpoints built here (no network)
are imported and must give PyTorch's logits (within 1e-4, a padded batch) and ``generate``'s
translations through ``seq2seq-translate``; settings our model cannot hold are named errors."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from tiny_run import shipped_pairs

from seq2seq import cli

torch = pytest.importorskip("torch", reason="torch comes with the optional extra 'compare'")
transformers = pytest.importorskip(
    "transformers", reason="transformers comes with the optional extra 'compare'"
)
spm = pytest.importorskip("sentencepiece")

PAIRS = shipped_pairs(0, 300)
SENTENCES = [
    "Where is the station?",
    "I can't eat chicken.",
    "Tom is here and he is very, very happy today.",
    "Go.",
]


def _spm(texts: list[str], vocab_size: int) -> bytes:
    """A SentencePiece model with Marian's special pieces (``<unk>``, ``</s>``; no pad, no bos)."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_writer=model,
        vocab_size=vocab_size,
        unk_id=0,
        eos_id=1,
        bos_id=-1,
        pad_id=-1,
        minloglevel=2,
        num_threads=1,
    )
    return model.getvalue()


def make_marian(
    directory: Path,
    *,
    d_model: int = 32,
    layers: tuple[int, int] = (2, 2),
    heads: int = 4,
    ffn: int = 64,
    joint_spm: bool = True,
    share: bool = True,
    tie: bool = True,
    scale: bool = True,
    activation: str = "swish",
    weights: str = "safetensors",
    seed: int = 0,
    eos_bias: float = 0.0,
    **config: object,
) -> Path:
    """A random ``MarianMTModel`` saved with ``save_pretrained`` beside ``source.spm``,
    ``target.spm`` (one model trained on both sides, or one per side) and a ``vocab.json``
    numbering the union of their pieces as Marian does (``</s>`` 0, ``<unk>`` 1, ``<pad>``
    last), the other pieces in a shuffled order (so that no map id is SentencePiece's by
    chance). The weights are scaled up from Hugging Face's init (std 0.02) and the logits bias
    favours EOS, so that greedy and beam search end at different lengths."""
    directory.mkdir(parents=True)
    src, tgt = [p[0] for p in PAIRS], [p[1] for p in PAIRS]
    if joint_spm:
        models = [_spm(src + tgt, 300)] * 2
    else:
        models = [_spm(src, 200), _spm(tgt, 250)]
    ordinary: dict[str, None] = {}  # in order, without repeats
    for blob in models:
        sp = spm.SentencePieceProcessor()
        sp.LoadFromSerializedProto(blob)
        ordinary.update(dict.fromkeys(sp.id_to_piece(i) for i in range(2, sp.get_piece_size())))
    order = list(ordinary)
    np.random.default_rng(seed).shuffle(order)
    pieces = {"</s>": 0, "<unk>": 1, **{p: i + 2 for i, p in enumerate(order)}}
    pieces["<pad>"] = len(pieces)
    (directory / "source.spm").write_bytes(models[0])
    (directory / "target.spm").write_bytes(models[1])
    (directory / "vocab.json").write_text(json.dumps(pieces), encoding="utf-8")
    vocab = len(pieces)
    hf = transformers.MarianConfig(
        vocab_size=vocab,
        decoder_vocab_size=vocab,
        d_model=d_model,
        encoder_layers=layers[0],
        decoder_layers=layers[1],
        encoder_attention_heads=heads,
        decoder_attention_heads=heads,
        encoder_ffn_dim=ffn,
        decoder_ffn_dim=ffn,
        activation_function=activation,
        max_position_embeddings=256,
        pad_token_id=vocab - 1,
        decoder_start_token_id=vocab - 1,
        eos_token_id=0,
        forced_eos_token_id=None,
        bos_token_id=None,
        scale_embedding=scale,
        share_encoder_decoder_embeddings=share,
        tie_word_embeddings=tie,
        init_std=0.02,
        **config,
    )
    torch.manual_seed(seed)
    model = transformers.MarianMTModel(hf).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif "embed_positions" not in name:
                p.copy_(torch.randn_like(p) * (0.5 if p.ndim == 1 else 0.3))
        bias = torch.randn_like(model.final_logits_bias)
        bias[0, 0] += eos_bias  # EOS
        model.final_logits_bias.copy_(bias)
    if weights == "safetensors":
        model.save_pretrained(directory)
    else:
        hf.save_pretrained(directory)
        torch.save(model.state_dict(), directory / "pytorch_model.bin")
    return directory


def _import(source: Path, out: Path) -> Path:
    code = cli.import_main(
        ["--from", "marian", str(source), str(out), "--src-lang", "en", "--tgt-lang", "es"]
    )
    assert code == 0
    return out


def _hf(directory: Path):
    model = transformers.MarianMTModel.from_pretrained(directory).eval()
    tok = transformers.MarianTokenizer(
        str(directory / "source.spm"),
        str(directory / "target.spm"),
        str(directory / "vocab.json"),
    )
    return model, tok


SHAPES = {
    "joint-spm-shared": dict(d_model=32, layers=(2, 2), heads=4, ffn=64),
    "separate-spm-unscaled-relu": dict(
        d_model=16, layers=(1, 3), heads=2, ffn=48, joint_spm=False, scale=False, activation="relu"
    ),
    "separate-embeddings-untied-bin": dict(
        d_model=48,
        layers=(3, 1),
        heads=6,
        ffn=32,
        joint_spm=False,
        share=False,
        tie=False,
        activation="gelu_new",
        weights="bin",
    ),
    "shared-untied": dict(d_model=24, layers=(1, 1), heads=3, ffn=40, tie=False),
    # MarianConfig's default activation: the exact erf GELU (our gelu_erf)
    "joint-spm-gelu": dict(d_model=16, layers=(1, 2), heads=2, ffn=48, activation="gelu"),
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_logits_equal_pytorch(shape, tmp_path):
    import jax.numpy as jnp
    from conftest import unpacked_batch
    from flax import nnx

    from seq2seq.trained import load_trained

    source = make_marian(tmp_path / "hf", seed=len(shape), **SHAPES[shape])
    run = _import(source, tmp_path / "run")
    config, tokenizer, graphdef, params = load_trained(run)
    hf, hf_tok = _hf(source)
    pairs = PAIRS[:5]
    src = tokenizer.encode([s for s, _ in pairs])
    tgt = tokenizer.target.encode([t for _, t in pairs])
    # our tokenizer numbers pieces as Marian's does (source and target side)
    assert [list(x) for x in src] == hf_tok([s for s, _ in pairs])["input_ids"]
    assert [list(y) for y in tgt] == hf_tok(text_target=[t for _, t in pairs])["input_ids"]
    width = max(max(map(len, src)), max(map(len, tgt)))
    batch = unpacked_batch(src, tgt, width)
    ours = np.asarray(nnx.merge(graphdef, params)(batch, bos_id=tokenizer.bos_id))
    pad = tokenizer.pad_id
    input_ids = np.full((len(src), width), pad)
    labels = np.full((len(src), width), pad)
    for i, (x, y) in enumerate(zip(src, tgt)):
        input_ids[i, : len(x)], labels[i, : len(y)] = x, y
    decoder_input = np.concatenate([np.full((len(src), 1), pad), labels[:, :-1]], axis=1)
    with torch.no_grad():
        theirs = hf(
            input_ids=torch.tensor(input_ids),
            attention_mask=torch.tensor(input_ids != pad),
            decoder_input_ids=torch.tensor(decoder_input),
        ).logits.numpy()
    real = np.asarray(batch["tgt_segments"]) > 0
    assert real.sum() == sum(map(len, tgt))
    scale = np.abs(theirs[real]).max()
    assert scale > 1.0  # the logits are not all near 0
    np.testing.assert_allclose(ours[real], theirs[real], atol=1e-4, rtol=0)
    assert jnp.asarray(ours).dtype == jnp.float32


def _generate(hf, hf_tok, lines, limits, **settings) -> list[str]:
    out = []
    for line, limit in zip(lines, limits):
        ids = hf_tok([line], return_tensors="pt")
        with torch.no_grad():
            y = hf.generate(
                **ids,
                max_new_tokens=limit,
                forced_eos_token_id=0,
                bad_words_ids=[[hf.config.pad_token_id]],
                do_sample=False,
                **settings,
            )
        out.append(hf_tok.decode(y[0], skip_special_tokens=True))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("beam, alpha", [(1, 1.0), (4, 0.0)])
def test_translations_equal_generate(beam, alpha, tmp_path):
    """Greedy and beam search give ``generate``'s outputs. Beam search runs with α = 0: a
    hypothesis that reaches the length limit gets Hugging Face's forced EOS for free (its
    processor sets that log-probability to 0) but ours pays the model's log p(EOS), which a
    length bonus (α > 0) turns into different winners on these looping random models."""
    from seq2seq.config import load_config
    from seq2seq.data.tokenizer import load_pair
    from seq2seq.workdir import config_path

    source = make_marian(tmp_path / "hf", joint_spm=False, seed=3, eos_bias=2.0)
    run = _import(source, tmp_path / "run")
    config = load_config(config_path(run))
    assert config.decode.length_penalty == "plain" and config.decode.allow_unk
    tok = load_pair(config.tokenizer, run, src_lang="en", tgt_lang="es")
    d = config.decode
    limits = [int(np.ceil(d.max_len_a * len(x) + d.max_len_b)) for x in tok.encode(SENTENCES)]
    (tmp_path / "in.txt").write_text("".join(s + "\n" for s in SENTENCES), encoding="utf-8")
    out = tmp_path / "out.txt"
    args = ["--workdir", str(run), "--beam", str(beam), "--alpha", str(alpha)]
    assert (
        cli.translate_main([*args, "--input", str(tmp_path / "in.txt"), "--output", str(out)]) == 0
    )
    ours = out.read_text(encoding="utf-8").splitlines()
    hf, hf_tok = _hf(source)
    theirs = _generate(
        hf, hf_tok, SENTENCES, limits, num_beams=beam, length_penalty=alpha, early_stopping="never"
    )
    assert ours == theirs
    assert len(set(ours)) > 1


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(activation_function="quick_gelu"), "activation_function='quick_gelu'"),
        (dict(normalize_before=True), "normalize_before=true"),
        (dict(encoder_ffn_dim=64, decoder_ffn_dim=32), "encoder_ffn_dim=64 differs"),
        (dict(d_model=33), "d_model=33 is odd"),
    ],
)
def test_settings_we_cannot_represent_are_named(change, message):
    from seq2seq.marian import MarianImportError, model_config

    heads = dict(encoder_attention_heads=4, decoder_attention_heads=4)
    base = dict(transformers.MarianConfig(d_model=32, **heads).to_dict())
    base["activation_function"] = "swish"
    with pytest.raises(MarianImportError, match=message.replace("(", r"\(")):
        model_config({**base, **change})


def test_each_imported_activation_name_computes_our_function():
    """Every Hugging Face name the import accepts is, on [-8, 8], the function of the
    activation it becomes (float32, 1e-6), and the two GELUs differ more than that, so that
    mapping ``gelu`` (exact erf, MarianConfig's default) to the tanh form would fail."""
    from transformers.activations import ACT2FN

    from seq2seq.marian import ACTIVATIONS, model_config
    from seq2seq.model.layers import ACTIVATIONS as OURS

    x = np.linspace(-8.0, 8.0, 4001, dtype=np.float32)
    for name, ours in ACTIVATIONS.items():
        theirs = ACT2FN[name](torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(np.asarray(OURS[ours](x)), theirs, atol=1e-6, err_msg=name)
    gelus = np.asarray(OURS["gelu"](x)) - np.asarray(OURS["gelu_erf"](x))
    assert np.abs(gelus).max() > 1e-4
    assert model_config({"d_model": 16}).activation == "gelu_erf"  # the config's default


def test_missing_and_extra_weights_and_languages_are_named(tmp_path, capsys):
    from safetensors.numpy import load_file, save_file

    source = make_marian(tmp_path / "hf", d_model=16, layers=(1, 1), heads=2, ffn=16)
    out = str(tmp_path / "run")
    assert cli.import_main(["--from", "marian", str(source), out]) == 2
    assert "give --src-lang and --tgt-lang" in capsys.readouterr().err
    languages = ["--src-lang", "en", "--tgt-lang", "es"]
    weights = load_file(str(source / "model.safetensors"))
    weights["model.encoder.layers.0.extra.weight"] = np.zeros(3, np.float32)
    save_file(weights, str(source / "model.safetensors"))
    assert cli.import_main(["--from", "marian", str(source), out, *languages]) == 2
    assert "no place for: model.encoder.layers.0.extra.weight" in capsys.readouterr().err
    del weights["model.encoder.layers.0.extra.weight"]
    del weights["model.encoder.layers.0.fc1.bias"]
    save_file(weights, str(source / "model.safetensors"))
    assert cli.import_main(["--from", "marian", str(source), out, *languages]) == 2
    assert "missing tensor model.encoder.layers.0.fc1.bias" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # nothing written before the checks pass


def _hf_logprobs(hf, hf_tok, sources, targets) -> list[float]:
    """Σ log p(y_t | y_<t, x) of each target (EOS included) under the PyTorch model."""
    out = []
    for x, y in zip(sources, targets):
        enc = hf_tok([x], text_target=[y], return_tensors="pt")
        labels = enc.pop("labels")
        with torch.no_grad():
            logits = hf(**enc, labels=labels).logits
        logp = torch.log_softmax(logits.double(), -1)[0]
        out.append(float(logp.gather(-1, labels[0][:, None]).sum()))
    return out


def _hf_loss(source: Path, split: str, label_smoothing: float) -> tuple[float, float]:
    """PyTorch's per-token (NLL, label-smoothed loss) of the model in ``source`` on the pairs
    ``{split}.en`` → ``{split}.es``, tokenized by ``MarianTokenizer`` (EOS included, padding
    ignored), in float64."""
    from seq2seq.data.sources import read_lines

    hf, hf_tok = _hf(source)
    sources, targets = read_lines(f"{split}.en"), read_lines(f"{split}.es")
    enc = hf_tok(sources, text_target=targets, padding=True, return_tensors="pt")
    labels = enc.pop("labels")
    labels[labels == hf.config.pad_token_id] = -100
    with torch.no_grad():
        logits = hf(**enc, labels=labels).logits.double().flatten(0, 1)
    loss = torch.nn.functional.cross_entropy
    return tuple(  # type: ignore[return-value]
        float(loss(logits, labels.flatten(), ignore_index=-100, label_smoothing=eps))
        for eps in (0.0, label_smoothing)
    )


def _finetune_overrides(imported: Path, workdir: Path, corpus: dict[str, str]) -> list[str]:
    """A fine-tune of ``imported`` (``train.init_from``) on ``corpus``, every pair kept."""
    return [
        f"workdir={workdir}",
        f"train.init_from={imported}",
        f"data.train.path={corpus['train']}",
        f"data.dev.path={corpus['dev']}",
        f"data.test.path={corpus['test']}",
        "data.max_len=64",
        "data.max_tokens=512",
        "data.max_length_ratio=100",
    ]


def test_the_training_pipeline_gives_pytorchs_loss(tmp_path):
    """The imported model's teacher-forced loss over an epoch of the fine-tune's training
    batches (the token store's ids, packed as the loop gets them, the loop's loss function)
    is PyTorch's on the same sentences tokenized by ``MarianTokenizer`` (1e-4): the
    pipeline numbers pieces through the (shuffled) vocabulary map, ``</s>`` included."""
    import jax
    from tiny_run import write_corpus

    from seq2seq.config import load_config
    from seq2seq.run import prepare_run
    from seq2seq.trained import load_trained
    from seq2seq.training.batches import train_batch
    from seq2seq.training.step import make_eval_step

    source = make_marian(tmp_path / "hf", d_model=16, layers=(1, 1), heads=2, ffn=32, seed=5)
    imported = _import(source, tmp_path / "run")
    corpus = write_corpus(tmp_path / "corpus", train=24, dev=4, test=2)
    overrides = _finetune_overrides(imported, tmp_path / "finetune", corpus)
    config, data, _ = prepare_run(load_config(imported / "config.yaml", overrides))
    assert data.stats["train_pairs"] == 24
    _, _, graphdef, params = load_trained(imported)
    smoothing = config.train.label_smoothing
    assert smoothing > 0
    step = jax.jit(
        make_eval_step(graphdef, bos_id=data.tokenizer.bos_id, label_smoothing=smoothing)
    )
    totals = {"loss": 0.0, "nll": 0.0, "tokens": 0.0}
    for k in range(data.train.batches_in_epoch(0)):  # every training pair once
        batch = train_batch(data.train, k, 1)
        metrics = step(params, {key: value[0] for key, value in batch.items()})
        for key in totals:
            totals[key] += float(metrics[key])
    nll, loss = _hf_loss(source, corpus["train"], smoothing)
    assert nll > 1.0  # not a trivially small loss
    n = totals["tokens"]
    np.testing.assert_allclose(
        [totals["nll"] / n, totals["loss"] / n], [nll, loss], atol=1e-4, rtol=0
    )


@pytest.mark.slow
def test_fine_tuning_an_imported_run_lowers_its_dev_loss(tmp_path):
    """``seq2seq-train --config <imported>/config.yaml train.init_from=<imported>`` for 20
    steps: its first dev evaluation (after one step at 1/20 of the peak rate) is PyTorch's dev
    loss of the imported model (so the run scores the pieces as Marian numbers them), and the
    dev loss after 20 steps is lower, as ``metrics.jsonl`` records them."""
    from tiny_run import cli_env, run, train_command, write_corpus

    from seq2seq.training.metrics import read_metrics

    source = make_marian(tmp_path / "hf", d_model=16, layers=(1, 1), heads=2, ffn=32, seed=5)
    imported = _import(source, tmp_path / "run")
    corpus = write_corpus(tmp_path / "corpus", train=200, dev=16, test=2)
    finetune = tmp_path / "finetune"
    overrides = [
        *_finetune_overrides(imported, finetune, corpus),
        "train.steps=20",
        "train.warmup_steps=20",
        "train.eval_every=1",
        "train.log_every=10",
        "train.dev_bleu=false",
        "train.best_metric=loss",
        "decode.test_limit=1",
    ]
    proc = run(train_command(["--config", str(imported / "config.yaml"), *overrides]), cli_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    dev = {r["step"]: r["nll"] for r in read_metrics(finetune) if r["split"] == "dev"}
    assert sorted(dev) == list(range(1, 21))
    before, _ = _hf_loss(source, corpus["dev"], 0.0)
    assert abs(dev[1] - before) < 0.02
    assert dev[20] < before - 0.5


@pytest.mark.slow
def test_an_imported_run_works_with_every_command(tmp_path):
    """seq2seq-score gives PyTorch's log-probabilities; seq2seq-evaluate decodes as
    seq2seq-translate does; seq2seq-export to CTranslate2 scores the same pairs alike; and
    seq2seq-train with ``train.init_from`` fine-tunes the imported run (its tokenizer and
    vocabulary map kept)."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    from tiny_run import cli_env, run, train_command, write_corpus

    from seq2seq.data.sources import read_lines
    from seq2seq.trained import load_trained

    source = make_marian(tmp_path / "hf", d_model=16, layers=(1, 1), heads=2, ffn=32, seed=5)
    imported = _import(source, tmp_path / "run")
    corpus = write_corpus(tmp_path / "corpus", train=64, dev=8, test=4)
    src, tgt = corpus["test"] + ".en", corpus["test"] + ".es"
    sources, targets = read_lines(src), read_lines(tgt)
    hf, hf_tok = _hf(source)
    expected = _hf_logprobs(hf, hf_tok, sources, targets)

    scores = tmp_path / "scores.txt"
    args = ["--workdir", str(imported)]
    assert cli.score_main([*args, "--src", src, "--tgt", tgt, "--output", str(scores)]) == 0
    ours = [float(line.split(" ||| ")[1]) for line in scores.read_text().splitlines()]
    np.testing.assert_allclose(ours, expected, atol=2e-3)  # printed with 4 decimals

    hyps, translated = tmp_path / "eval.hyp", tmp_path / "translate.hyp"
    assert cli.evaluate_main([*args, "--src", src, "--ref", tgt, "--output", str(hyps)]) == 0
    assert cli.translate_main([*args, "--input", src, "--output", str(translated)]) == 0
    assert hyps.read_text() == translated.read_text()

    out = tmp_path / "ct2"
    assert cli.export_main([*args, "--to", "ctranslate2", str(out)]) == 0
    _, pair, _, _ = load_trained(imported)
    pieces = [[pair.source.id_to_piece(int(t)) for t in x[:-1]] for x in pair.encode(sources)]
    tgt_pieces = [
        [pair.target.id_to_piece(int(t)) for t in y[:-1]] for y in pair.target.encode(targets)
    ]
    scored = ctranslate2.Translator(str(out)).score_batch(pieces, tgt_pieces)
    np.testing.assert_allclose([sum(r.log_probs) for r in scored], expected, atol=1e-3)
    assert (out / "vocab.json").read_bytes() == (source / "vocab.json").read_bytes()
    weights = tmp_path / "st"
    assert cli.export_main([*args, "--to", "safetensors", str(weights)]) == 0
    from safetensors.numpy import load_file

    exported = load_file(str(weights / "model.safetensors"))
    np.testing.assert_array_equal(exported["logits_bias"], hf.final_logits_bias.numpy().reshape(-1))
    assert (weights / "vocab.json").is_file()

    finetune = tmp_path / "finetune"
    overrides = [
        f"workdir={finetune}",
        f"train.init_from={imported}",
        f"data.train.path={corpus['train']}",
        f"data.dev.path={corpus['dev']}",
        f"data.test.path={corpus['test']}",
        "data.max_len=32",
        "data.max_tokens=256",
        "train.steps=2",
        "train.warmup_steps=1",
        "train.log_every=1",
        "train.dev_bleu=false",
        "train.best_metric=loss",
        "decode.test_limit=2",
    ]
    proc = run(train_command(["--config", str(imported / "config.yaml"), *overrides]), cli_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (finetune / "vocab.json").read_bytes() == (source / "vocab.json").read_bytes()
    config, tuned, _, _ = load_trained(finetune)
    assert config.tokenizer.vocab_file == "vocab.json" and tuned.shared_ids
    assert (finetune / "test.json").is_file()
