#!/usr/bin/env python3
"""Long inputs: memory and time of ``model.attention`` dense against chunked (issue 17).

Run as ``python -m benchmarks.benchmark --long [options]`` (or this file directly). For each
length n (``--lengths``, default 1k … 32k tokens) and each path it reports:

* ``layer``: one self-attention layer (d_model 256, 4 heads, one row of n tokens, causal
  packed-segment mask, ALiBi bias) forward + backward;
* ``step``: one whole training step (the tatoeba preset's model: 3 + 3 layers, d_model 256,
  vocabulary 8,000; one row of n source and n target tokens, AdamW).

For each: the compiled ``memory_analysis()`` temp bytes (XLA's buffer plan; compile only,
nothing allocated, so it is given at every length), and, in a child process per point, the
measured peak RSS (``VmHWM``) and the median time of ``--repeats`` calls. A point whose
predicted memory (temp + arguments + outputs) exceeds ``--budget-gib`` or whose predicted time
exceeds ``--max-seconds`` is not run (a note says why). It prints the notes' table (one n × n
matrix of 2-byte numbers per head and layer) beside ours and draws the curve (``--png``).

``--preset`` reports the memory_analysis of the train step of ``configs/tatoeba_long.yaml``
(8 rows × 1,024 tokens) with dense and with chunked attention. ``--speed N`` times the
default preset's step (``configs/tatoeba_en_es.yaml``: 64 rows × 64 tokens, random tokens in
full rows) alternating dense and chunked N times.

Times on a shared machine are distorted by the other processes; memory figures are not.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from benchmarks import harness
from benchmarks.harness import child_env, peak_rss
from seq2seq.config import ModelConfig, TrainConfig, load_config, replace
from seq2seq.model.attention import MultiHeadAttention, SegmentMask
from seq2seq.model.positions import PositionBias, alibi_bias
from seq2seq.resolve import resolve
from seq2seq.training.step import TrainState

ROOT = Path(__file__).resolve().parents[1]
GIB = 2**30
D_MODEL, HEADS = 256, 4


def say(*parts: Any) -> None:
    print(*parts, flush=True)


# -- the two measured programs ----------------------------------------------------------------


def _segments(n: int) -> np.ndarray:
    """One row of n tokens: segments of ~n/3 (packed) and the last 5% padding."""
    real = n - n // 20
    seg = np.zeros((1, n), np.int32)
    seg[0, :real] = np.arange(real) * 3 // real + 1
    return seg


def _positions(seg: np.ndarray) -> np.ndarray:
    pos = np.zeros_like(seg)
    for i in range(1, seg.shape[1]):
        pos[0, i] = pos[0, i - 1] + 1 if seg[0, i] == seg[0, i - 1] else 0
    return pos


def layer_program(attention: str, n: int, q_block: int, kv_block: int):
    """(jitted fn, concrete args) of one attention layer's loss and its gradients."""
    layer = MultiHeadAttention(
        D_MODEL,
        HEADS,
        implementation=attention,
        q_block=q_block,
        kv_block=kv_block,
        rngs=nnx.Rngs(params=0),
    )
    graphdef, params = nnx.split(layer)
    seg = jnp.asarray(_segments(n))
    pos = jnp.asarray(_positions(_segments(n)))

    def loss(params, x, seg, pos):
        m = nnx.merge(graphdef, params)
        mask = SegmentMask(seg, seg, causal=True)
        bias = PositionBias(lambda q, k: alibi_bias(q, k, HEADS), pos, pos)
        if attention == "dense":
            mask, bias = mask.dense(), bias.dense()
        return jnp.sum(m(x, x, mask, bias=bias))

    fn = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
    x = jax.random.normal(jax.random.key(0), (1, n, D_MODEL), jnp.float32)
    return fn, (params, x, seg, pos)


