#!/usr/bin/env python3
"""Our training and decoding against Hugging Face MarianMT (PyTorch) and CTranslate2 (issue 19).

At the equal-work presets of ``benchmarks/presets.py`` (``tiny``, ``base``: the same d_model,
d_ff, heads, layers and vocabulary, random weights, the same random token batches), one process
times in turn, round after round:

* training steps: ours (``FixedBench.train_fixed``) and PyTorch MarianMT (AdamW with our betas, eps
  and weight decay, label-smoothed cross-entropy, dropout 0.1, gradient-norm clipping), in
  target tokens/s;
* beam-4 and greedy decoding of ``decode_sentences`` sources of ``decode_length`` tokens into
  exactly ``decode_length`` tokens: ours (``FixedBench.decode_fixed`` / ``decode_fixed_greedy``: EOS
  forbidden until the last position), PyTorch ``generate`` (min_new_tokens = max_new_tokens)
  and CTranslate2 ``translate_batch`` (min = max decoding length) with float32 and int8
  compute, in sentences/s.

Precision is matched (``--precisions``, both by default, alternating in the same rounds):
``float32`` runs ours in float32 against PyTorch in float32; ``bfloat16`` runs ours with
bfloat16 matmul operands (``model.matmul_dtype``) against PyTorch under
``torch.autocast("cpu", dtype=torch.bfloat16)`` (bfloat16 matmuls, float32 reductions and
weights: the same policy). CTranslate2 has no bfloat16 compute type on a CPU; its float32 and
int8 figures appear in both rows.

A round's figure is the median over its steps or calls (after untimed ones; compile time is
not counted). The table gives the median and min–max of those figures over ``--rounds``
rounds, and of the ratios ours / peer taken round by round. The order of the systems flips
every round, and each measurement starts after a pause so that the previous one's threads are
idle. PyTorch and CTranslate2 run with as many threads as JAX has cores.

Differences that cost no measurable work: Marian is post-norm (ours pre-norm), its vocabulary
has one more row (its PAD, which CTranslate2's conversion drops), and CTranslate2 does not emit
the final EOS (it takes the same number of decoder steps).

Needs the optional extra ``compare``; without it the script says what to install and exits 2::

    .venv/bin/pip install 'torch==2.13.*' --index-url https://download.pytorch.org/whl/cpu
    .venv/bin/pip install -e '.[compare]'
    .venv/bin/python -m benchmarks.compare --json runs/compare.json --docs docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import jsonable, machine_info, run_experiment, versions, write_docs
from benchmarks.peers import INSTALL, PEERS, Marian, missing_peers
from benchmarks.presets import FIXED, FixedBench, fixed_batches, fixed_options, fixed_sources

ROOT = Path(__file__).resolve().parents[1]
SYSTEMS = {
    "ours": "ours",
    "pytorch": "PyTorch",
    "ct2_float32": "CT2 float32",
    "ct2_int8": "CT2 int8",
}
TASKS = {
    "train": ("training", "target tokens/s", ("ours", "pytorch")),
    "beam4": ("beam 4", "sentences/s", tuple(SYSTEMS)),
    "greedy": ("greedy", "sentences/s", tuple(SYSTEMS)),
}
# Goals (issue 35) for ours / the precision-matched peer: 1.3x in training and beam 4. With
# bfloat16 operands the matched decoding peer is PyTorch's autocast (CT2 has no CPU bfloat16).
GOALS = {
    "float32": {("train", "pytorch"): 1.3, ("beam4", "ct2_float32"): 1.3},
    "bfloat16": {("train", "pytorch"): 1.3, ("beam4", "pytorch"): 1.3},
}
PRECISIONS = ("float32", "bfloat16")
# --smoke: a tiny preset beside the fixed ones (FixedBench builds it as them).
SMOKE_PRESET = dict(
    model=dict(
        vocab_size=300, d_model=32, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, d_ff=64
    ),
    batch=8,
    length=16,
    decode_sentences=4,
    decode_length=8,
)
DOCS_BEGIN, DOCS_END = "<!-- compare.py table: begin -->", "<!-- compare.py table: end -->"


def spread(values: list[float]) -> dict[str, float]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


# -- the comparison -------------------------------------------------------------------------------


def measure(
    bench: FixedBench, peer: Marian, name: str, task: str, system: str, precision: str
) -> dict[str, Any]:
    """One round's figure of ``system`` on ``task`` for preset ``name``; ``bench`` is ours at
    ``precision`` and PyTorch runs at the same one."""
    a = bench.args
    spec = bench.fixed(name)
    if system == "ours":
        res = (
            bench.train_fixed(name)
            if task == "train"
            else bench.decode_fixed(name)
            if task == "beam4"
            else bench.decode_fixed_greedy(name)
        )
        if task == "train":
            return {
                "value": res["target_tokens_per_second"],
                "mfu": res["mfu"],
                "seconds": res["step_seconds"],
            }
        return {"value": res["sentences_per_second"]["median"], "seconds": res["seconds"]}
    if task == "train":
        rows, length = spec["batch"], spec["length"]
        batches = fixed_batches(a.warmup + a.steps, rows, length, peer.vocab)
        times = peer.train_seconds(batches, a.warmup, precision)
        return {"value": rows * length / statistics.median(times), "seconds": spread(times)}
    n = spec["decode_sentences"]
    src = fixed_sources(n, spec["decode_length"], peer.vocab)
    times = peer.decode_seconds(
        system, src, 4 if task == "beam4" else 1, a.decode_repeats, precision
    )
    return {"value": n / statistics.median(times), "seconds": spread(times)}


def summarize(rounds: list[dict], goals: dict[str, dict[tuple[str, str], float]]) -> dict[str, Any]:
    """Per variant (``"preset precision"``) and task: each system's spread over rounds, the
    ratios ours / peer, and whether the median ratio meets ``goals[precision][(task, peer)]``."""
    out: dict[str, Any] = {}
    for name in rounds[0]:
        variant_goals = goals.get(name.split()[-1], {})
        out[name] = {}
        for task, (_, _, systems) in TASKS.items():
            per = {s: [r[name][task][s]["value"] for r in rounds] for s in systems}
            ratios = {
                s: spread([o / p for o, p in zip(per["ours"], per[s])])
                for s in systems
                if s != "ours"
            }
            met = {
                s: {"goal": g, "met": ratios[s]["median"] >= g}
                for (t, s), g in variant_goals.items()
                if t == task
            }
            out[name][task] = {
                "figures": {s: spread(v) for s, v in per.items()},
                "ours_over": ratios,
                "goals": met,
            }
    return out


def num(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def markdown(result: dict[str, Any]) -> str:
    """The summary as a line of provenance and a Markdown table."""
    m = result["meta"]
    mach = m["machine"]
    v = m["versions"]
    peaks = "; ".join(
        f"{d} matmul peak {p['median']:.0f} GFLOP/s ({p['min']:.0f}–{p['max']:.0f}, `jnp.dot`)"
        for d, p in m["peak_gflops_per_second"].items()
    )
    pairs = {
        "float32": "ours float32 against PyTorch float32",
        "bfloat16": "ours with bfloat16 matmul operands against PyTorch's bfloat16 autocast",
    }
    matched = "; ".join(pairs[x] for x in m["precisions"]) + (
        " (CTranslate2 has no CPU bfloat16: its float32 and int8 in both rows)"
        if "bfloat16" in m["precisions"]
        else ""
    )
    rng = lambda s, f=num: f"{f(s['median'])} ({f(s['min'])}–{f(s['max'])})"
    ratio = lambda x: f"{x:.2f}×"
    lines = [
        f"Measured by `benchmarks/compare.py` on {m['date']}: {mach['cpu']}, "
        f"{mach['cpus_usable']} cores ({m['threads']} threads each side), load average "
        f"{mach['load_average_start'][0]:.1f} at the start and {m['load_average_end'][0]:.1f} "
        f"at the end; {peaks}; precision matched: {matched}; "
        f"jax {v['jax']}, flax {v['flax']}, torch "
        f"{v['torch']}, transformers {v['transformers']}, ctranslate2 {v['ctranslate2']}; "
        f"{m['rounds']} rounds of {m['steps']} training steps and {m['decode_repeats']} "
        f"decoding calls, median (min–max over rounds); {m['seconds'] / 60:.1f} minutes.",
        "",
    ]
    peers = [s for s in SYSTEMS if s != "ours"]
    lines.append(
        "| preset | task | unit | "
        + " | ".join(SYSTEMS.values())
        + " | "
        + " | ".join(f"ours / {SYSTEMS[s]}" for s in peers)
        + " |"
    )
    lines.append("|---" * (3 + len(SYSTEMS) + len(peers)) + "|")
    for name, tasks in result["summary"].items():
        for task, t in tasks.items():
            label, unit, _ = TASKS[task]
            cells = [rng(t["figures"][s]) if s in t["figures"] else "—" for s in SYSTEMS]
            for s in peers:
                if s not in t["ours_over"]:
                    cells.append("—")
                    continue
                cell = rng(t["ours_over"][s], ratio)
                if s in t["goals"]:
                    g = t["goals"][s]
                    cell += f", goal ≥ {g['goal']}×: **{'met' if g['met'] else 'not met'}**"
                cells.append(cell)
            lines.append(f"| {name} | {label} | {unit} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="tiny,base", help="comma-separated: tiny, base")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (3)")
    p.add_argument("--steps", type=int, default=8, help="timed training steps per round (8)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (2)")
    p.add_argument("--decode-repeats", type=int, default=5, help="timed decoding calls (5)")
    p.add_argument(
        "--precisions",
        default="float32,bfloat16",
        help="comma-separated, alternating in the same rounds: float32 (ours and PyTorch in "
        "float32) and bfloat16 (our bfloat16 matmul operands against PyTorch's bfloat16 autocast)",
    )
    p.add_argument(
        "--pause",
        type=float,
        default=1.0,
        help="seconds between measurements, so the last one's threads go idle",
    )
    p.add_argument("--json", help="write the figures as JSON to this file")
    p.add_argument(
        "--docs",
        help="replace the table between the compare.py markers in this "
        "Markdown file (docs/benchmarks.md)",
    )
    p.add_argument(
        "--smoke",
        action="store_true",
        help="a tiny model, 2 rounds of 2 steps: checks that the script runs",
    )
    p.add_argument(
        "--quality",
        action="store_true",
        help="compare translation quality at the same training time instead "
        "(benchmarks/compare_quality.py, whose options follow --quality; see "
        "python -m benchmarks.compare_quality --help)",
    )
    a = p.parse_args(argv)
    a.presets = ["smoke"] if a.smoke else [s for s in a.preset.split(",") if s]
    if a.smoke:
        a.rounds, a.steps, a.warmup, a.decode_repeats, a.pause = 2, 2, 1, 2, 0.0
    for s in a.presets:
        if s not in ("tiny", "base", "smoke"):
            p.error(f"unknown preset {s!r}; choose from tiny, base")
    a.precisions = [s for s in a.precisions.split(",") if s]
    for s in a.precisions:
        if s not in PRECISIONS:
            p.error(f"unknown precision {s!r}; choose from {', '.join(PRECISIONS)}")
    if a.rounds < 1 or a.steps < 1 or a.decode_repeats < 1:
        p.error("--rounds, --steps and --decode-repeats must be >= 1")
    return a


def main(argv: list[str] | None = None) -> int:
    raw = sys.argv[1:] if argv is None else argv
    # the quality comparison has its own options (benchmarks/compare_quality.py)
    args = parse_args(raw) if "--quality" not in raw else None
    missing = missing_peers()
    if missing:
        print(
            f"benchmarks/compare.py needs the optional extra 'compare' ({', '.join(missing)} "
            f"not installed). Install it with:\n{INSTALL}",
            file=sys.stderr,
        )
        return 2
    if args is None:
        return run_experiment("compare_quality", [a for a in raw if a != "--quality"])
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local; never ask the hub
    import torch
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()

    threads = (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    )
    torch.set_num_threads(threads)
    presets = {**FIXED, "smoke": SMOKE_PRESET} if args.smoke else FIXED
    bench_args: dict[str, Any] = dict(
        steps=args.steps, warmup=args.warmup, decode_repeats=args.decode_repeats
    )
    if args.smoke:
        bench_args.update(peak_size=256, peak_repeats=2)
    # ours at each precision: float32, or bfloat16 operands of a float32 model
    benches = {
        p: FixedBench(fixed_options(**bench_args, matmul_dtype=p), presets) for p in args.precisions
    }
    start = time.perf_counter()
    meta = {
        "argv": sys.argv[1:] if argv is None else argv,
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "machine": machine_info("float32"),
        "versions": versions(*PEERS),
        "threads": threads,
        "precisions": args.precisions,
        "rounds": args.rounds,
        "steps": args.steps,
        "warmup": args.warmup,
        "decode_repeats": args.decode_repeats,
        "presets": {},
    }
    rounds: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="compare-") as tmp:
        peers = {}
        first = benches[args.precisions[0]]
        for name in args.presets:
            peers[name] = Marian(first.fixed(name), Path(tmp) / name, threads)
            meta["presets"][name] = presets[name]
        for r in range(args.rounds):
            rounds.append({})
            order = args.precisions if r % 2 == 0 else args.precisions[::-1]
            for name in args.presets:
                for precision in order:
                    variant = f"{name} {precision}"
                    rounds[-1][variant] = {}
                    for task, (label, unit, systems) in TASKS.items():
                        figures = rounds[-1][variant][task] = {}
                        for system in systems if r % 2 == 0 else systems[::-1]:
                            time.sleep(args.pause)
                            figures[system] = measure(
                                benches[precision], peers[name], name, task, system, precision
                            )
                            print(
                                f"round {r + 1}/{args.rounds} {variant} {label} "
                                f"{SYSTEMS[system]}: {figures[system]['value']:,.1f} {unit}",
                                flush=True,
                            )
    meta["seconds"] = time.perf_counter() - start
    meta["load_average_end"] = list(os.getloadavg())
    meta["peak_gflops_per_second"] = {
        p: b.result["peak"]["gflops_per_second"] for p, b in benches.items()
    }
    summary = summarize(rounds, {} if args.smoke else GOALS)
    result = {"meta": meta, "summary": summary, "rounds": rounds}
    table = markdown(result)
    print("\n" + table)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(jsonable(result), indent=1) + "\n")
        print(f"\nwrote {args.json}")
    if args.docs:
        write_docs(Path(args.docs), table, DOCS_BEGIN, DOCS_END)
        print(f"updated the table in {args.docs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
