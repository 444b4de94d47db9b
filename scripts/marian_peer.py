#!/usr/bin/env python3
"""A trained Marian checkpoint through ``seq2seq-import``: same translations as ``generate``?

1. SentencePiece model (Marian's specials: ``<unk>`` 0, ``</s>`` 1; ``vocab.json`` numbers
   ``</s>`` 0, ``<unk>`` 1, the pieces, ``<pad>`` last) on the shipped training split.
2. A Hugging Face ``MarianMTModel`` of the preset's sizes (d_model 256, 3+3 layers, 4 heads,
   d_ff 1024, ``swish``, scaled, shared embeddings) trained for ``--seconds`` with the plain
   recipe of ``scripts/compare_quality.py`` (the same-size peer of ``compare.py --quality``),
   saved with ``save_pretrained`` beside ``source.spm``/``target.spm``/``vocab.json``.
3. ``seq2seq-import --from marian`` of that directory.
4. The first ``--limit`` test sentences translated by both: ``generate`` (beam 4, length
   penalty α, ``early_stopping="never"``, PAD banned, EOS forced at the limit) and our
   ``Translator`` on the imported run (beam 4, ``plain`` α), with the same per-sentence
   limit ``ceil(a·|x| + b)``; the share of identical outputs and both sacreBLEU scores.

Needs the ``compare`` extra (torch, transformers). Not run in CI (minutes of training).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/marian_peer", help="checkpoint, run and result")
    p.add_argument("--seconds", type=float, default=300.0, help="peer training time")
    p.add_argument("--limit", type=int, default=500, help="test sentences compared")
    p.add_argument("--alpha", type=float, default=1.0, help="length-penalty exponent")
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)

    import numpy as np
    import sacrebleu
    import sentencepiece as spm
    import torch
    import transformers
    from compare_quality import (
        RECIPE,
        pad_rows,
        peer_batches,
        peer_optimizer,
        peer_update,
        read_lines,
    )

    from seq2seq.config import replace
    from seq2seq.marian import import_marian
    from seq2seq.trained import load_trained
    from seq2seq.translation import Translator

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    out = Path(a.out)
    hf_dir = out / "hf"
    hf_dir.mkdir(parents=True, exist_ok=True)
    data = ROOT / "data" / "tatoeba-en-es"
    train_src, train_tgt = read_lines(data / "train.en"), read_lines(data / "train.es")
    blob = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(train_src + train_tgt),
        model_writer=blob,
        vocab_size=8000,
        input_sentence_size=200_000,
        shuffle_input_sentence=True,
        unk_id=0,
        eos_id=1,
        bos_id=-1,
        pad_id=-1,
        num_threads=a.threads,
        minloglevel=2,
    )
    sp = spm.SentencePieceProcessor()
    sp.LoadFromSerializedProto(blob.getvalue())
    vocab = {"</s>": 0, "<unk>": 1}
    for i in range(sp.get_piece_size()):
        vocab.setdefault(sp.id_to_piece(i), len(vocab))
    vocab["<pad>"] = pad = len(vocab)
    for name in ("source.spm", "target.spm"):
        (hf_dir / name).write_bytes(blob.getvalue())
    (hf_dir / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    limit = RECIPE["max_len"]

    def encode(lines):
        return [
            [vocab.get(x, 1) for x in sp.encode(s, out_type=str)][: limit - 1] + [0] for s in lines
        ]

    train = list(zip(encode(train_src), encode(train_tgt)))
    config = transformers.MarianConfig(
        vocab_size=len(vocab),
        d_model=256,
        encoder_layers=3,
        decoder_layers=3,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=1024,
        decoder_ffn_dim=1024,
        activation_function="swish",
        dropout=RECIPE["dropout"],
        max_position_embeddings=512,
        scale_embedding=True,
        pad_token_id=pad,
        eos_token_id=0,
        decoder_start_token_id=pad,
        forced_eos_token_id=0,
        bos_token_id=None,
    )
    model = transformers.MarianMTModel(config)
    opt, sched = peer_optimizer(model)

    def rows(seqs, first=None):
        return pad_rows(seqs, pad, first)

    model.train()
    start, steps, epoch = time.perf_counter(), 0, 0
    while time.perf_counter() - start < a.seconds:
        for batch in peer_batches(train, RECIPE["max_tokens"], epoch):
            loss, _ = peer_update(model, opt, sched, [train[i] for i in batch], pad, pad)
            steps += 1
            if steps % 100 == 0:
                print(f"peer step {steps}: loss {loss:.3f}", flush=True)
            if time.perf_counter() - start >= a.seconds:
                break
        epoch += 1
    train_seconds = time.perf_counter() - start
    model.eval()
    model.save_pretrained(hf_dir)

    run = import_marian(hf_dir, out / "run", src_lang="en", tgt_lang="es", overwrite=True)
    cfg, pair, graphdef, params = load_trained(run)
    decode = replace(cfg.decode, beam_size=4, alpha=a.alpha, length_penalty="plain")
    sources = read_lines(data / "test.en")[: a.limit]
    refs = read_lines(data / "test.es")[: a.limit]
    t0 = time.perf_counter()
    ours = [h[0].text for h in Translator(graphdef, params, pair, decode).translate(sources)]
    ours_seconds = time.perf_counter() - t0

    ids = pair.encode(sources)
    limits = [int(np.ceil(decode.max_len_a * len(x) + decode.max_len_b)) for x in ids]
    groups: dict[int, list[int]] = {}
    for i, n in enumerate(limits):
        groups.setdefault(n, []).append(i)
    theirs = [""] * len(sources)
    t0 = time.perf_counter()
    with torch.no_grad():
        for n, members in sorted(groups.items()):
            for k in range(0, len(members), 32):
                chunk = members[k : k + 32]
                src = rows([list(ids[i]) for i in chunk])
                gen = model.generate(
                    input_ids=src,
                    attention_mask=src != pad,
                    num_beams=4,
                    max_new_tokens=n,
                    length_penalty=a.alpha,
                    early_stopping="never",
                    forced_eos_token_id=0,
                    bad_words_ids=[[pad]],
                    do_sample=False,
                )
                for i, row in zip(chunk, pair.decode([r[1:] for r in gen.tolist()])):
                    theirs[i] = row
    hf_seconds = time.perf_counter() - t0
    same = sum(x == y for x, y in zip(ours, theirs))
    bleu = sacrebleu.metrics.BLEU()
    result = {
        "peer_train_seconds": round(train_seconds, 1),
        "peer_steps": steps,
        "sentences": len(sources),
        "identical": same,
        "identical_share": same / len(sources),
        "bleu_ours": bleu.corpus_score(ours, [refs]).score,
        "bleu_generate": bleu.corpus_score(theirs, [refs]).score,
        "bleu_signature": str(bleu.get_signature()),
        "decode_seconds_ours": round(ours_seconds, 1),
        "decode_seconds_generate": round(hf_seconds, 1),
        "alpha": a.alpha,
        "differences": [
            {"source": s, "ours": x, "generate": y}
            for s, x, y in zip(sources, ours, theirs)
            if x != y
        ][:10],
    }
    (out / "result.json").write_text(json.dumps(result, indent=1, ensure_ascii=False))
    print(json.dumps({k: v for k, v in result.items() if k != "differences"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
