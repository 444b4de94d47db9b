#!/usr/bin/env python3
"""Does the CTranslate2 export of a run translate its test split as the run does (issue 15)?

Exports ``--workdir`` with ``seq2seq-export --to ctranslate2`` (into ``--out``, default a
temporary directory), decodes the run's test split with beam 4 by ours
(``seq2seq.translation.Translator``) and by ``ctranslate2.Translator`` under the same rules
(``seq2seq.export.ctranslate2_translate``, ``exhaustive``: CTranslate2 searches up to the
length limit, as our stopping rule guarantees), and prints the share of token-identical
translations (all sentences, and those where neither reaches the length limit), both
sacreBLEU scores and the decoding times. CTranslate2 has no GNMT length penalty, so a run
decoded with ``decode.length_penalty=gnmt`` is compared under ``plain`` with the same α (both
sides). The run's ``decode.allow_unk`` is kept unless ``--allow-unk`` (see
``ctranslate2_options`` for what differs when the unknown piece is disabled).

    .venv/bin/python scripts/export_check.py --workdir runs/tatoeba_en_es [--json out.json]

Exit status 0 when the goals hold (≥ 99% identical, |ΔBLEU| ≤ 0.1), 1 otherwise, 2 on bad
input (e.g. ctranslate2 not installed, or a model CTranslate2 cannot express).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

GOAL_SAME, GOAL_BLEU = 0.99, 0.1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", required=True, help="a run written by seq2seq-train")
    p.add_argument("--out", help="export directory (default: a temporary one)")
    p.add_argument("--limit", type=int, default=0, help="only the first N test sentences")
    p.add_argument("--allow-unk", action="store_true", help="both may produce the unknown piece")
    p.add_argument("--json", help="also write the figures here")
    a = p.parse_args(argv)

    from seq2seq.config import replace
    from seq2seq.data.pipeline import decode_source_limit, split_text
    from seq2seq.evaluation import score
    from seq2seq.export import ExportError, ctranslate2_translate, export_run
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
        config, tokenizer, graphdef, params = load_trained(a.workdir)
        penalty = config.decode.length_penalty
        decode = replace(
            config.decode,
            beam_size=4,
            length_penalty="plain" if penalty == "gnmt" else penalty,
            allow_unk=a.allow_unk or config.decode.allow_unk,
        )
        test = split_text(config, "test")
        sources, refs = list(test.sources), list(test.targets)
        if a.limit:
            sources, refs = sources[: a.limit], refs[: a.limit]
        max_src = decode_source_limit(config)
        t = time.perf_counter()
        ours = Translator(graphdef, params, tokenizer, decode, max_src_len=max_src).translate(
            sources
        )
        ours_s = time.perf_counter() - t
        translator = ctranslate2.Translator(str(out), device="cpu")
        t = time.perf_counter()
        theirs = ctranslate2_translate(translator, tokenizer, sources, decode, exhaustive=True)
        theirs_s = time.perf_counter() - t

    ids = [list(h[0].tokens) for h in ours]
    same = [o == t for o, (t, _) in zip(ids, theirs)]
    limits = [decode.output_limit(len(x)) for x in tokenizer.encode(sources)]
    free = [
        i for i, o in enumerate(ids) if len(o) + 1 < limits[i] and len(theirs[i][0]) + 1 < limits[i]
    ]
    ours_text = [h[0].text for h in ours]
    theirs_text = tokenizer.target.decode([t for t, _ in theirs])
    ours_bleu, theirs_bleu = score(ours_text, refs), score(theirs_text, refs)
    res = {
        "workdir": a.workdir,
        "sentences": len(sources),
        "decode": {
            k: getattr(decode, k)
            for k in ("beam_size", "length_penalty", "alpha", "max_len_a", "max_len_b", "allow_unk")
        },
        "identical_share": sum(same) / len(same),
        "below_limit_sentences": len(free),
        "identical_share_below_limit": sum(same[i] for i in free) / max(len(free), 1),
        "bleu_ours": ours_bleu.bleu,
        "bleu_ctranslate2": theirs_bleu.bleu,
        "bleu_difference": theirs_bleu.bleu - ours_bleu.bleu,
        "bleu_signature": ours_bleu.bleu_signature,
        "seconds_ours_with_compile": ours_s,
        "seconds_ctranslate2": theirs_s,
    }
    res["goals_met"] = bool(
        res["identical_share"] >= GOAL_SAME and abs(res["bleu_difference"]) <= GOAL_BLEU
    )
    print(
        f"{len(sources)} test sentences, beam 4, length penalty {decode.length_penalty} "
        f"alpha {decode.alpha}:\n"
        f"  identical translations: {100 * res['identical_share']:.2f}% "
        f"({sum(same)}/{len(same)}); below the length limit on both sides: "
        f"{100 * res['identical_share_below_limit']:.2f}% of {len(free)}\n"
        f"  BLEU ours {ours_bleu.bleu:.2f}, CTranslate2 {theirs_bleu.bleu:.2f} "
        f"(difference {res['bleu_difference']:+.2f}; {ours_bleu.bleu_signature})\n"
        f"  time: ours {ours_s:.1f} s (with compilation), CTranslate2 {theirs_s:.1f} s\n"
        f"  goals (>= 99% identical, |dBLEU| <= 0.1): {'met' if res['goals_met'] else 'NOT met'}"
    )
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1), encoding="utf-8")
    return 0 if res["goals_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
