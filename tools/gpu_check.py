"""The checks that need an accelerator, ready before one is lent (issue 34); run by
``tools/gpu_check.sh`` after the GPU-marked tests, as ``python -m tools.gpu_check`` from the
repository root.

Sections, each printed as measured and written together as JSON (``--out``):

* ``bench``: one training step of ``configs/transformer_base.yaml`` and
  ``configs/transformer_big.yaml`` (their model, ``data.max_tokens`` and ``data.max_len``;
  ``model.dtype=bfloat16``) on random tokens with no padding: median step time of ``--steps``
  steps after 2 untimed ones, target tokens/s, model FLOPs (``seq2seq.model.flops``) and MFU
  against a bfloat16 ``jnp.dot`` peak measured in the same run (and against the device's
  nominal dense bfloat16 peak when its kind is known); next to them, what ``seq2seq-plan``
  reads from the same compiled step (peak memory, roofline step time; ``seq2seq.plan``)
  against the measured peak (``device.memory_stats()``) and step time.
* ``attention``: ``model.attention=cudnn`` against ``dense`` on packed batches of the shipped
  corpus (``PackedBatches``: segments and padding queries as in training): the largest
  difference of the outputs and of the gradients, and whether either has a NaN.
* ``train``: the real ``seq2seq-train`` for ``--train-steps`` steps of
  ``transformer_base.yaml`` on the synthetic WMT-size corpus of ``benchmarks/data_scale.py``
  (``benchmarks.harness.build_corpus``)
  (``--pairs`` pairs), reporting its log's start-up phases and its last loss.

``--dry`` shrinks everything (a tiny model, 2 steps, 64-token batches, 2,000 pairs, the
``dense`` path standing in for ``cudnn`` off GPU) so the suite runs it on CPU in about a
minute: it checks the script, not the speed.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.harness import SHIPPED, build_corpus
from seq2seq import plan
from seq2seq.config import load_config, replace
from seq2seq.data.batching import PackedBatches
from seq2seq.model.attention import SegmentMask, dot_product_attention
from seq2seq.model.flops import train_flops_per_step
from seq2seq.sharding import Partitioner
from seq2seq.training.context import train_context

ROOT = Path(__file__).resolve().parent.parent

# Nominal dense bfloat16 peaks (FLOP/s) of the accelerators the presets are meant for.
NOMINAL_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12}
DRY_MODEL = dict(d_model=32, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, d_ff=64)


def say(*parts: Any) -> None:
    print(*parts, flush=True)


def bf16_peak(size: int, repeats: int) -> float:
    """Median FLOP/s of a ``size``² bfloat16 ``jnp.dot`` (float32 accumulation)."""
    a = jnp.ones((size, size), jnp.bfloat16)
    dot = jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32))
    jax.block_until_ready(dot(a, a))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(dot(a, a))
        times.append(time.perf_counter() - t)
    return 2 * size**3 / statistics.median(times)


def nominal_peak() -> float | None:
    kind = jax.devices()[0].device_kind
    return next((v for k, v in NOMINAL_BF16.items() if k in kind), None)


def bench(preset: str, steps: int, dry: bool, peak: float) -> dict[str, Any]:
    """Time the train step of ``configs/{preset}.yaml`` in bfloat16 on random full rows."""
    config = load_config(ROOT / "configs" / f"{preset}.yaml", ["model.dtype=bfloat16"])
    d = config.data
    rows, length = max(1, d.max_tokens // d.max_len), d.max_len
    model_cfg = replace(config.model, vocab_size=config.tokenizer.vocab_size)
    if dry:
        model_cfg = replace(model_cfg, vocab_size=200, **DRY_MODEL)
        rows, length = 2, 32
    # the training loop's step (seq2seq.training.context), from seed 0
    context = train_context(
        replace(config, model=model_cfg, **{"train.seed": 0, "train.time_budget": 0}),
        Partitioner.single_device(),
    )
    state, step = context.fresh_state(), context.step
    rng = np.random.default_rng(0)
    ones = np.ones((rows, length), np.int32)
    host = {
        "src": rng.integers(4, model_cfg.vocab_size, (rows, length)).astype(np.int32),
        "tgt": rng.integers(4, model_cfg.vocab_size, (rows, length)).astype(np.int32),
        "src_segments": ones,
        "tgt_segments": ones,
        "src_positions": np.broadcast_to(np.arange(length, dtype=np.int32), (rows, length)),
        "tgt_positions": np.broadcast_to(np.arange(length, dtype=np.int32), (rows, length)),
    }
    batch = {k: jnp.asarray(v)[None] for k, v in host.items()}  # one micro-batch
    # the planner's figures for this very program on this device (seq2seq-plan's reading of
    # a compiled step), to print next to what the device measures
    lowered = step.lower(state, batch)  # type: ignore[attr-defined]
    figures = plan.compile_lowered(lowered, config)
    times = []
    for i in range(steps + 2):
        t = time.perf_counter()
        state, metrics = step(state, batch)
        jax.block_until_ready((state, metrics))
        if i >= 2:
            times.append(time.perf_counter() - t)
    median = statistics.median(times)
    flops = train_flops_per_step(model_cfg, rows, length, length)
    nominal = nominal_peak()
    device = jax.devices()[0]
    stats = device.memory_stats() or {}
    figures_of = plan.device_of(device.device_kind)
    predicted = plan.roofline_seconds(figures, figures_of) if figures_of else None
    res: dict[str, Any] = {
        "preset": preset,
        "batch": [rows, length],
        "step_seconds": median,
        "target_tokens_per_second": rows * length / median,
        "model_tflops_per_step": flops / 1e12,
        "achieved_tflops_per_second": flops / median / 1e12,
        "mfu_of_measured_peak": flops / median / peak,
        "mfu_of_nominal_peak": flops / median / nominal if nominal else None,
        "loss": float(metrics["loss"] / metrics["tokens"]),
        "plan_peak_bytes": figures.peak,
        "measured_peak_bytes": stats.get("peak_bytes_in_use"),
        "plan_step_seconds": predicted,
    }
    say(
        f"bench {preset}: batch {rows}x{length}, step {median * 1e3:.1f} ms, "
        f"{res['target_tokens_per_second']:.0f} target tokens/s, "
        f"{res['achieved_tflops_per_second']:.1f} TFLOP/s, MFU {res['mfu_of_measured_peak']:.1%}"
        f" of the measured peak"
        + (f", {res['mfu_of_nominal_peak']:.1%} of the nominal" if nominal else "")
    )
    measured_peak = res["measured_peak_bytes"]
    say(
        f"  plan vs measured: peak memory {figures.peak / 1e9:.2f} GB planned, "
        + (f"{measured_peak / 1e9:.2f} GB measured" if measured_peak else "not measured here")
        + "; step "
        + (f"≥ {predicted * 1e3:.1f} ms planned (roofline)" if predicted else "no device figures")
        + f", {median * 1e3:.1f} ms measured"
    )
    return res


def attention_check(dry: bool) -> dict[str, Any]:
    """cuDNN against dense attention on packed batches of the shipped corpus (token ids are
    only used for their lengths: queries, keys and values are random)."""
    lines = gzip.decompress((SHIPPED / "train.en.gz").read_bytes()).decode().splitlines()[:4000]
    lengths = [min(len(x.split()) + 1, 64) for x in lines]
    ids = [np.full(n, 5, np.int32) for n in lengths]
    rows, max_len = (4, 64) if dry else (64, 128)
    packed = PackedBatches(ids, ids, max_len=max_len, rows=rows, seed=0)
    segments = jnp.asarray(packed.batch_at(0)["src_segments"])
    empty_rows = int((~np.asarray(SegmentMask(segments, segments).dense()).any(-1)).sum())
    heads, head_dim = 8, 64
    rng = np.random.default_rng(0)
    q, k, v = (
        jnp.asarray(rng.normal(size=(rows, max_len, heads, head_dim)), jnp.float32)
        for _ in range(3)
    )
    cudnn = "dense" if dry and jax.default_backend() != "gpu" else "cudnn"

    def loss(implementation, q, k, v):
        mask = SegmentMask(segments, segments)
        out = dot_product_attention(q, k, v, mask, implementation=implementation)
        return jnp.sum(out.astype(jnp.float32) ** 2), out

    results = {}
    for name in ("dense", cudnn):
        fn = jax.jit(jax.value_and_grad(lambda *a, n=name: loss(n, *a), (0, 1, 2), has_aux=True))
        (_, out), grads = fn(q, k, v)
        results[name] = (np.asarray(out, np.float32), [np.asarray(g) for g in grads])
    (d_out, d_grads), (c_out, c_grads) = results["dense"], results[cudnn]
    res = {
        "implementation": cudnn,
        "batch": [rows, max_len],
        "padding_queries": empty_rows,
        "nan": bool(np.isnan(c_out).any() or any(np.isnan(g).any() for g in c_grads)),
        "max_output_difference": float(np.abs(c_out - d_out).max()),
        "max_gradient_difference": float(
            max(np.abs(a - b).max() for a, b in zip(c_grads, d_grads))
        ),
    }
    say(
        f"attention {cudnn} vs dense on packed {rows}x{max_len} ({empty_rows} padding queries): "
        f"NaN {res['nan']}, max |Δ| output {res['max_output_difference']:.3g}, "
        f"gradients {res['max_gradient_difference']:.3g}"
    )
    return res


def train_run(out: Path, pairs: int, steps: int, dry: bool) -> dict[str, Any]:
    """The real ``seq2seq-train`` on the synthetic corpus (``transformer_base.yaml``)."""
    prefix = build_corpus(pairs, 4, out / "corpus")
    workdir = out / f"base{pairs}"
    overrides = [
        f"workdir={workdir}",
        *(f"data.{split}.format=text" for split in ("train", "dev", "test")),
        f"data.train.path={prefix}",
        f"data.dev.path={SHIPPED / 'dev'}",
        f"data.test.path={SHIPPED / 'test'}",
        "data.src_lang=en",
        "data.tgt_lang=es",
        f"train.steps={steps}",
        f"train.log_every={max(1, steps // 5)}",
        f"train.eval_every={steps}",
        f"train.checkpoint_every={steps}",
        "train.dev_bleu=false",
        "train.best_metric=loss",
        "decode.test_limit=16",
        "model.dtype=bfloat16",
    ]
    if dry:
        overrides += ["tokenizer.vocab_size=500", "data.max_tokens=256", "data.max_len=64"]
        overrides += [f"model.{k}={v}" for k, v in DRY_MODEL.items()]
    command = [sys.executable, "-m", "seq2seq", "train", "--config"]
    command += [str(ROOT / "configs" / "transformer_base.yaml"), *overrides]
    t = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - t
    log = proc.stdout + proc.stderr
    (out / "train.log").write_text(log)
    data = re.search(r"seq2seq.data.pipeline: data: (.*)", log)
    metrics = workdir / "metrics.jsonl"
    lines = metrics.read_text().splitlines() if metrics.is_file() else []
    records = [json.loads(x) for x in lines if x.strip()]
    losses = [r["loss"] for r in records if r.get("split") == "train" and "loss" in r]
    res = {
        "returncode": proc.returncode,
        "seconds": seconds,
        "pairs": pairs,
        "steps": steps,
        "data": data.group(1) if data else None,
        "losses": losses,
    }
    say(f"train: exit {proc.returncode} in {seconds:.0f} s, losses {losses}")
    if proc.returncode:
        say(log[-3000:])
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry", action="store_true", help="tiny shapes on any backend (the suite)")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "gpu_check")
    p.add_argument("--steps", type=int, default=None, help="timed bench steps (10)")
    p.add_argument("--train-steps", type=int, default=None, help="seq2seq-train steps (50)")
    p.add_argument("--pairs", type=int, default=None, help="synthetic corpus pairs (200,000)")
    p.add_argument("--only", default="bench,attention,train")
    a = p.parse_args(argv)
    steps = a.steps or (2 if a.dry else 10)
    a.out.mkdir(parents=True, exist_ok=True)
    device = jax.devices()[0]
    record: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "backend": jax.default_backend(),
        "device": device.device_kind,
        "dry": a.dry,
    }
    say(f"gpu_check on {record['backend']} ({record['device']}){' (dry)' if a.dry else ''}")
    only = a.only.split(",")
    if "bench" in only:
        peak = bf16_peak(256 if a.dry else 8192, 3 if a.dry else 10)
        record["bf16_peak_tflops_per_second"] = peak / 1e12
        say(f"measured bfloat16 matmul peak {peak / 1e12:.1f} TFLOP/s")
        record["bench"] = [
            bench(name, steps, a.dry, peak) for name in ("transformer_base", "transformer_big")
        ]
    if "attention" in only:
        record["attention"] = attention_check(a.dry)
    if "train" in only:
        record["train"] = train_run(
            a.out,
            a.pairs or (2_000 if a.dry else 200_000),
            a.train_steps or (2 if a.dry else 50),
            a.dry,
        )
    (a.out / "gpu_check.json").write_text(json.dumps(record, indent=1, default=str))
    failed = record.get("attention", {}).get("nan") or record.get("train", {}).get("returncode")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
