"""The end-to-end matrix: every documented option value through the real commands.

Each chain runs what a researcher runs, in this order, through ``seq2seq.cli``:
``seq2seq-train`` (2 steps, checkpoint) → the same command with ``train.steps=4`` (resumes at
step 2) → ``seq2seq-translate`` → ``seq2seq-evaluate`` → ``seq2seq-average --last 2`` →
``seq2seq-translate`` with the average. The chains are chosen so that values that interact run
together: every position scheme with the KV cache and beam search (the final test decode and
``seq2seq-translate``), in float32 and in bfloat16; ``share_embeddings`` target/none with
separate vocabularies; every data format with a different tokenizer. ``CHAINS`` is checked
against the choice sets in the code and the README (``tests/test_matrix_coverage.py``), so a
new value without a chain fails; the values each chain ran are printed at the end of the
session.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest
from tiny_run import shipped_pairs, write_hub_dataset

from seq2seq import cli

pytestmark = [pytest.mark.slow, pytest.mark.matrix]

# What each chain sets; the remaining keys keep the tiny defaults of ``_overrides``.
# ``translate`` holds the seq2seq-translate options of the chain.
CHAINS: dict[str, dict] = {
    "sinusoidal": {
        "model.positions": "sinusoidal",
        "model.sinusoidal_layout": "interleaved",
        "model.norm": "post",
        "model.activation": "relu",
        "model.share_embeddings": "all",
        "model.dtype": "float32",
        "model.matmul_dtype": "float32",
        "model.attention": "dense",
        "tokenizer.joint": True,
        "tokenizer.model_type": "unigram",
        "format": "text",
        "decode.length_penalty": "gnmt",
        "decode.search": "beam",
        "decode.beam_size": 3,
        "train.dev_bleu": True,
        "train.best_metric": "bleu",
        "train.schedule": "linear",
        "tokenizer.character_coverage": 0.9995,
        "model.attention_dropout_rate": 0.1,
        "model.activation_dropout_rate": 0.1,
        "plot": True,
        "tokenizer.normalization": "nmt_nfkc",
        "translate": ["--beam", "2", "--nbest", "2"],
    },
    "learned": {
        "model.positions": "learned",
        "model.norm": "pre",
        "model.activation": "gelu",
        "model.share_embeddings": "target",
        "model.dtype": "bfloat16",
        "tokenizer.joint": True,
        "tokenizer.model_type": "bpe",
        "format": "tsv",
        "decode.length_penalty": "plain",
        "data.packing": False,
        "train.test_checkpoint": "last",
        "train.learning_rate": 1e-3,
        "train.b1": 0.8,
        "train.b2": 0.99,
        "train.weight_decay": 0.0,
        "train.clip_norm": 0.0,
        "train.label_smoothing": 0.0,
        "train.schedule": "rsqrt",
        "decode.min_length": 1,
        "translate": ["--alpha", "1.0", "--min-length", "2"],
    },
    "relative": {
        "model.positions": "relative",
        "model.norm": "post",
        "model.activation": "swiglu",
        "model.share_embeddings": "none",
        "model.dtype": "float32",
        "model.matmul_dtype": "bfloat16",  # bf16 operands of a float32 model, untied logits
        "tokenizer.joint": False,
        "tokenizer.model_type": "unigram",
        "format": "csv",
        "decode.length_penalty": "none",
        "train.grad_accum_steps": 2,
        "data.src_lang": "es",
        "data.tgt_lang": "en",  # the other direction
        "tokenizer.input_sentence_size": 200,
        "tokenizer.input_character_size": 8000,  # with the count: the smaller sample wins
        "train.max_skipped_steps": 0,
        "translate": ["--beam", "4", "--max-tokens", "64", "--matmul-dtype", "float32"],
    },
    "rope": {
        "model.positions": "rope",
        "model.norm": "pre",
        "model.activation": "geglu",
        "model.share_embeddings": "target",
        "model.dtype": "bfloat16",
        "tokenizer.joint": False,
        "tokenizer.model_type": "bpe",
        "format": "jsonl",
        "decode.length_penalty": "gnmt",
        "train.keep_best": False,
        "decode.search": "sampling",
        "decode.top_k": 5,  # the final test decode samples too
        "tokenizer.user_defined_symbols": "[<2es>]",
        "translate": [
            "--sampling",
            "--top-p",
            "0.9",
            "--top-k",
            "5",
            "--temperature",
            "0.8",
            "--seed",
            "1",
            "--nbest",
            "3",
        ],
    },
    "alibi": {
        "model.positions": "alibi",
        "model.norm": "post",
        "model.activation": "gelu_erf",
        "model.share_embeddings": "none",
        "model.dtype": "bfloat16",
        "tokenizer.joint": False,
        "tokenizer.model_type": "unigram",
        "format": "disk",
        "decode.length_penalty": "plain",
        "decode.search": "mbr",  # the test decode and seq2seq-evaluate: MBR of 4 samples
        "decode.mbr_size": 4,
        "decode.epsilon": 0.02,
        "translate": [
            "--search",
            "mbr",
            "--mbr-candidates",
            "beam",
            "--mbr-size",
            "3",
            "--nbest",
            "2",
            "--max-src-tokens",
            "8",
            "--on-long",
            "truncate",
        ],
    },
    "none": {
        "model.positions": "none",
        "model.norm": "pre",
        "model.activation": "swiglu",
        "model.share_embeddings": "all",
        "model.dtype": "float32",
        "tokenizer.joint": True,
        "tokenizer.model_type": "bpe",
        "format": "hub",
        "decode.length_penalty": "none",
        "train.patience": 5,
        "decode.search": "greedy",
        "translate": ["--search", "beam", "--beam", "3", "--nbest", "3"],
    },
    # light chains (seq2seq-train alone, its test decode is the beam search with the KV
    # cache): the position schemes of the chains above again, in the other dtype
    "sinusoidal-bf16": {
        "light": True,
        "model.positions": "sinusoidal",
        "model.dtype": "bfloat16",
        "model.norm": "pre",
        "model.share_embeddings": "target",
        "tokenizer.joint": False,
        "format": "text",
        "tokenizer.normalization": "nfkc",
        "train.ema_decay": 0.9,  # evaluation, best checkpoint and test decode on the EMA
    },
    "relative-bf16": {
        "light": True,
        "model.positions": "relative",
        "model.dtype": "bfloat16",
        "model.norm": "pre",
        "model.activation": "geglu",
        "format": "jsonl",
        "tokenizer.normalization": "nmt_nfkc_cf",
    },
    "none-bf16": {
        "light": True,
        "model.positions": "none",
        "model.dtype": "bfloat16",
        "model.norm": "post",
        "format": "tsv",
        "tokenizer.normalization": "nfkc_cf",
        "decode.allow_unk": True,
    },
    "learned-f32": {
        "light": True,
        "model.positions": "learned",
        "model.dtype": "float32",
        "model.activation": "geglu",
        "format": "csv",
        "tokenizer.joint": False,
        "model.share_embeddings": "target",
        "ready_models": True,
    },
    "rope-f32": {
        "light": True,
        "model.positions": "rope",
        "model.dtype": "float32",
        "model.norm": "post",
        "format": "disk",
        "tokenizer.normalization": "identity",
        "tokenizer.byte_fallback": True,
        "tokenizer.remove_extra_whitespaces": False,
        "tokenizer.vocab_size": 400,
    },
    "alibi-f32": {
        "light": True,
        "model.positions": "alibi",
        "model.dtype": "float32",
        "model.activation": "relu",
        "format": "hub",
        "ready_models": True,
    },
    # the options an imported Marian / OPUS-MT model needs (seq2seq-import, tests/test_marian.py
    # compares them with PyTorch's MarianMTModel), here trained and decoded from scratch
    "marian-options": {
        "light": True,
        "model.positions": "sinusoidal",
        "model.sinusoidal_layout": "halves",
        "model.dtype": "float32",
        "model.norm": "post",
        "model.activation": "swish",
        "model.scale_embeddings": False,
        "model.logits_bias": True,
        "model.norm_epsilon": 1e-5,
        "format": "text",
        "decode.length_penalty": "plain",
    },
    # blockwise attention (rows of 32 in blocks of 8 queries and 12 keys: a remainder); its
    # values equal dense's (tests/test_attention.py), here it runs through the entry point
    "rope-chunked": {
        "light": True,
        "model.positions": "rope",
        "model.dtype": "bfloat16",
        "model.attention": "chunked",
        "model.attention_q_block": 8,
        "model.attention_kv_block": 12,
        "format": "text",
    },
    # LoRA fine-tuning (train.lora_*, tests/test_lora.py): a parent run of the same model is
    # trained first (2 steps), the chain starts from it with train.init_from; translate,
    # evaluate and average read it with the adapters merged
    "lora": {
        "init_from": True,
        "model.positions": "sinusoidal",
        "model.dtype": "float32",
        "model.activation": "swiglu",
        "tokenizer.joint": True,
        "format": "text",
        "train.lora_rank": 2,
        "train.lora_alpha": 4.0,
        "train.lora_targets": "[attention,wi_gate,wo]",
        "train.learning_rate": 1e-2,
        "translate": ["--beam", "2"],
    },
}

TRAIN, DEV, TEST = 400, 16, 6
SENTENCES = [
    "I can't eat chicken.",
    "",
    "Tom is here and he is very, very happy today.",
    "Where is the station?",
]
RAN: dict[str, set] = {}  # option → values that ran (printed by conftest at the end)


def _write_data(directory: Path, fmt: str) -> list[str]:
    """The shipped pairs (train/dev/test slices) in format ``fmt``; the data.* overrides."""
    splits = {
        "train": shipped_pairs(0, TRAIN),
        "dev": shipped_pairs(TRAIN, DEV),
        "test": shipped_pairs(TRAIN + DEV, TEST),
    }
    directory.mkdir(parents=True, exist_ok=True)
    out = [f"data.{s}.format={fmt}" for s in splits]
    if fmt == "text":
        for split, pairs in splits.items():
            for i, lang in enumerate(("en", "es")):
                (directory / f"{split}.{lang}").write_text(
                    "".join(p[i] + "\n" for p in pairs), encoding="utf-8"
                )
            out.append(f"data.{split}.path={directory / split}")
    elif fmt in ("tsv", "csv"):
        for split, pairs in splits.items():
            path = directory / f"{split}.{fmt}"
            with open(path, "w", encoding="utf-8", newline="") as f:
                writer = csv.writer(
                    f,
                    delimiter="\t" if fmt == "tsv" else ",",
                    quoting=csv.QUOTE_NONE if fmt == "tsv" else csv.QUOTE_MINIMAL,
                    escapechar="\\" if fmt == "tsv" else None,
                )
                writer.writerow(["en", "es"])
                writer.writerows(pairs)
            out.append(f"data.{split}.path={path}")
    elif fmt == "jsonl":
        for split, pairs in splits.items():
            path = directory / f"{split}.jsonl"
            path.write_text(
                "".join(
                    json.dumps({"translation": {"en": s, "es": t}}, ensure_ascii=False) + "\n"
                    for s, t in pairs
                ),
                encoding="utf-8",
            )
            out.append(f"data.{split}.path={path}")
    elif fmt == "disk":
        from datasets import Dataset, DatasetDict

        DatasetDict(
            {
                split: Dataset.from_dict({"translation": [{"en": s, "es": t} for s, t in pairs]})
                for split, pairs in splits.items()
            }
        ).save_to_disk(str(directory / "ds"))
        out += [f"data.{s}.path={directory / 'ds'}" for s in splits]
        out += [f"data.{s}.split={s}" for s in splits]
    elif fmt == "hub":  # a local dataset with the hub layout: config "en-es", named splits
        path = write_hub_dataset(
            directory / "hub",
            "en-es",
            {"train": splits["train"], "validation": splits["dev"], "test": splits["test"]},
            "en",
            "es",
        )
        out += [f"data.{s}.path={path}" for s in splits] + [f"data.{s}.name=en-es" for s in splits]
        out += ["data.train.split=train", "data.dev.split=validation", "data.test.split=test"]
    else:
        raise AssertionError(fmt)
    return out


def _overrides(workdir: Path, chain: dict) -> list[str]:
    keys = {
        "tokenizer.vocab_size": 200,
        "model.d_model": 16,
        "model.num_heads": 2,
        "model.d_ff": 32,
        "model.num_encoder_layers": 1,
        "model.num_decoder_layers": 1,
        "data.max_len": 32,
        "data.max_tokens": 256,
        "train.warmup_steps": 2,
        "train.log_every": 1,
        "train.eval_every": 2,
        "train.checkpoint_every": 2,
        "train.dev_bleu": False,
        "train.best_metric": "loss",
        "train.bleu_subset": 8,
        "decode.beam_size": 2,
        "decode.max_len_a": 1.0,
        "decode.max_len_b": 4,
    }
    keys.update({k: v for k, v in chain.items() if "." in k})
    if not keys.get("tokenizer.joint", True) and keys.get("model.share_embeddings", "all") == "all":
        keys["model.share_embeddings"] = "target"
    for key, value in keys.items():
        RAN.setdefault(key, set()).add(
            str(value).lower() if isinstance(value, bool) else str(value)
        )
    return [f"workdir={workdir}"] + [
        f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in keys.items()
    ]


def _ready_models(directory: Path, joint: bool) -> list[str]:
    """SentencePiece models trained outside the run, as ``tokenizer.*model_file`` overrides."""
    from seq2seq.config import TokenizerConfig
    from seq2seq.data.tokenizer import train_or_load

    pairs = shipped_pairs(0, TRAIN)
    config = TokenizerConfig(vocab_size=200)
    if joint:
        tok = train_or_load([t for p in pairs for t in p], config, directory, name="ready")
        RAN.setdefault("tokenizer.model_file", set()).add("a ready .model")
        return [f"tokenizer.model_file={tok.path}"]
    src = train_or_load([p[0] for p in pairs], config, directory, name="ready.en")
    tgt = train_or_load([p[1] for p in pairs], config, directory, name="ready.es")
    RAN.setdefault("tokenizer.src_model_file / tgt_model_file", set()).add("ready .model files")
    return [f"tokenizer.src_model_file={src.path}", f"tokenizer.tgt_model_file={tgt.path}"]


def _train_steps(workdir: Path) -> list[int]:
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in records if r["split"] == "train"]


def _check_translations(path: Path, args: list[str], n: int) -> None:
    lines = path.read_text(encoding="utf-8").splitlines()
    nbest = int(args[args.index("--nbest") + 1]) if "--nbest" in args else 1
    if nbest == 1:
        assert len(lines) == n and lines[1] == ""  # the empty line stays empty and in place
        return
    rows = [line.split(" ||| ") for line in lines]
    assert all(len(r) == 4 for r in rows)
    # up to nbest rows per line in line order, best first (samples too); the empty line: one
    # empty row
    ids = [int(r[0]) for r in rows]
    assert ids == sorted(ids) and set(ids) == set(range(n)) and len(rows) > n
    assert [r[1] for r in rows if r[0] == "1"] == [""]
    for i in range(n):
        scores = [float(r[3]) for r in rows if int(r[0]) == i]
        assert 1 <= len(scores) <= nbest and scores == sorted(scores, reverse=True)


@pytest.mark.parametrize("name", list(CHAINS))
def test_chain(name, tmp_path, capsys):
    chain = CHAINS[name]
    fmt = chain["format"]
    RAN.setdefault("data.*.format", set()).add(fmt)
    workdir = tmp_path / "run"
    overrides = _overrides(workdir, chain) + _write_data(tmp_path / "data", fmt)
    if chain.get(
        "ready_models"
    ):  # tokenizer.(src_|tgt_)model_file: SentencePiece models made apart
        overrides += _ready_models(tmp_path / "spm", chain.get("tokenizer.joint", True))
    if chain.get("init_from"):  # a parent of the same model without the train.lora_* keys
        parent = tmp_path / "parent"
        plain = {k: v for k, v in chain.items() if not k.startswith("train.lora_")}
        parent_overrides = _overrides(parent, plain) + _write_data(tmp_path / "data", fmt)
        assert cli.train_main(parent_overrides + ["train.steps=2"]) == 0, capsys.readouterr().err
        overrides.append(f"train.init_from={parent}")
        RAN.setdefault("train.init_from", set()).add("a trained run")

    # train 2 steps (checkpoint), then the same command with more steps resumes at 2
    assert cli.train_main(overrides + ["train.steps=2"]) == 0, capsys.readouterr().err
    if chain.get("light"):
        summary = json.loads((workdir / "test.json").read_text())
        assert summary["step"] == 2 and summary["test_sentences"] == TEST
        assert len((workdir / "test.hyp").read_text(encoding="utf-8").splitlines()) == TEST
        return
    spm = sorted(workdir.glob("spm*.model"))
    assert len(spm) == (1 if chain["tokenizer.joint"] else 2)
    spm_mtimes = [p.stat().st_mtime_ns for p in spm]
    assert json.loads((workdir / "test.json").read_text())["step"] == 2
    assert cli.train_main(overrides + ["train.steps=4"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    summary = json.loads((workdir / "test.json").read_text())
    assert summary["step"] == 4 and summary["test_sentences"] == TEST
    assert _train_steps(workdir) == [1, 2, 3, 4]  # resumed, not started over
    assert "test BLEU" in out and "nrefs:1|case:mixed" in out
    assert (workdir / "checkpoints" / "2").is_dir() and (workdir / "checkpoints" / "4").is_dir()
    assert [p.stat().st_mtime_ns for p in spm] == spm_mtimes  # the tokenizer was reused
    if chain.get("train.lora_rank"):  # only the adapters trained: Adam moments for them alone
        trained = summary["trainable_parameters"]
        assert 0 < trained < summary["parameters"] / 5
        assert summary["optimizer_moment_bytes"] == 8 * trained

    # translate with the chain's options (standard input for one chain, a file for the others)
    args = chain["translate"]
    RAN.setdefault("seq2seq-translate", set()).add(" ".join(args))
    source = tmp_path / "in.en"
    source.write_text("".join(s + "\n" for s in SENTENCES), encoding="utf-8")
    hyp = tmp_path / "out.es"
    assert (
        cli.translate_main(
            ["--workdir", str(workdir), "--input", str(source), "--output", str(hyp), *args]
        )
        == 0
    ), capsys.readouterr().err
    _check_translations(hyp, args, len(SENTENCES))

    # evaluate: the run's own test split (read again in its format), and a file pair
    assert cli.evaluate_main(["--workdir", str(workdir)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert f"{TEST} sentences in" in out
    # the checkpoint and the score of training's own test decode
    assert (
        f"BLEU = {summary['test_bleu']:.2f} " in out
        and f"chrF = {summary['test_chrf']:.2f} " in out
    )
    refs = tmp_path / "ref.es"
    refs.write_text("".join(s + "\n" for s in SENTENCES), encoding="utf-8")
    assert (
        cli.evaluate_main(
            [
                "--workdir",
                str(workdir),
                "--src",
                str(source),
                "--ref",
                str(refs),
                "--output",
                str(tmp_path / "eval.hyp"),
            ]
        )
        == 0
    )
    assert re.search(r"BLEU = \d", capsys.readouterr().out)

    if chain.get("plot"):
        assert cli.plot_main(["--workdir", str(workdir)]) == 0
        assert (workdir / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        RAN.setdefault("seq2seq-plot", set()).add("--workdir")

    # average the last two checkpoints and translate with the average
    assert cli.average_main(["--workdir", str(workdir), "--last", "2"]) == 0
    capsys.readouterr()
    averaged = tmp_path / "out.avg.es"
    assert (
        cli.translate_main(
            [
                "--workdir",
                str(workdir / "average"),
                "--input",
                str(source),
                "--output",
                str(averaged),
                *args,
            ]
        )
        == 0
    ), capsys.readouterr().err
    _check_translations(averaged, args, len(SENTENCES))
