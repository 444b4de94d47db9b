#!/usr/bin/env python3
"""Translation quality at the same training time: our default config against a same-size
Hugging Face MarianMT (PyTorch) with a plain recipe, on several corpora (issue 21).

Run as ``scripts/compare.py --quality`` (same optional extra ``compare``). For each proxy corpus:

1. ``seq2seq-train --config CONFIG`` with only the data paths changed (plus ``--set`` overrides),
   in a subprocess; its ``test.json`` gives the test BLEU/chrF and the training seconds.
2. MarianMT of the same sizes (read from the run's ``config.yaml``), on the same SentencePiece
   pieces (the run's ``spm.model``), trained for as many seconds as our training loop took
   (``train_seconds``; our dev evaluations are not counted against either side), and never
   less than ``--peer-seconds`` (900: the issue's 15 minutes, so that a fast step of ours on
   one corpus does not shorten the peer's budget below it): Adam
   (0.9, 0.98, eps 1e-9), peak learning rate 1e-3 after 400 linear warmup steps, then inverse
   square root, label smoothing 0.1, dropout 0.1, gradient norm clipped at 1, batches of at most
   2,000 padded tokens (source + target rows of similar length), post-norm as Marian is.
   Beam 4 on the test split (HF ``generate``; length budget ``1.2 · source + 5`` per batch).
3. Both scored by sacreBLEU on the detokenised test split, with signatures.

Proxies (never tune on one test set alone):

* ``full``: the shipped corpus, ``data/tatoeba-en-es`` (137k training pairs);
* ``small``: its 20k-pair ``small/`` split (``--small-dir``; by default
  ``../shared/data/tatoeba-en-es/small`` next to the checkout);
* ``long``: every split of the shipped corpus with 2–4 consecutive pairs joined into one
  (about 20–30 words per side; group sizes drawn with seed 0).

The corpora and runs go to ``--out`` (``runs/quality``); the table to stdout, ``--json`` and
``--docs`` (between the ``compare.py quality`` markers). Not run in CI: each proxy trains
twice, our side for the config's budget (the shipped preset: ``train.time_budget`` 780 s) and
the peer for at least ``--peer-seconds`` (about 30 minutes per proxy on 2 cores).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PROXIES = ("full", "small", "long")
SPLITS = ("train", "dev", "test")
DOCS_BEGIN = "<!-- compare.py quality: begin -->"
DOCS_END = "<!-- compare.py quality: end -->"
# The peer's plain recipe (issue 21).
RECIPE = dict(
    learning_rate=1e-3,
    warmup_steps=400,
    max_tokens=2000,
    label_smoothing=0.1,
    dropout=0.1,
    clip=1.0,
    beam_size=4,
    max_len=64,
)


# -- the proxy corpora -----------------------------------------------------------------------------


def read_lines(path: Path) -> list[str]:
    """Lines of ``path`` or ``path.gz`` (the shipped corpus is gzipped)."""
    if not path.exists() and path.with_name(path.name + ".gz").exists():
        path = path.with_name(path.name + ".gz")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        text = f.read()
    if not text:
        return []
    return text[:-1].split("\n") if text.endswith("\n") else text.split("\n")


def join_consecutive(
    src: list[str], tgt: list[str], seed: int, sizes: tuple[int, ...] = (2, 3, 4)
) -> tuple[list[str], list[str]]:
    """Join runs of consecutive pairs into one pair: run lengths drawn from ``sizes`` with
    ``seed``; each side joined with a space, so the two sides stay aligned.

    Raises:
      ValueError: the sides have different line counts.
    """
    if len(src) != len(tgt):
        raise ValueError(f"{len(src)} source lines but {len(tgt)} target lines")
    rng = random.Random(seed)
    out_src, out_tgt, i = [], [], 0
    while i < len(src):
        n = rng.choice(sizes)
        out_src.append(" ".join(src[i : i + n]))
        out_tgt.append(" ".join(tgt[i : i + n]))
        i += n
    return out_src, out_tgt


def write_proxy(name: str, out: Path, small_dir: Path, langs: tuple[str, str]) -> Path:
    """Write proxy ``name``'s splits as ``out/{split}.{lang}`` text files; returns ``out``."""
    shipped = ROOT / "data" / "tatoeba-en-es"
    out.mkdir(parents=True, exist_ok=True)
    for i, split in enumerate(SPLITS):
        base = small_dir if name == "small" else shipped
        sides = [read_lines(base / f"{split}.{lang}") for lang in langs]
        if name == "long":
            sides = list(join_consecutive(sides[0], sides[1], seed=i))
        for lang, lines in zip(langs, sides):
            (out / f"{split}.{lang}").write_text("".join(s + "\n" for s in lines), encoding="utf-8")
    return out


