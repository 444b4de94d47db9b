#!/usr/bin/env python3
"""A trained Marian checkpoint through ``seq2seq-import``: same translations as ``generate``?

1. SentencePiece model (Marian's specials: ``<unk>`` 0, ``</s>`` 1; ``vocab.json`` numbers
   ``</s>`` 0, ``<unk>`` 1, the pieces, ``<pad>`` last) on the shipped training split.
2. A Hugging Face ``MarianMTModel`` of the preset's sizes (d_model 256, 3+3 layers, 4 heads,
   d_ff 1024, ``swish``, scaled, shared embeddings) trained for ``--seconds`` with the plain
   recipe of ``benchmarks/peers.py`` (the same-size peer of ``compare.py --quality``),
   saved with ``save_pretrained`` beside ``source.spm``/``target.spm``/``vocab.json``.
3. ``seq2seq-import --from marian`` of that directory.
4. The first ``--limit`` test sentences translated by both: ``generate`` (beam 4, length
   penalty α, ``early_stopping="never"``, PAD banned) and our ``Translator`` on the imported
   run (beam 4, ``plain`` α), with the same per-sentence limit ``ceil(a·|x| + b)``; the share
   of identical outputs and both sacreBLEU scores. ``generate`` runs twice, once per rule for
   the EOS forced at the length limit: ours (only EOS allowed there, at the model's
   log-probability: a ``LogitsProcessor`` passed to ``generate``) and Hugging Face's own
   (``forced_eos_token_id``: that EOS scores log-probability 0, docs/import.md).

``--reuse`` decodes the checkpoint an earlier run of the script saved in ``OUT/hf``.
``--smoke`` shrinks it to a check of the script (seconds): a 1,000-piece vocabulary and a tiny
Marian model (``SMOKE``: d_model 16, 1+1 layers) trained for 2 seconds on the first 2,000
training pairs, 4 test sentences (``--seconds``/``--limit`` still apply).

Needs the ``compare`` extra (torch, transformers). Not run in CI at full size (minutes of
training); tests/test_benchmarks_smoke.py runs ``--smoke``.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The preset's sizes, and the tiny model of --smoke.
SIZES = dict(d_model=256, layers=3, heads=4, ffn=1024, vocab=8000, pairs=0)
SMOKE = dict(d_model=16, layers=1, heads=2, ffn=32, vocab=1000, pairs=2000)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/marian_peer", help="checkpoint, run and result")
    p.add_argument("--seconds", type=float, default=None, help="peer training time (300)")
    p.add_argument("--limit", type=int, default=None, help="test sentences compared (500)")
    p.add_argument("--alpha", type=float, default=1.0, help="length-penalty exponent")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reuse", action="store_true", help="decode the checkpoint in OUT/hf")
    p.add_argument("--smoke", action="store_true", help="a tiny vocabulary and model (a check)")
    a = p.parse_args(argv)
    if a.seconds is None:
        a.seconds = 2.0 if a.smoke else 300.0
    if a.limit is None:
        a.limit = 4 if a.smoke else 500
    size = SMOKE if a.smoke else SIZES

    import sentencepiece as spm
    import torch
    import transformers

    from benchmarks.harness import read_lines
    from benchmarks.peers import RECIPE, marian_peer, peer_batches, peer_optimizer, peer_update

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    out = Path(a.out)
    hf_dir = out / "hf"
    hf_dir.mkdir(parents=True, exist_ok=True)
    data = ROOT / "data" / "tatoeba-en-es"
    if a.reuse:
        model = transformers.MarianMTModel.from_pretrained(hf_dir).eval()
        pad = json.loads((hf_dir / "vocab.json").read_text(encoding="utf-8"))["<pad>"]
        trained = json.loads((hf_dir / "training.json").read_text(encoding="utf-8"))
        return compare(a, model, hf_dir, out, data, pad, trained)
    train_src, train_tgt = read_lines(data / "train.en"), read_lines(data / "train.es")
    if size["pairs"]:
        train_src, train_tgt = train_src[: size["pairs"]], train_tgt[: size["pairs"]]
    blob = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(train_src + train_tgt),
        model_writer=blob,
        vocab_size=size["vocab"],
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
        d_model=size["d_model"],
        encoder_layers=size["layers"],
        decoder_layers=size["layers"],
        encoder_attention_heads=size["heads"],
        decoder_attention_heads=size["heads"],
        encoder_ffn_dim=size["ffn"],
        decoder_ffn_dim=size["ffn"],
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
    peer = marian_peer(model, pad)  # the training interface of the quality peers
    opt, sched = peer_optimizer(model)

    model.train()
    start, steps, epoch = time.perf_counter(), 0, 0
    while time.perf_counter() - start < a.seconds:
        for batch in peer_batches(train, int(RECIPE["max_tokens"]), epoch):
            loss, _ = peer_update(peer, opt, sched, [train[i] for i in batch], pad, pad)
            steps += 1
            if steps % 100 == 0:
                print(f"peer step {steps}: loss {loss:.3f}", flush=True)
            if time.perf_counter() - start >= a.seconds:
                break
        epoch += 1
    trained = {"peer_train_seconds": round(time.perf_counter() - start, 1), "peer_steps": steps}
    model.eval()
    model.save_pretrained(hf_dir)
    (hf_dir / "training.json").write_text(json.dumps(trained), encoding="utf-8")
    return compare(a, model, hf_dir, out, data, pad, trained)


def compare(a, model, hf_dir: Path, out: Path, data: Path, pad: int, trained: dict) -> int:
    """Import ``hf_dir``, decode the test sentences with both systems, write the result."""
    import numpy as np
    import sacrebleu
    import torch
    import transformers

    from benchmarks.harness import read_lines
    from benchmarks.peers import pad_rows
    from seq2seq.config import replace
    from seq2seq.marian import import_marian
    from seq2seq.trained import load_trained
    from seq2seq.translation import Translator

    class ModelLogprobEOS(transformers.LogitsProcessor):
        """At the limit only EOS, at the log-probability the model gives it (our rule)."""

        def __init__(self, length: int, eos: int):
            self.length, self.eos = length, eos

        def __call__(self, input_ids, scores):
            if input_ids.shape[-1] != self.length:
                return scores
            kept = torch.full_like(scores, -float("inf"))
            kept[:, self.eos] = scores[:, self.eos]
            return kept

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

    def generate(hf_rule: bool) -> tuple[list[str], int, float]:
        """``generate``'s outputs, how many of them reach the limit, the seconds taken."""
        # set on the model's own config: a None in a config passed to generate is filled
        # from the model's (transformers 5), so the forced EOS would stay
        model.generation_config.forced_eos_token_id = 0 if hf_rule else None
        theirs, at_limit = [""] * len(sources), 0
        t0 = time.perf_counter()
        with torch.no_grad():
            for n, members in sorted(groups.items()):
                processors = [] if hf_rule else [ModelLogprobEOS(n, 0)]
                for k in range(0, len(members), 32):
                    chunk = members[k : k + 32]
                    src = pad_rows([list(ids[i]) for i in chunk], pad, None)
                    gen = model.generate(
                        input_ids=src,
                        attention_mask=src != pad,
                        logits_processor=transformers.LogitsProcessorList(processors),
                        num_beams=4,
                        max_new_tokens=n,
                        length_penalty=a.alpha,
                        early_stopping="never",
                        bad_words_ids=[[pad]],
                        do_sample=False,
                    )
                    rows = [r[1:] for r in gen.tolist()]
                    at_limit += sum(len([t for t in r if t != pad]) >= n for r in rows)
                    for i, row in zip(chunk, pair.decode(rows)):
                        theirs[i] = row
        return theirs, at_limit, time.perf_counter() - t0

    bleu = sacrebleu.metrics.BLEU()
    result = {
        **trained,
        "sentences": len(sources),
        "bleu_ours": bleu.corpus_score(ours, [refs]).score,
        "bleu_signature": str(bleu.get_signature()),
        "decode_seconds_ours": round(ours_seconds, 1),
        "alpha": a.alpha,
    }
    for name, hf_rule in (("our_eos_rule", False), ("hf_forced_eos", True)):
        theirs, at_limit, hf_seconds = generate(hf_rule)
        same = sum(x == y for x, y in zip(ours, theirs))
        result[name] = {
            "identical": same,
            "identical_share": same / len(sources),
            "bleu_generate": bleu.corpus_score(theirs, [refs]).score,
            "generate_outputs_at_the_limit": at_limit,
            "decode_seconds_generate": round(hf_seconds, 1),
            "differences": [
                {"source": s, "ours": x, "generate": y}
                for s, x, y in zip(sources, ours, theirs)
                if x != y
            ][:10],
        }
    (out / "result.json").write_text(json.dumps(result, indent=1, ensure_ascii=False))
    print(json.dumps(result, indent=1, ensure_ascii=False)[:4000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