def step_program(attention: str, n: int, q_block: int, kv_block: int, rows: int = 1, config=None):
    """(jitted train step, concrete args) of the tatoeba preset's model on rows × n tokens."""
    if config is None:
        config = load_config(str(ROOT / "configs" / "tatoeba_en_es.yaml"), [])
    m: ModelConfig = replace(
        config.model,
        vocab_size=config.tokenizer.vocab_size,
        attention=attention,
        attention_q_block=q_block,
        attention_kv_block=kv_block,
        dropout_rate=0.0,
    )
    train = TrainConfig(learning_rate=1e-3, warmup_steps=10, label_smoothing=0.1, seed=0)
    context, state = harness.train_step(m, train)
    seg = np.tile(_segments(n), (rows, 1))
    pos = np.tile(_positions(_segments(n)), (rows, 1))
    tokens = np.random.default_rng(0).integers(4, m.vocab_size, (rows, n)).astype(np.int32)
    tokens = np.where(seg > 0, tokens, 0)
    batch = harness.micro_batch(
        dict(
            src=tokens, src_segments=seg, src_positions=pos,
            tgt=tokens, tgt_segments=seg, tgt_positions=pos,
        )
    )  # fmt: skip
    return context.step, (state, batch)


def repeated(fn, args):
    """A callable running ``fn(*args)`` once per call until done: a train step (which
    donates its state) continues from the state its last call returned."""
    args = list(args)

    def call() -> None:
        out = fn(*args)
        if isinstance(out, tuple) and isinstance(out[0], TrainState):
            args[0] = out[0]
        jax.block_until_ready(out)

    return call


def _abstract(args):
    return jax.tree.map(lambda v: jax.ShapeDtypeStruct(v.shape, v.dtype), args)


def compiled_memory(kind: str, attention: str, n: int, q_block: int, kv_block: int, **kw):
    """memory_analysis() bytes of a program (compiled, never run)."""
    make = layer_program if kind == "layer" else step_program
    fn, args = make(attention, n, q_block, kv_block, **kw)
    t = time.perf_counter()
    compiled = fn.lower(*_abstract(args)).compile()
    mem = compiled.memory_analysis()
    return {
        "temp_bytes": int(mem.temp_size_in_bytes),
        "argument_bytes": int(mem.argument_size_in_bytes),
        "output_bytes": int(mem.output_size_in_bytes),
        "compile_seconds": time.perf_counter() - t,
    }


def run_child(kind: str, attention: str, n: int, q_block: int, kv_block: int, repeats: int):
    """Runs in a fresh process: compile, one warm-up call, ``repeats`` timed calls."""
    make = layer_program if kind == "layer" else step_program
    call = repeated(*make(attention, n, q_block, kv_block))
    call()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    return {
        "seconds_median": statistics.median(times),
        "seconds": times,
        "peak_rss_bytes": peak_rss(),
    }


