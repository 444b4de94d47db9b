"""The fixed-shape presets (``tiny``, ``base``: random tokens, equal work with other toolkits)
and their measurement: ``FixedBench`` times a training step and fixed-length beam and greedy
decoding of a preset against a ``jnp.dot`` peak measured in the same run.

Shared by ``benchmark`` (which adds the shipped preset, data, memory and attention sections),
``compare`` (the same presets against PyTorch and CTranslate2) and ``profile_step``; never run.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from benchmarks import harness
from seq2seq.config import ModelConfig, TrainConfig
from seq2seq.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from seq2seq.decoding import beam_search_jit, greedy_search_jit
from seq2seq.model import build_model
from seq2seq.model.flops import matmul_params, train_flops_breakdown

FIRST_TOKEN = max(PAD_ID, UNK_ID, BOS_ID, EOS_ID) + 1  # random tokens are never special ids

# Fixed-shape presets: equal work with other toolkits (issue #8).
FIXED: dict[str, dict[str, Any]] = {
    "tiny": dict(
        model=dict(
            vocab_size=8000,
            d_model=256,
            num_heads=4,
            num_encoder_layers=3,
            num_decoder_layers=3,
            d_ff=1024,
        ),
        batch=64,
        length=32,
        decode_sentences=64,
        decode_length=16,
    ),
    "base": dict(
        model=dict(
            vocab_size=8000,
            d_model=512,
            num_heads=8,
            num_encoder_layers=6,
            num_decoder_layers=6,
            d_ff=2048,
        ),
        batch=32,
        length=32,
        decode_sentences=32,
        decode_length=16,
    ),
}
# the peak's matmul size and samples (benchmark.py's --peak-size, --peak-repeats)
PEAK_SIZE = {"cpu": 2048, "accelerator": 8192}
PEAK_REPEATS = 10

# Peers (PyTorch MarianMT, CTranslate2) are timed beside these figures by benchmarks/compare.py,
# in the same run: a ratio is only true when both sides ran together (issue 19).
GOALS: dict[str, Any] = {
    # issue 19: of the same-run peak of the matmuls' dtype (the bfloat16 one for bf16 operands)
    "train_mfu": {"tiny": 0.75, "base": 0.85},
    "train_real_token_share": 0.90,
    "test_split_beam4_seconds": 60.0,  # the shipped test split (2,780 sentences), whole
    "test_split_sentences": 2780,
}


def say(*parts: Any) -> None:
    print(*parts, flush=True)


def spread(values: list[float]) -> dict[str, float | int]:
    """Median, min, max and count of a list of measurements."""
    return {
        "median": float(statistics.median(values)),
        "min": float(min(values)),
        "max": float(max(values)),
        "n": len(values),
    }


def fmt(s: dict[str, float]) -> str:
    return f"{s['median']:.4g} (min {s['min']:.4g}, max {s['max']:.4g}, n={s['n']})"


def cost_flops(compiled) -> float | None:
    """XLA's FLOP count of a compiled executable (a dict, or a list of dicts in older JAX)."""
    try:
        cost = compiled.cost_analysis()
    except Exception:  # noqa: BLE001 - not every backend implements it
        return None
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else {}
    return float(cost["flops"]) if cost and "flops" in cost else None


def jit_cache_size(fn) -> int | None:
    size = getattr(fn, "_cache_size", None)
    return int(size()) if callable(size) else None


class CompileEvents:
    """Counts JAX compilations and their time (trace + lowering + backend compile).

    Uses ``jax.monitoring`` duration events, so it sees every compilation in the process,
    including ones inside library code (e.g. the Translator's per-shape beam search).
    """

    NAMES = (
        "/jax/core/compile/jaxpr_trace_duration",
        "/jax/core/compile/jaxpr_to_mlir_module_duration",
        "/jax/core/compile/backend_compile_duration",
    )

    def __init__(self):
        self.count, self.seconds = 0, 0.0
        jax.monitoring.register_event_duration_secs_listener(self._on_event)

    def _on_event(self, name: str, duration: float, **_: Any) -> None:
        if name in self.NAMES:
            self.seconds += duration
            if name == self.NAMES[-1]:
                self.count += 1

    def snapshot(self) -> tuple[int, float]:
        return self.count, self.seconds