def words_per_line(path: Path) -> float:
    lines = path.read_text(encoding="utf-8").splitlines()
    return sum(len(s.split()) for s in lines) / max(len(lines), 1)


# -- ours ------------------------------------------------------------------------------------------


def train_ours(config: str, data: Path, workdir: Path, overrides: list[str]) -> dict[str, Any]:
    """``python -m seq2seq train`` on ``data``; returns its ``test.json``.

    Raises:
      RuntimeError: the run failed (its last output lines quoted).
    """
    args = [
        sys.executable,
        "-m",
        "seq2seq",
        "train",
        "--config",
        config,
        f"workdir={workdir}",
        *[f"data.{s}.format=text" for s in SPLITS],
        *[f"data.{s}.path={data / s}" for s in SPLITS],
        *overrides,
    ]
    print("  " + " ".join(args[2:]), flush=True)
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-20:])
        raise RuntimeError(f"seq2seq-train failed (exit {proc.returncode}):\n{tail}")
    return json.loads((workdir / "test.json").read_text(encoding="utf-8"))


# -- the peer --------------------------------------------------------------------------------------


def peer_batches(pairs: list[tuple[list[int], list[int]]], max_tokens: int, seed: int):
    """Batches of pair indices, rows of similar length, at most ``max_tokens`` padded tokens of
    the longer side per batch; the batch order is shuffled with ``seed``."""
    order = sorted(range(len(pairs)), key=lambda i: (len(pairs[i][0]), len(pairs[i][1])))
    batches, current, longest = [], [], 0
    for i in order:
        n = max(len(pairs[i][0]), len(pairs[i][1]))
        if current and max(longest, n) * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, n)
    if current:
        batches.append(current)
    random.Random(seed).shuffle(batches)
    return batches


def peer_optimizer(model):
    """The peer's Adam (betas 0.9/0.98, eps 1e-9) with RECIPE's linear warmup then 1/√step."""
    import torch

    opt = torch.optim.Adam(
        model.parameters(), lr=RECIPE["learning_rate"], betas=(0.9, 0.98), eps=1e-9
    )
    warmup = RECIPE["warmup_steps"]
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / warmup, math.sqrt(warmup / (s + 1)))
    )
    return opt, sched


def pad_rows(seqs: list[list[int]], pad: int, first: int | None = None):
    """int64 ``[len(seqs), width]`` of the sequences (``first`` prepended), padded with ``pad``."""
    import torch

    width = max(len(s) for s in seqs) + (first is not None)
    out = torch.full((len(seqs), width), pad, dtype=torch.long)
    for r, s in enumerate(seqs):
        s = ([first] if first is not None else []) + s
        out[r, : len(s)] = torch.tensor(s)
    return out


def peer_update(model, opt, sched, pairs, pad: int, start: int):
    """One optimizer step of the peer on ``pairs`` (source ids, target ids with EOS): teacher
    forcing from ``start``, label-smoothed cross-entropy without padding, gradient clipping;
    returns the loss (float) and the padded targets (int64 ``[batch, length]``)."""
    import torch
    import torch.nn.functional as F

    src = pad_rows([s for s, _ in pairs], pad)
    tgt = pad_rows([t for _, t in pairs], pad)
    dec_in = pad_rows([t[:-1] for _, t in pairs], pad, first=start)
    logits = model(input_ids=src, attention_mask=src != pad, decoder_input_ids=dec_in).logits
    loss = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]),
        tgt.reshape(-1),
        ignore_index=pad,
        label_smoothing=RECIPE["label_smoothing"],
    )
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), RECIPE["clip"])
    opt.step()
    sched.step()
    return loss.item(), tgt