def measured(kind, attention, n, q_block, kv_block, repeats, timeout):
    cmd = [
        sys.executable, "-m", "benchmarks.long_inputs", "--child",
        json.dumps([kind, attention, n, q_block, kv_block, repeats]),
    ]  # fmt: skip
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=child_env()
        )
    except subprocess.TimeoutExpired:
        return {"note": f"not measured: over the {timeout:.0f} s child timeout"}
    if proc.returncode != 0:
        return {"note": f"child failed (rc {proc.returncode}): {proc.stderr[-300:]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- the notes' table -------------------------------------------------------------------------


def notes_bytes(n: int) -> int:
    """The notes' figures (2 MB at 1,000, 200 MB at 10,000, 20 GB at 100,000) are n² × 2 bytes:
    one n × n score matrix in a 2-byte float (fp16/bf16), for one head of one layer."""
    return 2 * n * n


def human(b: float | None) -> str:
    if b is None:
        return "—"
    for unit, size in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= size:
            return f"{b / size:.1f} {unit}"
    return f"{b:.0f} B"


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for kind, style in (("layer", "-"), ("step", "--")):
        for attention, color in (("dense", "tab:red"), ("chunked", "tab:blue")):
            pts = [(r["n"], r["temp_bytes"]) for r in results[kind] if r["attention"] == attention]
            if pts:
                x, y = zip(*pts)
                label = f"{attention}, {'one attention layer' if kind == 'layer' else 'train step'}"
                ax.loglog(x, np.array(y) / 2**20, style, color=color, marker="o", label=label)
    ns = np.array(sorted({r["n"] for r in results["layer"]}))
    ax.loglog(
        ns,
        np.array([notes_bytes(int(n)) for n in ns]) / 2**20,
        ":",
        color="gray",
        label="notes: n² × 2 bytes",
    )
    ax.set_xlabel("sequence length n (tokens)")
    ax.set_ylabel("compiled temp memory, fwd + bwd (MiB)")
    ax.set_title("Attention memory: dense grows as n², chunked as n")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


# -- main ---------------------------------------------------------------------------------------


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", default="1024,2048,4096,8192,16384,32768")
    p.add_argument("--kinds", default="layer,step", help="layer and/or step")
    p.add_argument("--q-block", type=int, default=256)
    p.add_argument("--kv-block", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3, help="timed calls per measured point")
    p.add_argument(
        "--budget-gib", type=float, default=8.0, help="skip runs predicted to need more memory"
    )
    p.add_argument("--max-seconds", type=float, default=120.0, help="skip runs predicted longer")
    p.add_argument("--no-run", action="store_true", help="memory_analysis only, nothing run")
    p.add_argument("--preset", action="store_true", help="configs/tatoeba_long.yaml's step")
    p.add_argument("--preset-only", action="store_true", help="only --preset")
    p.add_argument("--speed", type=int, default=0, help="alternating dense/chunked steps (N)")
    p.add_argument("--png", default=str(ROOT / "docs" / "attention_memory.png"))
    p.add_argument("--out", default=None, help="write the figures as JSON")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def sweep(args) -> dict:
    results: dict[str, list] = {"layer": [], "step": []}
    for kind in args.kinds.split(","):
        last_time: dict[str, tuple[int, float]] = {}
        for n in [int(x) for x in args.lengths.split(",")]:
            for attention in ("dense", "chunked"):
                mem = compiled_memory(kind, attention, n, args.q_block, args.kv_block)
                row = {"n": n, "attention": attention, **mem}
                need = mem["temp_bytes"] + mem["argument_bytes"] + mem["output_bytes"]
                predicted = None
                if attention in last_time:  # both paths do O(n²) work: time grows ~n²
                    n0, t0 = last_time[attention]
                    predicted = t0 * (n / n0) ** 2 * (args.repeats + 2)
                if args.no_run:
                    row["note"] = "not run (--no-run)"
                elif need > args.budget_gib * GIB:
                    row["note"] = (
                        f"not run: memory_analysis predicts {human(need)} > "
                        f"--budget-gib {args.budget_gib:g}"
                    )
                elif predicted is not None and predicted > args.max_seconds:
                    row["note"] = (
                        f"not run: predicted {predicted:.0f} s > --max-seconds {args.max_seconds:g}"
                    )
                else:
                    row.update(
                        measured(
                            kind, attention, n, args.q_block, args.kv_block, args.repeats,
                            timeout=4 * args.max_seconds + 120,
                        )
                    )  # fmt: skip
                    if "seconds_median" in row:
                        last_time[attention] = (n, row["seconds_median"])
                results[kind].append(row)
                say(
                    f"{kind:5s} n={n:6d} {attention:7s} temp {human(mem['temp_bytes']):>10s}"
                    f"  rss {human(row.get('peak_rss_bytes')):>10s}"
                    f"  time {row.get('seconds_median', float('nan')):8.3f} s"
                    f"  {row.get('note', '')}"
                )
    return results


def preset_memory(args) -> dict:
    config = load_config(str(ROOT / "configs" / "tatoeba_long.yaml"), [])
    d, m = config.data, config.model
    rows = d.max_tokens // d.max_len
    out: dict[str, Any] = {"rows": rows, "max_len": d.max_len}
    for attention in ("dense", "chunked"):
        out[attention] = compiled_memory(
            "step", attention, d.max_len, m.attention_q_block, m.attention_kv_block,
            rows=rows, config=config,
        )  # fmt: skip
        say(
            f"tatoeba_long step ({rows} x {d.max_len}) {attention:7s}: temp "
            f"{human(out[attention]['temp_bytes'])}, arguments "
            f"{human(out[attention]['argument_bytes'])}"
        )
    out["dense_over_chunked"] = out["dense"]["temp_bytes"] / out["chunked"]["temp_bytes"]
    say(f"dense / chunked temp memory: {out['dense_over_chunked']:.1f}x")
    return out


def speed(args) -> dict:
    """Step time of the default preset (64 × 64 tokens), alternating dense and chunked."""
    # the batch size the recipe picks for the shipped corpus (seq2seq/resolve.py)
    config = resolve(str(ROOT / "configs" / "tatoeba_en_es.yaml"), validate=False).config
    rows, n = config.data.max_tokens // config.data.max_len, config.data.max_len
    m = config.model
    programs = {
        a: repeated(*step_program(a, n, m.attention_q_block, m.attention_kv_block, rows=rows))
        for a in ("dense", "chunked")
    }
    times: dict[str, list[float]] = {"dense": [], "chunked": []}
    for call in programs.values():
        call()  # compile + warm up
    for _ in range(args.speed):
        for a, call in programs.items():
            t = time.perf_counter()
            call()
            times[a].append(time.perf_counter() - t)
    out: dict[str, Any] = {a: statistics.median(t) for a, t in times.items()}
    out["chunked_over_dense"] = out["chunked"] / out["dense"]
    out["samples"] = times
    out["load_average"] = list(os.getloadavg())
    say(
        f"default preset step ({rows} x {n}), median of {args.speed} alternating: dense "
        f"{out['dense']:.3f} s, chunked {out['chunked']:.3f} s "
        f"(chunked/dense {out['chunked_over_dense']:.2f}); load {out['load_average']}"
    )
    return out


def table(results: dict) -> str:
    lines = [
        "| n | notes (n² × 2 B) | layer dense | layer chunked | step dense | step chunked |",
        "|---|---|---|---|---|---|",
    ]
    by = {(k, r["attention"], r["n"]): r for k in results for r in results[k]}
    for n in sorted({r["n"] for k in results for r in results[k]}):
        cells = [f"{n:,}", human(notes_bytes(n))]
        for kind in ("layer", "step"):
            for attention in ("dense", "chunked"):
                r = by.get((kind, attention, n))
                if r is None:
                    cells.append("—")
                    continue
                cell = human(r["temp_bytes"])
                if "peak_rss_bytes" in r:
                    cell += f" (RSS {human(r['peak_rss_bytes'])}, {r['seconds_median']:.2f} s)"
                cells.append(cell)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(run_child(*json.loads(args.child))))
        return 0
    say(
        f"jax {jax.__version__}, backend {jax.default_backend()}, {os.cpu_count()} CPUs, "
        f"load {os.getloadavg()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    report: dict[str, Any] = {"args": vars(args), "load_start": list(os.getloadavg())}
    if not args.preset_only:
        report["sweep"] = sweep(args)
        say("\n" + table(report["sweep"]))
        if args.png:
            plot(report["sweep"], Path(args.png))
            say(f"wrote {args.png}")
    if args.preset or args.preset_only:
        report["preset"] = preset_memory(args)
    if args.speed:
        report["speed"] = speed(args)
    report["load_end"] = list(os.getloadavg())
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