def measure_peak(dtype: str, size: int, repeats: int) -> list[float]:
    """FLOP/s samples of an ``[size, size] @ [size, size]`` ``jnp.dot`` in ``dtype``.

    Accumulated in float32, as the model's matmuls are (``seq2seq.model.precision``): for
    bfloat16 that is also the fast path on CPUs with AVX512-BF16 (~2x a bf16 result).
    """
    key_a, key_b = jax.random.split(jax.random.key(0))
    a = jax.random.normal(key_a, (size, size), jnp.float32).astype(dtype)
    b = jax.random.normal(key_b, (size, size), jnp.float32).astype(dtype)
    dot = jax.jit(functools.partial(jnp.dot, preferred_element_type=jnp.float32))
    dot(a, b).block_until_ready()
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        dot(a, b).block_until_ready()
        out.append(2.0 * size**3 / (time.perf_counter() - t))
    return out


def peak_dtype(args: argparse.Namespace) -> str:
    """The dtype of the matmuls, whose peak MFU is measured against."""
    return "bfloat16" if "bfloat16" in (args.dtype, args.matmul_dtype) else "float32"


def fixed_batches(count: int, rows: int, length: int, vocab: int, seed: int = 0) -> list[dict]:
    """``count`` training batches of random tokens without padding (the fixed presets).

    Each is a dict of int32 ``[rows, length]`` arrays: ``src``/``tgt`` tokens drawn uniformly
    from ``[FIRST_TOKEN, vocab)``, ``*_segments`` all 1, ``*_positions`` 0..length-1.
    """
    rng = np.random.default_rng(seed)
    positions = np.broadcast_to(np.arange(length, dtype=np.int32), (rows, length))
    batches = []
    for _ in range(count):
        batch = {
            side: rng.integers(FIRST_TOKEN, vocab, (rows, length), np.int32)
            for side in ("src", "tgt")
        }
        for side in ("src", "tgt"):
            batch[f"{side}_segments"] = np.ones((rows, length), np.int32)
            batch[f"{side}_positions"] = positions.copy()
        batches.append(batch)
    return batches


def fixed_sources(n: int, length: int, vocab: int, seed: int = 1) -> np.ndarray:
    """int32 ``[n, length]`` random source tokens from ``[FIRST_TOKEN, vocab)``, the last EOS."""
    src = np.random.default_rng(seed).integers(FIRST_TOKEN, vocab, (n, length), dtype=np.int32)
    src[:, -1] = EOS_ID
    return src


def fixed_options(
    *,
    steps: int,
    warmup: int,
    decode_repeats: int,
    matmul_dtype: str = "float32",
    peak_size: int | None = None,
    peak_repeats: int = PEAK_REPEATS,
) -> argparse.Namespace:
    """The options ``FixedBench`` reads, with ``benchmark.py``'s defaults for the rest: the
    dtype float32 on CPU and bfloat16 on an accelerator, the peak's size by backend."""
    accelerator = jax.default_backend() != "cpu"
    return argparse.Namespace(
        steps=steps,
        warmup=warmup,
        decode_repeats=decode_repeats,
        dtype="bfloat16" if accelerator else "float32",
        matmul_dtype=matmul_dtype,
        peak_size=peak_size or PEAK_SIZE["accelerator" if accelerator else "cpu"],
        peak_repeats=peak_repeats,
        smoke=False,
    )


# -- the measurement --------------------------------------------------------------------------


