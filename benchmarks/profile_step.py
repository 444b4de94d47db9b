#!/usr/bin/env python3
"""Where a training step's time goes, ours against PyTorch MarianMT at the same precision
(float32): the forward pass with the loss, the backward pass, and the rest of the step (gradient
clipping and the AdamW update), for the fixed ``tiny`` and ``base`` presets of
``benchmarks/presets.py`` on the random batches ``benchmarks/compare.py`` trains on.

Each side is timed in three nested programs, alternating between the sides call by call:
forward (loss only), forward + backward (the gradients), and the whole training step; the
phases are their differences (medians over ``--calls``). Ours: ``jax.jit`` of the loss
(``seq2seq.training.step._forward``), of its ``jax.grad``, and the training loop's step
(``seq2seq.training.context.train_context``).
PyTorch: the model's forward and cross-entropy with autograd on, then ``backward()``, then
``clip_grad_norm_`` and ``AdamW.step()``, as ``benchmarks/compare.py`` trains it.

Usage::

    python -m benchmarks.profile_step --preset tiny,base --calls 10 --json runs/profile.json

Needs the ``compare`` extra (torch, transformers).
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

import jax

from benchmarks import harness
from benchmarks.harness import machine_info
from benchmarks.peers import Marian
from benchmarks.presets import FIXED, fixed_batches
from seq2seq.config import ModelConfig, TrainConfig
from seq2seq.data.tokenizer import BOS_ID
from seq2seq.training.step import _forward

PHASES = ("forward", "backward", "clip + AdamW")


def ours(model_cfg: ModelConfig, train_cfg: TrainConfig, batch: dict):
    """Three callables over one batch: loss, gradients, whole step (each blocks until done).
    The step is the training loop's (``harness.train_step``: its state donated, so each call
    continues from the last one's state); the loss and gradients read the current weights."""
    context, state = harness.train_step(model_cfg, train_cfg)
    holder = {"state": state}
    key = jax.random.key(0)
    micro = harness.micro_batch(batch)
    batch = {k: jax.numpy.asarray(v) for k, v in batch.items()}

    def loss(params, batch, key):
        return _forward(params, context.graphdef, batch, BOS_ID, train_cfg.label_smoothing, key)[0]

    forward, backward = jax.jit(loss), jax.jit(jax.grad(loss))

    def step():
        holder["state"], metrics = context.step(holder["state"], micro)
        jax.block_until_ready(metrics)

    return (
        lambda: jax.block_until_ready(forward(holder["state"].params, batch, key)),
        lambda: jax.block_until_ready(backward(holder["state"].params, batch, key)),
        step,
    )


def pytorch(peer: Marian, batch: dict):
    """The same three programs for the PyTorch peer (float32, dropout on)."""
    import torch
    import torch.nn.functional as F

    model, cfg = peer.model, peer.train_cfg
    model.train()
    src, tgt = peer.ids(batch["src"]), peer.ids(batch["tgt"])
    start = torch.full_like(tgt[:, :1], peer.pad)
    decoder_in = torch.cat([start, tgt[:, :-1]], 1)

    def loss():
        logits = model(
            input_ids=src, attention_mask=torch.ones_like(src), decoder_input_ids=decoder_in
        ).logits
        return F.cross_entropy(
            logits.flatten(0, 1), tgt.flatten(), label_smoothing=cfg.label_smoothing
        )

    def forward():
        loss()

    def backward():
        peer.optimizer.zero_grad(set_to_none=True)
        loss().backward()

    def step():
        backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_norm)
        peer.optimizer.step()

    return forward, backward, step


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def profile(name: str, calls: int, threads: int, directory: Path) -> dict:
    import torch

    torch.set_num_threads(threads)
    spec = FIXED[name]
    model_cfg = ModelConfig(**spec["model"], dropout_rate=0.1)
    train_cfg = TrainConfig(label_smoothing=0.1)
    batch = fixed_batches(1, spec["batch"], spec["length"], model_cfg.vocab_size)[0]
    sides = {
        "ours": ours(model_cfg, train_cfg, batch),
        "pytorch": pytorch(
            Marian({"model": model_cfg, "train": train_cfg}, directory / name, threads), batch
        ),
    }
    for fns in sides.values():  # compile, allocate, warm up
        for fn in fns:
            fn(), fn()
    seconds: dict[str, list[list[float]]] = {side: [[], [], []] for side in sides}
    for _ in range(calls):  # alternate: both sides see the same machine state
        for side, fns in sides.items():
            for i, fn in enumerate(fns):
                seconds[side][i].append(timed(fn))
    out = {}
    for side, lists in seconds.items():
        fwd, fwd_bwd, whole = (statistics.median(x) for x in lists)
        out[side] = dict(zip(PHASES, (fwd, fwd_bwd - fwd, whole - fwd_bwd)), step=whole)
    return out


def markdown(result: dict) -> str:
    lines = [
        f"`benchmarks/profile_step.py`, {result['date']}: {result['machine']}, float32 both "
        f"sides, {result['calls']} alternating calls per program, medians (ms).",
        "",
        "| preset | phase | ours ms | PyTorch ms | ours / PyTorch time |",
        "|---|---|--:|--:|--:|",
    ]
    for name, r in result["presets"].items():
        for phase in (*PHASES, "step"):
            a, b = 1000 * r["ours"][phase], 1000 * r["pytorch"][phase]
            lines.append(f"| {name} | {phase} | {a:.1f} | {b:.1f} | {a / b:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="tiny,base")
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--json", help="write the figures as JSON here")
    a = p.parse_args(argv)
    threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{machine_info('float32').get('cpu', 'cpu')}, {threads} threads",
        "calls": a.calls,
        "presets": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.preset.split(","):
            result["presets"][name] = profile(name, a.calls, threads, Path(tmp))
    print(markdown(result))
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