def train_peer(
    run: Path, data: Path, langs: tuple[str, str], seconds: float, threads: int, seed: int = 0
) -> dict[str, Any]:
    """Train MarianMT of the run's sizes for ``seconds`` and translate the test split."""
    import sacrebleu
    import sentencepiece as spm
    import torch
    import transformers
    import yaml

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    cfg = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8"))
    m = cfg["model"]
    sp = spm.SentencePieceProcessor(model_file=str(run / "spm.model"))
    pad, bos, eos = sp.pad_id(), sp.bos_id(), sp.eos_id()
    src_lang, tgt_lang = langs
    limit = RECIPE["max_len"]

    def encode(lines):
        return [sp.encode(s)[: limit - 1] + [eos] for s in lines]

    train = list(
        zip(
            encode(read_lines(data / f"train.{src_lang}")),
            encode(read_lines(data / f"train.{tgt_lang}")),
        )
    )
    model = transformers.MarianMTModel(
        transformers.MarianConfig(
            vocab_size=sp.get_piece_size(),
            d_model=m["d_model"],
            encoder_layers=m["num_encoder_layers"],
            decoder_layers=m["num_decoder_layers"],
            encoder_attention_heads=m["num_heads"],
            decoder_attention_heads=m["num_heads"],
            encoder_ffn_dim=m["d_ff"],
            decoder_ffn_dim=m["d_ff"],
            activation_function="relu",
            dropout=RECIPE["dropout"],
            attention_dropout=0.0,
            activation_dropout=0.0,
            max_position_embeddings=4 * limit,
            scale_embedding=True,
            pad_token_id=pad,
            eos_token_id=eos,
            decoder_start_token_id=bos,
            forced_eos_token_id=None,
        )
    )
    opt, sched = peer_optimizer(model)

    def rows(seqs, first=None):
        return pad_rows(seqs, pad, first)

    model.train()
    start, steps, epoch, tokens = time.perf_counter(), 0, 0, 0
    while time.perf_counter() - start < seconds:
        for batch in peer_batches(train, RECIPE["max_tokens"], seed + epoch):
            loss, tgt = peer_update(model, opt, sched, [train[i] for i in batch], pad, bos)
            steps, tokens = steps + 1, tokens + int((tgt != pad).sum())
            if steps % 100 == 0:
                print(f"  peer step {steps}: loss {loss:.3f}", flush=True)
            if time.perf_counter() - start >= seconds:
                break
        epoch += 1
    train_seconds = time.perf_counter() - start

    model.eval()
    sources = read_lines(data / f"test.{src_lang}")
    refs = read_lines(data / f"test.{tgt_lang}")
    ids = encode(sources)
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    hyps = [""] * len(ids)
    t0 = time.perf_counter()
    with torch.no_grad():
        for k in range(0, len(order), 64):
            chunk = order[k : k + 64]
            src = rows([ids[i] for i in chunk])
            out = model.generate(
                input_ids=src,
                attention_mask=src != pad,
                num_beams=RECIPE["beam_size"],
                max_new_tokens=int(1.2 * src.shape[1] + 5),
                decoder_start_token_id=bos,
                eos_token_id=eos,
                pad_token_id=pad,
            )
            for i, row in zip(chunk, out.tolist()):
                hyps[i] = sp.decode([t for t in row if t not in (pad, bos, eos)])
    decode_seconds = time.perf_counter() - t0
    bleu = sacrebleu.metrics.BLEU()
    chrf = sacrebleu.metrics.CHRF()
    return {
        "test_bleu": bleu.corpus_score(hyps, [refs]).score,
        "test_chrf": chrf.corpus_score(hyps, [refs]).score,
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
        "train_seconds": train_seconds,
        "decode_seconds": decode_seconds,
        "steps": steps,
        "target_tokens_seen": tokens,
        "examples": [{"source": s, "hypothesis": h} for s, h in list(zip(sources, hyps))[:3]],
    }


# -- the table -------------------------------------------------------------------------------------