class FixedBench:
    """Times the fixed presets (``train_fixed``, ``decode_fixed``, ``decode_fixed_greedy``)
    against the run's matmul peak; the figures it samples go to ``self.result``.

    ``args``: ``steps``, ``warmup``, ``decode_repeats``, ``dtype``, ``matmul_dtype``,
    ``peak_size``, ``peak_repeats`` and ``smoke`` (``fixed_options``, or benchmark.py's
    options); ``presets``: name → preset (default ``FIXED``).
    """

    def __init__(self, args: argparse.Namespace, presets: dict[str, dict[str, Any]] | None = None):
        self.args = args
        self.presets = FIXED if presets is None else presets
        self.events = CompileEvents()
        self.result: dict[str, Any] = {}
        self._peak_samples: list[float] = []
        self._float32_peak_samples: list[float] = []  # beside a bfloat16 peak only

    def fixed(self, name: str) -> dict[str, Any]:
        """Model config, batch and decode shapes of a fixed preset, and its train config."""
        spec = self.presets[name]
        a = self.args
        model = ModelConfig(
            **spec["model"], dropout_rate=0.1, dtype=a.dtype, matmul_dtype=a.matmul_dtype
        )
        return {**spec, "model": model, "train": TrainConfig(label_smoothing=0.1)}

    def peak(self) -> float:
        """Median matmul FLOP/s over every peak sample taken so far in this run."""
        if not self._peak_samples:
            self.sample_peak()
        return statistics.median(self._peak_samples)

    def float32_peak(self) -> float | None:
        """Median float32 matmul FLOP/s of this run when MFU is against the bfloat16 peak
        (what the same step would be held to in float32), else None."""
        if peak_dtype(self.args) == "float32":
            return None
        if not self._float32_peak_samples:
            self.sample_peak()
        return statistics.median(self._float32_peak_samples)

    def sample_peak(self) -> None:
        """Samples of the matmul peak (and, for bfloat16, of the float32 one beside it)."""
        a = self.args
        dtype = peak_dtype(a)
        self._peak_samples += measure_peak(dtype, a.peak_size, a.peak_repeats)
        self.result["peak"] = self._peak_entry(dtype, self._peak_samples)
        if dtype != "float32":
            self._float32_peak_samples += measure_peak("float32", a.peak_size, a.peak_repeats)
            self.result["float32_peak"] = self._peak_entry("float32", self._float32_peak_samples)

    def _peak_entry(self, dtype: str, samples: list[float]) -> dict[str, Any]:
        a = self.args
        s = spread(samples)
        say(
            f"peak: {a.peak_size}x{a.peak_size} {dtype} matmul "
            f"{s['median'] / 1e9:.1f} GFLOP/s (min {s['min'] / 1e9:.1f}, max {s['max'] / 1e9:.1f})"
        )
        return {
            "what": f"jnp.dot of two [{a.peak_size}, {a.peak_size}] {dtype} "
            "matrices accumulated in float32, 2·n³ FLOPs per call",
            "size": a.peak_size,
            "dtype": dtype,
            "gflops_per_second": {k: (v / 1e9 if k != "n" else v) for k, v in s.items()},
        }

    def train_fixed(self, name: str) -> dict[str, Any]:
        a = self.args
        spec = self.fixed(name)
        cfg = spec["model"]
        rows, length = spec["batch"], spec["length"]
        batches = fixed_batches(a.warmup + a.steps, rows, length, cfg.vocab_size)
        train_cfg = spec["train"]
        res = self.time_train(
            cfg,
            train_cfg,
            batches,
            rows,
            length,
            length,
            real_target_tokens=[rows * length] * a.steps,
        )
        res["config"] = (
            f"fixed preset {name}: random tokens, no padding, dropout 0.1, label "
            f"smoothing 0.1, AdamW; batch {rows}x{length}"
        )
        goal = GOALS["train_mfu"].get(name)
        res["goal_mfu"] = goal
        res["goal_met"] = bool(res["mfu"] >= goal) if goal is not None and not a.smoke else None
        if goal is not None:
            say(f"  goal MFU >= {goal:.0%}")
        return res

    def time_train(
        self,
        model_cfg: ModelConfig,
        train_cfg: TrainConfig,
        batches: list[dict],
        rows: int,
        src_len: int,
        tgt_len: int,
        *,
        real_target_tokens: list[int],
        bos_id: int = BOS_ID,
    ) -> dict[str, Any]:
        """Compile and time the training loop's step (``harness.train_step``) on ``batches``."""
        a = self.args
        context, state = harness.train_step(model_cfg, train_cfg, bos_id)
        n_params = int(sum(x.size for x in jax.tree.leaves(state.params)))
        train_step = context.step
        device_batches = [harness.micro_batch(b) for b in batches]
        cache_before = jit_cache_size(train_step)

        count0, _ = self.events.snapshot()
        t = time.perf_counter()
        compiled = train_step.lower(state, device_batches[0]).compile()
        compile_seconds = time.perf_counter() - t
        xla_flops = cost_flops(compiled)
        del compiled

        count1, _ = self.events.snapshot()
        times = []
        for i, batch in enumerate(device_batches):
            t = time.perf_counter()
            state, metrics = train_step(state, batch)
            jax.block_until_ready((state, metrics))
            if i >= a.warmup:
                times.append(time.perf_counter() - t)
        compilations_in_steps = self.events.snapshot()[0] - count1
        loss = float(metrics["loss"] / metrics["tokens"])
        cache_after = jit_cache_size(train_step)

        flops = train_flops_breakdown(model_cfg, rows, src_len, tgt_len)
        step = spread(times)
        med = step["median"]
        tokens = rows * (src_len + tgt_len)
        real_tgt = statistics.mean(real_target_tokens)
        achieved = flops["total"] / med
        res: dict[str, Any] = {
            "model": dataclasses.asdict(model_cfg),
            "parameters": n_params,
            "matmul_parameters": matmul_params(model_cfg),
            "batch_shape": {"rows": rows, "src_len": src_len, "tgt_len": tgt_len},
            "step_seconds": step,
            "tokens_per_second": tokens / med,
            "target_tokens_per_second": rows * tgt_len / med,
            "real_target_tokens_per_second": real_tgt / med,
            "real_target_tokens_per_step": real_tgt,
            "compile_seconds": compile_seconds,
            "compilations": {
                "jit_cache_entries": (
                    None if cache_after is None else cache_after - (cache_before or 0)
                ),
                "backend_compiles_during_steps": compilations_in_steps,
                "backend_compiles_for_first_step": count1 - count0,
            },
            "model_flops_per_step": flops["total"],
            "model_flops_breakdown": flops,
            "xla_flops_per_step": xla_flops,
            "xla_over_model_flops": (xla_flops / flops["total"]) if xla_flops else None,
            "achieved_gflops_per_second": achieved / 1e9,
            "final_loss": loss,
        }
        self.against_peaks(res)
        also = (
            f" ({res['of_float32_peak']:.1%} of the float32 peak)"
            if "of_float32_peak" in res
            else ""
        )
        say(
            f"  {model_cfg.d_model}d {model_cfg.num_encoder_layers}+{model_cfg.num_decoder_layers} "
            f"layers, {n_params / 1e6:.2f}M params, batch {rows}x{src_len}+{rows}x{tgt_len}: "
            f"step {fmt(step)} s; compile {compile_seconds:.1f} s"
        )
        nan = float("nan")
        say(
            f"  tokens/s {res['tokens_per_second']:.0f} (src+tgt), "
            f"target {res['target_tokens_per_second']:.0f}, "
            f"real target {res['real_target_tokens_per_second']:.0f}; "
            f"model {flops['total'] / 1e9:.1f} GFLOP/step vs XLA "
            f"{(xla_flops or nan) / 1e9:.1f} (ratio {res['xla_over_model_flops'] or nan:.3f}); "
            f"{achieved / 1e9:.1f} GFLOP/s, MFU {res['mfu']:.1%}{also}; jit cache entries "
            f"{res['compilations']['jit_cache_entries']}, "
            f"compiles during steps {compilations_in_steps}"
        )
        return res

    def against_peaks(self, res: dict[str, Any]) -> None:
        """``res``'s MFU against the run's peak (median of its samples so far), and beside a
        bfloat16 peak its share of the float32 one, from its achieved FLOP/s."""
        achieved = res["achieved_gflops_per_second"] * 1e9
        peak, f32_peak = self.peak(), self.float32_peak()
        res["peak_gflops_per_second"] = peak / 1e9
        res["mfu"] = achieved / peak
        if f32_peak:
            res["float32_peak_gflops_per_second"] = f32_peak / 1e9
            res["of_float32_peak"] = achieved / f32_peak

    def decode_fixed(self, name: str) -> dict[str, Any]:
        """Beam 4 at equal work (``_decode_fixed``)."""
        return self._decode_fixed(name, beam_size=4)

    def decode_fixed_greedy(self, name: str) -> dict[str, Any]:
        """Greedy search at equal work (``_decode_fixed``), on the same sources as beam 4."""
        return self._decode_fixed(name, beam_size=1)

    def _decode_fixed(self, name: str, *, beam_size: int) -> dict[str, Any]:
        """``decode_sentences`` sources of ``fixed_sources`` → exactly ``decode_length`` tokens.

        EOS is forbidden before the last position and forced there (min_length = max_len =
        ``decode_length``), so every sentence takes ``decode_length`` decoder steps. Sentences/s
        are the median and min–max of ``--decode-repeats`` calls after an untimed one; the
        compile time is that of ``lower(...).compile()``.
        """
        a = self.args
        spec = self.fixed(name)
        cfg = dataclasses.replace(spec["model"], dropout_rate=0.0)
        n, length = spec["decode_sentences"], spec["decode_length"]
        graphdef, params = nnx.split(build_model(cfg, 0), nnx.Param)
        src = fixed_sources(n, length, cfg.vocab_size)
        args = (
            params,
            jnp.asarray(src),
            jnp.ones((n, length), jnp.int32),
            jnp.full((n,), length, jnp.int32),
        )
        kw = dict(
            graphdef=graphdef,
            max_len=length,
            min_length=length,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            pad_id=PAD_ID,
        )
        if beam_size == 1:
            search, method = greedy_search_jit, "greedy_search"
        else:
            search, method = beam_search_jit, "beam_search"
            kw.update(beam_size=beam_size, alpha=0.6, length_penalty_kind="gnmt")
        t = time.perf_counter()
        search.lower(*args, **kw).compile()
        compile_s = time.perf_counter() - t
        out = search(*args, **kw)
        lengths = (
            np.sum(np.asarray(out[0]) != PAD_ID, axis=1)
            if beam_size == 1
            else np.asarray(out.lengths)[:, 0]
        )
        times = []
        for _ in range(a.decode_repeats):
            t = time.perf_counter()
            jax.block_until_ready(search(*args, **kw))
            times.append(time.perf_counter() - t)
        s = spread(times)
        sps = {k: (n / v if k != "n" else v) for k, v in s.items()}
        sps["min"], sps["max"] = n / s["max"], n / s["min"]
        res = {
            "sentences": n,
            "source_tokens": length,
            "output_tokens": length,
            "beam_size": beam_size,
            "eos_suppressed": True,
            "all_outputs_exact_length": bool(np.all(lengths == length)),
            "seconds": s,
            "sentences_per_second": sps,
            "compile_seconds": compile_s,
            "model": dataclasses.asdict(cfg),
            "method": f"seq2seq.decoding.{method}, one batch of {n} random sources, "
            f"max_len = min_length = {length} (EOS only at the last position)",
        }
        search_name = "greedy" if beam_size == 1 else f"beam {beam_size}"
        say(
            f"  fixed {name}: {search_name}, {n} sources x {length} tokens -> {length} tokens: "
            f"{fmt(sps)} sentences/s (compile {compile_s:.1f} s)"
        )
        return res
