#!/usr/bin/env python3
"""Does the CTranslate2 export of a run translate its test split as the run does (issues 15, 35)?

Exports ``--workdir`` with ``seq2seq-export --to ctranslate2`` (into ``--out``, default a
temporary directory) and decodes the run's test split with beam 4 twice:

1. **As users meet it** (the headline): ours with the run's own decode settings (what
   ``seq2seq-translate`` does, beam 4) against CTranslate2 called as the exported model card's
   snippet calls it (``seq2seq.export.card_options``: ``beam_size=4``, the run's α as
   ``length_penalty``, ``disable_unk``), every other option at CTranslate2's default
   (patience 1, its own length limit of 256, no end token in |Y|).
2. **Under our rules** (``seq2seq.export.ctranslate2_translate``, ``exhaustive``: CTranslate2
   searches up to our length limit, as our stopping rule guarantees). CTranslate2 has no GNMT
   length penalty, so a run decoded with ``decode.length_penalty=gnmt`` is compared under
   ``plain`` with the same α on both sides. The run's ``decode.allow_unk`` is kept unless
   ``--allow-unk`` (see ``ctranslate2_options``).

For each: the share of token-identical translations, both sacreBLEU scores and the decoding
times; for the second also the share among lines where neither side reaches the length limit.

    .venv/bin/python -m benchmarks.export_check --workdir runs/tatoeba_en_es \
        [--limit 300] [--json F]

Exit status 0 when the goals hold (under our rules ≥ 99% identical and |ΔBLEU| ≤ 0.1; as users
meet it |ΔBLEU| ≤ 0.2), 1 otherwise, 2 on bad input (e.g. ctranslate2 not installed, or a model
CTranslate2 cannot express).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

GOAL_SAME, GOAL_BLEU, GOAL_CARD_BLEU = 0.99, 0.1, 0.2


def _row(ours, ours_s, theirs_ids, theirs_s, tokenizer, refs) -> dict:
    from seq2seq.evaluation import score

    same = [list(h[0].tokens) == t for h, t in zip(ours, theirs_ids)]
    ours_bleu = score([h[0].text for h in ours], refs)
    theirs_bleu = score(tokenizer.target.decode(theirs_ids), refs)
    return {
        "identical": sum(same),
        "identical_share": sum(same) / len(same),
        "bleu_ours": ours_bleu.bleu,
        "bleu_ctranslate2": theirs_bleu.bleu,
        "bleu_difference": theirs_bleu.bleu - ours_bleu.bleu,
        "bleu_signature": ours_bleu.bleu_signature,
        "seconds_ours_with_compile": ours_s,
        "seconds_ctranslate2": theirs_s,
        "same": same,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", required=True, help="a run written by seq2seq-train")
    p.add_argument("--out", help="export directory (default: a temporary one)")
    p.add_argument("--limit", type=int, default=0, help="only the first N test sentences")
    p.add_argument("--allow-unk", action="store_true", help="both may produce the unknown piece")
    p.add_argument(
        "--matmul-dtype",
        choices=("float32", "bfloat16"),
        help="decode ours with these matmul operands instead of the run's (CTranslate2 "
        "computes in float32: with float32 the remaining differences are not precision)",
    )
    p.add_argument("--json", help="also write the figures here")
    a = p.parse_args(argv)

    from seq2seq.config import replace
    from seq2seq.data.pipeline import decode_source_limit, split_text
    from seq2seq.export import ExportError, card_options, ctranslate2_translate, export_run
    from seq2seq.trained import load_trained
    from seq2seq.translation import Translator

    try:
        import ctranslate2
    except ImportError:
        print("error: needs ctranslate2: pip install 'seq2seq[export]'", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(a.out or Path(tmp) / "ct2")
        try:
            export_run(a.workdir, "ctranslate2", out, overwrite=True)
        except (ExportError, OSError, RuntimeError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        config, tokenizer, graphdef, params = load_trained(a.workdir, matmul_dtype=a.matmul_dtype)
        test = split_text(config, "test")
        sources, refs = list(test.sources), list(test.targets)
        if a.limit:
            sources, refs = sources[: a.limit], refs[: a.limit]
        max_src = decode_source_limit(config)
        translator = ctranslate2.Translator(str(out), device="cpu")
        target_sp = tokenizer.target.sp

        def ours_with(decode):
            t = time.perf_counter()
            got = Translator(graphdef, params, tokenizer, decode, max_src_len=max_src)
            return got.translate(sources), time.perf_counter() - t

        # 1. as users meet it: the run's settings against the model card's call
        as_run = replace(config.decode, beam_size=4)
        card_call = card_options(as_run)
        ours_card, ours_card_s = ours_with(as_run)
        pieces = [tokenizer.source.sp.encode(line, out_type=str) for line in sources]
        keep = [i for i, line in enumerate(sources) if line.strip()]
        t = time.perf_counter()
        card_out = translator.translate_batch([pieces[i] for i in keep], **card_call)
        card_s = time.perf_counter() - t
        card_ids: list[list[int]] = [[] for _ in sources]
        for i, result in zip(keep, card_out):
            card_ids[i] = [target_sp.piece_to_id(x) for x in result.hypotheses[0]]
        # 2. under our rules, exhaustive
        penalty = config.decode.length_penalty
        decode = replace(
            config.decode,
            beam_size=4,
            length_penalty="plain" if penalty == "gnmt" else penalty,
            allow_unk=a.allow_unk or config.decode.allow_unk,
        )
        ours, ours_s = ours_with(decode)
        t = time.perf_counter()
        theirs = ctranslate2_translate(translator, tokenizer, sources, decode, exhaustive=True)
        theirs_s = time.perf_counter() - t

    card = _row(ours_card, ours_card_s, card_ids, card_s, tokenizer, refs)
    exhaustive = _row(ours, ours_s, [t for t, _ in theirs], theirs_s, tokenizer, refs)
    limits = [decode.output_limit(len(x)) for x in tokenizer.encode(sources)]
    free = [
        i
        for i, h in enumerate(ours)
        if len(h[0].tokens) + 1 < limits[i] and len(theirs[i][0]) + 1 < limits[i]
    ]
    exhaustive["below_limit_sentences"] = len(free)
    exhaustive["identical_share_below_limit"] = sum(exhaustive["same"][i] for i in free) / max(
        len(free), 1
    )
    keys = ("beam_size", "length_penalty", "alpha", "max_len_a", "max_len_b", "allow_unk")
    card["decode_ours"] = {k: getattr(as_run, k) for k in keys}
    card["ctranslate2_options"] = card_call
    exhaustive["decode"] = {k: getattr(decode, k) for k in keys}
    for row in (card, exhaustive):
        del row["same"]
    res = {
        "workdir": a.workdir,
        "sentences": len(sources),
        "matmul_dtype": config.model.matmul_dtype,
        "card": card,
        "exhaustive": exhaustive,
    }
    res["goals_met"] = bool(
        exhaustive["identical_share"] >= GOAL_SAME
        and abs(exhaustive["bleu_difference"]) <= GOAL_BLEU
        and abs(card["bleu_difference"]) <= GOAL_CARD_BLEU
    )
    n = len(sources)
    print(
        f"{n} test sentences, beam 4; our matmul operands: {config.model.matmul_dtype}\n"
        f"  as users meet it (ours: {as_run.length_penalty} penalty alpha {as_run.alpha}; "
        f"CTranslate2: the model card's translate_batch("
        f"{', '.join(f'{k}={v}' for k, v in card_call.items())}), its defaults otherwise):\n"
        f"    identical {100 * card['identical_share']:.2f}% ({card['identical']}/{n}); "
        f"BLEU ours {card['bleu_ours']:.2f}, CTranslate2 {card['bleu_ctranslate2']:.2f} "
        f"({card['bleu_difference']:+.2f}); time ours {ours_card_s:.1f} s (with "
        f"compilation), CTranslate2 {card_s:.1f} s\n"
        f"  under our rules (both {decode.length_penalty} penalty alpha {decode.alpha}, "
        f"CTranslate2 exhaustive to our length limit):\n"
        f"    identical {100 * exhaustive['identical_share']:.2f}% ({exhaustive['identical']}/"
        f"{n}); below the length limit on both sides: "
        f"{100 * exhaustive['identical_share_below_limit']:.2f}% of {len(free)}; BLEU ours "
        f"{exhaustive['bleu_ours']:.2f}, CTranslate2 {exhaustive['bleu_ctranslate2']:.2f} "
        f"({exhaustive['bleu_difference']:+.2f}); time ours {ours_s:.1f} s, CTranslate2 "
        f"{theirs_s:.1f} s\n"
        f"  ({card['bleu_signature']})\n"
        f"  goals (our rules: >= 99% identical, |dBLEU| <= 0.1; as users meet it: |dBLEU| <= "
        f"0.2): {'met' if res['goals_met'] else 'NOT met'}"
    )
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1), encoding="utf-8")
    return 0 if res["goals_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