def markdown(result: dict[str, Any]) -> str:
    meta = result["meta"]
    lines = [
        f"Quality at the same training time, the peer's at least "
        f"{meta.get('peer_seconds_at_least', 0):.0f} s ({meta['date']}; {meta['machine']}; "
        f"config `{meta['config']}`"
        f"{'; ' + ' '.join(meta['overrides']) if meta['overrides'] else ''}).",
        "",
        "| proxy | pairs | words/line | ours s | peer s | ours BLEU | ours chrF | peer BLEU | "
        "peer chrF | ours − peer BLEU | ours steps | peer steps |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for name, r in result["proxies"].items():
        o, p = r["ours"], r["peer"]
        lines.append(
            f"| {name} | {r['train_pairs']:,} | {r['words_per_line']:.1f} | "
            f"{o['train_seconds']:.0f} | {p['train_seconds']:.0f} | "
            f"{o['test_bleu']:.2f} | {o['test_chrf']:.2f} | "
            f"{p['test_bleu']:.2f} | {p['test_chrf']:.2f} | "
            f"{o['test_bleu'] - p['test_bleu']:+.2f} | {o['step']} | {p['steps']} |"
        )
    first = next(iter(result["proxies"].values()), None)
    if first:
        lines += [
            "",
            f"Signatures: `{first['ours']['bleu_signature']}`, "
            f"`{first['ours']['chrf_signature']}` (both sides).",
        ]
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("--quality")
    g.add_argument(
        "--proxies", default=",".join(PROXIES), help="comma-separated: full, small, long"
    )
    g.add_argument("--config", default="configs/tatoeba_en_es.yaml", help="our config file")
    g.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an override of our config (repeatable; the peer follows the run's model sizes)",
    )
    g.add_argument(
        "--small-dir",
        default=str(ROOT.parent / "shared" / "data" / "tatoeba-en-es" / "small"),
        help="the 20k-pair split of the shipped corpus (plain text)",
    )
    g.add_argument(
        "--peer-seconds",
        type=float,
        default=900.0,
        help="the peer trains for our training seconds but at least this long (default 900)",
    )
    g.add_argument("--out", default="runs/quality", help="corpora and runs go here")
    g.add_argument("--limit-lines", type=int, default=0, help=argparse.SUPPRESS)


def run(args: argparse.Namespace, machine: str, write_docs: Callable[..., None]) -> int:
    """The comparison; ``write_docs(path, table, begin, end)`` is ``compare.write_docs``."""
    proxies = [s for s in args.proxies.split(",") if s]
    for s in proxies:
        if s not in PROXIES:
            print(f"unknown proxy {s!r}; choose from {', '.join(PROXIES)}", file=sys.stderr)
            return 2
    if "small" in proxies and not (Path(args.small_dir) / "train.en").exists():
        print(f"--small-dir {args.small_dir}: no train.en there", file=sys.stderr)
        return 2
    langs = ("en", "es")
    out = Path(args.out).resolve()
    threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    result: dict[str, Any] = {
        "meta": {
            "date": time.strftime("%Y-%m-%d %H:%M %Z"),
            "machine": machine,
            "config": args.config,
            "overrides": args.set,
            "recipe": RECIPE,
            "peer_seconds_at_least": args.peer_seconds,
            "threads": threads,
        },
        "proxies": {},
    }
    for name in proxies:
        print(f"proxy {name}", flush=True)
        data = write_proxy(name, out / name / "data", Path(args.small_dir), langs)
        if args.limit_lines:  # the smoke test: a few lines of each split
            for f in data.iterdir():
                f.write_text(
                    "".join(line + "\n" for line in read_lines(f)[: args.limit_lines]),
                    encoding="utf-8",
                )
        ours = train_ours(args.config, data, out / name / "ours", args.set)
        print(f"  ours: BLEU {ours['test_bleu']:.2f} in {ours['train_seconds']:.0f} s", flush=True)
        budget = max(ours["train_seconds"], args.peer_seconds)
        peer = train_peer(out / name / "ours", data, langs, budget, threads or 1)
        print(f"  peer: BLEU {peer['test_bleu']:.2f} in {peer['train_seconds']:.0f} s", flush=True)
        result["proxies"][name] = {
            "train_pairs": len(read_lines(data / "train.en")),
            "words_per_line": words_per_line(data / "train.en"),
            "ours": {k: v for k, v in ours.items() if k not in ("examples", "data")},
            "peer": peer,
        }
    table = markdown(result)
    print("\n" + table)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
        print(f"\nwrote {args.json}")
    if args.docs:
        write_docs(Path(args.docs), table, DOCS_BEGIN, DOCS_END)
        print(f"updated the quality table in {args.docs}")
    return 0
