#!/usr/bin/env python3
"""Benchmarks: the figures a researcher checks before choosing a codebase (issue #8).

Prints each figure as it is measured and writes them all as JSON (``--out bench.json``).

Sections (``--only``, comma-separated; default all):

* ``train``: per config (``--preset``: ``tatoeba`` = configs/tatoeba_en_es.yaml on the real
  corpus with packing; ``tiny`` and ``base`` = fixed shapes of random tokens without padding,
  for comparison with other toolkits at equal work): step time (median and min–max of
  ``--steps`` steps after ``--warmup``), tokens/s, real target tokens/s, compile time of the
  step, compilations, batch shapes and real-token share of the pipeline, model FLOPs from
  ``seq2seq.model.flops`` against XLA's cost analysis, achieved FLOP/s and MFU against a
  ``jnp.dot`` peak measured in the same run.
* ``decode``: the shipped test split with greedy and beam 4 (sentences/s, tokens/s, compile
  time apart), the KV cache against a decoder that recomputes the prefix at every step, and
  fixed-shape beam-4 and greedy decoding (16 source and exactly 16 output tokens) for
  ``tiny``/``base`` (median and min–max of ``--decode-repeats`` calls).
* ``data``: SentencePiece tokenization throughput and time to the first batch (new run
  directory and cached).
* ``memory``: peak host RSS of training and of decoding, each in a child process (and peak
  device memory where the backend reports it).
* ``attention``: compiled temporary memory of one attention layer forward+backward against
  sequence length, default path versus a query-chunked path (O(n²) versus O(n)).

``--long`` runs the long-input benchmark of ``model.attention`` instead (dense against chunked
at n = 1k … 32k: memory_analysis, peak RSS and time of one attention layer and of a whole
train step, the notes' table, the curve; ``benchmarks/long_inputs.py``, whose options follow
``--long``; see its docstring).

``--smoke`` shrinks everything (tiny model, a corpus subset, 2 steps, a few sentences) so the
whole script runs in under a minute on 2 CPU cores; it checks that the script works, not speed.

Run from the repository root: ``python -m benchmarks.benchmark --out bench.json``. Figures are only
as good as the machine is quiet: ``meta.machine`` records the load average at start and end.
``benchmarks/compare.py`` times the same presets against PyTorch MarianMT and CTranslate2 in
one run.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from benchmarks.harness import (
    child_env,
    jsonable,
    machine_info,
    micro_batch,
    peak_rss,
    proc_status,
    run_experiment,
    train_step,
)
from benchmarks.presets import (
    FIXED,
    GOALS,
    PEAK_REPEATS,
    PEAK_SIZE,
    FixedBench,
    fmt,
    say,
    spread,
)
from seq2seq.config import Config, replace
from seq2seq.data.pipeline import decode_source_limit, fill_vocab_sizes, prepare
from seq2seq.decoding import greedy_search_jit
from seq2seq.model import build_model
from seq2seq.model.attention import MultiHeadAttention, dot_product_attention, segment_mask
from seq2seq.resolve import resolve
from seq2seq.translation import Translator, bucket_length

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ("data", "train", "decode", "attention", "memory")
PRESETS = ("tatoeba", "tiny", "base")

SMOKE_MODEL = dict(d_model=32, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, d_ff=64)
# --smoke: the fixed presets become the smoke-sized preset model on random tokens, with the
# preset's batch shape and optimizer, so that they share its compiled step (speed is not the
# point of a smoke run).
SMOKE_FIXED = dict(batch=8, length=32, decode_sentences=4, decode_length=8)


# -- small utilities --------------------------------------------------------------------------


def rss_now() -> int | None:
    """Current resident set size in bytes (Linux), else None."""
    return proc_status("VmRSS")


def device_memory() -> dict[str, int] | None:
    """``bytes_in_use`` / ``peak_bytes_in_use`` of device 0 when the backend reports them."""
    try:
        stats = jax.devices()[0].memory_stats()
    except Exception:  # noqa: BLE001 - backends without memory stats raise various errors
        return None
    if not stats:
        return None
    return {
        k: int(stats[k]) for k in ("bytes_in_use", "peak_bytes_in_use", "bytes_limit") if k in stats
    }


# -- the benchmark ----------------------------------------------------------------------------


class Bench(FixedBench):
    """Runs the selected sections and collects their figures in ``self.result``; the fixed
    presets are measured as ``benchmarks/presets.py`` does (the smoke-sized preset model
    with ``--smoke``)."""

    def __init__(self, args: argparse.Namespace):
        super().__init__(args)
        self._prepared = None
        self._config: Config | None = None

    # -- configuration ---------------------------------------------------------------------
    def config(self) -> Config:
        """The shipped small preset (or its smoke-sized version on a corpus subset)."""
        if self._config is None:
            a = self.args
            overrides = [
                f"workdir={a.cache_dir}",
                f"model.dtype={a.dtype}",
                f"model.matmul_dtype={a.matmul_dtype}",
            ]
            if a.smoke:
                corpus = write_smoke_corpus(Path(a.cache_dir) / "corpus")
                overrides += [
                    f"data.{split}.path={corpus / split}" for split in ("train", "dev", "test")
                ]
                overrides += [
                    "data.max_len=32",
                    "data.max_tokens=256",
                    "tokenizer.vocab_size=300",
                    "decode.max_tokens=256",
                ]
                overrides += [f"model.{k}={v}" for k, v in SMOKE_MODEL.items()]
            # resolved as seq2seq-train does: batch size and steps left to the recipe are
            # chosen from the corpus (seq2seq/resolve.py)
            self._config = resolve(a.config, overrides).config
        return self._config

    def prepared(self):
        """The preset's data in ``--cache-dir`` (tokenizer and token ids cached there)."""
        if self._prepared is None:
            config = self.config()
            Path(self.args.cache_dir).mkdir(parents=True, exist_ok=True)
            self._prepared = prepare(config, self.args.cache_dir)
            self._config = fill_vocab_sizes(config, self._prepared.tokenizer)
        return self._prepared

    def fixed(self, name: str) -> dict[str, Any]:
        """Model config, batch and decode shapes of a fixed preset, and its train config."""
        if self.args.smoke:
            self.prepared()
            return {**SMOKE_FIXED, "model": self.config().model, "train": self.config().train}
        return super().fixed(name)

    # -- data --------------------------------------------------------------------------------
    def run_data(self) -> None:
        say("\n== data ==")
        config = self.config()
        out: dict[str, Any] = {}
        with tempfile.TemporaryDirectory(prefix="bench-cold-") as cold:
            t = time.perf_counter()
            data = prepare(replace(config, workdir=cold), cold)  # as the training loop does
            data.train.batch_at(0)
            out["time_to_first_batch_new_run_seconds"] = time.perf_counter() - t
            out["note"] = (
                "prepare() + the first batch, as at the start of training; the "
                "Hugging Face datasets cache and the OS file cache may be warm"
            )
            out["new_run_stats"] = {
                k: data.stats.get(k)
                for k in (
                    "read_seconds",
                    "tokenizer_seconds",
                    "tokenize_sentences",
                    "tokenize_seconds",
                    "tokenize_sentences_per_second",
                )
            }
            cache = Path(self.args.cache_dir)
            if not (cache / "spm.model").is_file():  # seed the cache for the other sections
                cache.mkdir(parents=True, exist_ok=True)
                shutil.copytree(cold, cache, dirs_exist_ok=True)
            del data
        say(
            f"time to first batch, new run directory (reads, trains SentencePiece, tokenizes, "
            f"packs): {out['time_to_first_batch_new_run_seconds']:.2f} s"
        )

        self._prepared = None
        t = time.perf_counter()
        data = self.prepared()
        data.train.batch_at(0)
        out["time_to_first_batch_cached_seconds"] = time.perf_counter() - t
        out["cached_stats"] = {
            k: data.stats.get(k)
            for k in ("read_seconds", "tokenizer_seconds", "token_cache_seconds")
        }
        say(
            f"time to first batch, cached tokenizer and token ids: "
            f"{out['time_to_first_batch_cached_seconds']:.2f} s "
            f"(of which reading the corpus {data.stats['read_seconds']:.2f} s)"
        )

        corpus = self.train_text()
        texts = corpus[0] + corpus[1]
        tok = data.tokenizer
        samples = []
        for _ in range(self.args.tokenize_repeats):
            t = time.perf_counter()
            tok.source.encode(corpus[0])
            tok.target.encode(corpus[1])
            samples.append(len(texts) / (time.perf_counter() - t))
        out["tokenize_sentences_per_second"] = spread(samples)
        out["tokenize_sentences"] = len(texts)
        out["tokenize_threads"] = "SentencePiece num_threads=0 (all cores)"
        say(
            f"SentencePiece encode, both sides of the training split ({len(texts)} sentences): "
            f"{fmt(spread(samples))} sentences/s"
        )
        self.result["data"] = out

    def train_text(self) -> tuple[list[str], list[str]]:
        from seq2seq.data.sources import load_parallel

        d = self.config().data
        ds = load_parallel(d.train, d.src_lang, d.tgt_lang, skip_empty=d.skip_empty)
        return list(ds["source"]), list(ds["target"])

    # -- training ----------------------------------------------------------------------------
    def run_train(self) -> None:
        say("\n== train ==")
        self.peak()
        out: dict[str, Any] = {}
        for name in self.args.presets:
            if name == "tatoeba":
                out[name] = self.train_tatoeba()
            else:
                out[name] = self.train_fixed(name)
        self.result["train"] = out

    def train_tatoeba(self) -> dict[str, Any]:
        a = self.args
        data = self.prepared()
        config = self.config()
        n = a.warmup + a.steps
        host, shapes, shares, real_tgt = [], set(), [], []
        batches = []
        for k in range(max(a.shape_batches, n)):
            t = time.perf_counter()
            batch = data.train.batch_at(k)
            host.append(time.perf_counter() - t)
            if k < a.shape_batches:
                shapes.add(tuple((f, v.shape, str(v.dtype)) for f, v in sorted(batch.items())))
                real = (batch["src_segments"] > 0).sum() + (batch["tgt_segments"] > 0).sum()
                shares.append(float(real) / (batch["src"].size + batch["tgt"].size))
            if k < n:
                batches.append(batch)
                real_tgt.append(int((batch["tgt_segments"] > 0).sum()))
        rows, length = batches[0]["src"].shape
        res = self.time_train(
            config.model,
            config.train,
            batches,
            rows,
            length,
            length,
            real_target_tokens=real_tgt[a.warmup :],
            bos_id=data.tokenizer.bos_id,
        )
        res["config"] = (
            f"{a.config} (shipped small preset, real corpus, packing={config.data.packing})"
        )
        res["pipeline"] = {
            "batches_checked": a.shape_batches,
            "distinct_batch_shapes": len(shapes),
            "real_token_share": spread(shares),
            "epoch_real_token_share": data.stats.get("train_real_token_share"),
            "host_batch_seconds": spread(host),
            "goal_real_token_share": GOALS["train_real_token_share"],
            "goal_met": (
                bool(statistics.mean(shares) >= GOALS["train_real_token_share"])
                if not a.smoke
                else None
            ),
        }
        say(
            f"  pipeline: {len(shapes)} distinct batch shape(s) over {a.shape_batches} batches; "
            f"real-token share {fmt(spread(shares))}; host time per batch "
            f"{statistics.median(host) * 1e3:.1f} ms (not in the step time)"
        )
        return res

    def rescale_mfu(self) -> None:
        """MFU against the median of all peak samples of the run (start and end)."""
        for res in self.result.get("train", {}).values():
            self.against_peaks(res)
            goal = res.get("goal_mfu")
            if goal is not None and not self.args.smoke:
                res["goal_met"] = bool(res["mfu"] >= goal)

    # -- decoding ----------------------------------------------------------------------------
    def decode_model(self) -> tuple[Config, Any, Any, Any, str]:
        """(config, tokenizer, graphdef, params, what) of the trained run or a random model."""
        a = self.args
        if a.workdir:
            from seq2seq.trained import load_trained

            config, tokenizer, graphdef, params = load_trained(a.workdir)
            return config, tokenizer, graphdef, params, f"trained run {a.workdir}"
        data = self.prepared()
        config = self.config()
        model = build_model(config.model, config.train.seed)
        graphdef, params = nnx.split(model, nnx.Param)
        return (
            config,
            data.tokenizer,
            graphdef,
            params,
            "randomly initialised model of the preset (untrained: outputs run to the length "
            "limit, so this is a worst case; pass --workdir of a trained run)",
        )

    def test_sources(self, config: Config) -> list[str]:
        """Source sentences of the test split of ``config`` (the trained run's, with --workdir)."""
        from seq2seq.data.sources import load_parallel

        d = config.data
        ds = load_parallel(
            d.test, d.src_lang, d.tgt_lang, skip_empty=d.skip_empty, split_name="test"
        )
        return list(ds["source"])

    def run_decode(self) -> None:
        say("\n== decode ==")
        a = self.args
        out: dict[str, Any] = {}
        if "tatoeba" in a.presets:
            config, tokenizer, graphdef, params, what = self.decode_model()
            out["model"] = what
            say(f"model: {what}")
            split = self.test_sources(config)
            sources = split[: a.decode_limit] if a.decode_limit else split
            out["test_split"] = {}
            for beam in a.beams:
                out["test_split"][f"beam{beam}"] = self.decode_test(
                    config,
                    tokenizer,
                    graphdef,
                    params,
                    sources,
                    beam,
                    full=len(sources) == len(split),
                )
            out["kv_cache"] = self.kv_cache(config, tokenizer, graphdef, params, sources)
            out["ctranslate2"] = self.ctranslate2_test(config, tokenizer, params, sources)
        fixed = [name for name in a.presets if name in FIXED]
        out["fixed"] = {name: self.decode_fixed(name) for name in fixed}
        out["fixed_greedy"] = {name: self.decode_fixed_greedy(name) for name in fixed}
        self.result["decode"] = out

    def decode_test(
        self, config, tokenizer, graphdef, params, sources, beam, *, full: bool
    ) -> dict[str, Any]:
        dcfg = dataclasses.replace(config.decode, beam_size=beam)
        translator = Translator(
            graphdef, params, tokenizer, dcfg, max_src_len=decode_source_limit(config)
        )
        c0, s0 = self.events.snapshot()
        t = time.perf_counter()
        hyps = translator.translate(sources)
        wall = time.perf_counter() - t
        c1, s1 = self.events.snapshot()
        compile_s = s1 - s0
        decode_s = max(wall - compile_s, 1e-9)
        out_tokens = sum(len(h[0].tokens) + 1 for h, s in zip(hyps, sources) if s.strip())
        src_tokens = sum(len(x) for x in tokenizer.encode(sources))
        res = {
            "sentences": len(sources),
            "beam_size": beam,
            "search": "greedy" if beam == 1 else "beam",
            "seconds": decode_s,
            "compile_seconds": compile_s,
            "compilations": c1 - c0,
            "seconds_with_compile": wall,
            "sentences_per_second": len(sources) / decode_s,
            "output_tokens_per_second": out_tokens / decode_s,
            "output_tokens": out_tokens,
            "source_tokens": src_tokens,
            "mean_output_tokens": out_tokens / max(len(sources), 1),
            "decode_config": dataclasses.asdict(dcfg),
            "timing": "one pass through seq2seq.translation.Translator; compile time = JAX "
            "compile events (trace + lowering + XLA) during the pass, decode time "
            "= wall time minus compile time",
        }
        if beam == 4:
            res["goal_seconds"] = GOALS["test_split_beam4_seconds"]
            applies = full and len(sources) == GOALS["test_split_sentences"]
            res["goal_met"] = bool(wall < GOALS["test_split_beam4_seconds"]) if applies else None
        search = "greedy (beam 1)" if beam == 1 else f"beam {beam}"
        say(
            f"  test split, {search}: {len(sources)} sentences "
            f"in {decode_s:.2f} s + compile {compile_s:.2f} s ({c1 - c0} compilations): "
            f"{res['sentences_per_second']:.1f} sentences/s, {res['output_tokens_per_second']:.0f} "
            f"output tokens/s (mean output {res['mean_output_tokens']:.1f} tokens incl. EOS)"
        )
        return res

    def ctranslate2_test(self, config, tokenizer, params, sources) -> dict[str, Any]:
        """CTranslate2's beam-4 decoding of the same test sources with this model exported by
        ``seq2seq.export`` (float32 and int8 weights and compute; as many intra-op threads as
        this process may use), next to ours above. CTranslate2 has no GNMT length penalty, so
        it runs our rules with ``decode.length_penalty=plain`` (same α): the same work per
        step, possibly a few different outputs. Skipped (with the reason) when ``ctranslate2``
        is not installed or the model has a scheme it lacks."""
        import importlib.util

        from seq2seq.export import ctranslate2_translate, write_ctranslate2

        if importlib.util.find_spec("ctranslate2") is None:
            say("  CTranslate2: not installed (pip install 'seq2seq[export]'); skipped")
            return {"skipped": "ctranslate2 is not installed"}
        if config.model.positions == "alibi":
            say("  CTranslate2: model.positions=alibi cannot be exported; skipped")
            return {"skipped": "model.positions=alibi cannot be exported"}
        import ctranslate2

        penalty = config.decode.length_penalty
        decode = replace(
            config.decode, beam_size=4, length_penalty="plain" if penalty == "gnmt" else penalty
        )
        threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
        res: dict[str, Any] = {"decode_config": dataclasses.asdict(decode), "threads": threads}
        with tempfile.TemporaryDirectory() as tmp:
            for compute in ("float32", "int8"):
                path = write_ctranslate2(
                    config.model, tokenizer, params, Path(tmp) / compute, quantization=compute
                )
                translator = ctranslate2.Translator(
                    str(path), device="cpu", compute_type=compute, intra_threads=threads
                )
                ctranslate2_translate(translator, tokenizer, sources[:8], decode)  # warm-up
                t = time.perf_counter()
                outs = ctranslate2_translate(translator, tokenizer, sources, decode)
                seconds = max(time.perf_counter() - t, 1e-9)
                out_tokens = sum(len(ids) + 1 for (ids, _), s in zip(outs, sources) if s.strip())
                res[compute] = {
                    "sentences": len(sources),
                    "seconds": seconds,
                    "sentences_per_second": len(sources) / seconds,
                    "output_tokens_per_second": out_tokens / seconds,
                    "mean_output_tokens": out_tokens / max(len(sources), 1),
                }
                say(
                    f"  CTranslate2 {compute}, beam 4 (plain length penalty): {len(sources)} "
                    f"sentences in {seconds:.2f} s: {res[compute]['sentences_per_second']:.1f} "
                    f"sentences/s, {res[compute]['output_tokens_per_second']:.0f} output tokens/s"
                )
        return res

    def kv_cache(self, config, tokenizer, graphdef, params, sources) -> dict[str, Any]:
        """Greedy with the library's KV cache against a decoder that recomputes the prefix."""
        a = self.args
        ids = [x for x in tokenizer.encode(sources[: a.kv_sentences]) if len(x) > 1]
        ids.sort(key=len)
        limit = decode_source_limit(config)
        ids = [x[:limit] for x in ids]
        width = bucket_length(max(len(x) for x in ids), limit)
        rows = min(a.kv_rows, len(ids))
        max_len = config.decode.output_limit(width)
        batches = []
        for start in range(0, len(ids), rows):
            chunk = ids[start : start + rows]
            src = np.full((rows, width), tokenizer.pad_id, np.int32)
            lengths = np.ones((rows,), np.int32)
            for r, x in enumerate(chunk):
                src[r, : len(x)] = x
                lengths[r] = len(x)
            max_lengths = np.array(
                [min(config.decode.output_limit(int(n)), max_len) for n in lengths], np.int32
            )
            segments = (src != tokenizer.pad_id).astype(np.int32)
            batches.append(
                (jnp.asarray(src), jnp.asarray(segments), jnp.asarray(max_lengths), len(chunk))
            )
        special = dict(bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id)

        def cached(src, seg, max_lengths):
            tokens, _ = greedy_search_jit(
                params, src, seg, max_lengths, graphdef=graphdef, max_len=max_len, **special
            )
            return np.asarray(tokens)

        def uncached(src, seg, max_lengths):
            return no_cache_greedy(
                graphdef,
                params,
                src,
                seg,
                max_lengths,
                max_len=max_len,
                prefix_step=a.kv_prefix_step,
                **special,
            )

        res: dict[str, Any] = {
            "sentences": len(ids),
            "batch_rows": rows,
            "source_width": width,
            "max_len": max_len,
            "prefix_rounding": a.kv_prefix_step,
        }
        outputs = {}
        for name, fn in (("kv_cache", cached), ("no_cache", uncached)):
            c0, _ = self.events.snapshot()
            t = time.perf_counter()
            warm = batches[0]  # full length limits: compiles every prefix length used below
            fn(warm[0], warm[1], jnp.full_like(warm[2], max_len))
            res[f"{name}_compile_and_first_batch_seconds"] = time.perf_counter() - t
            c1, _ = self.events.snapshot()
            t = time.perf_counter()
            outputs[name] = [fn(*b[:3])[: b[3]] for b in batches]
            seconds = time.perf_counter() - t
            res[f"{name}_seconds"] = seconds
            res[f"{name}_sentences_per_second"] = len(ids) / seconds
            res[f"{name}_compilations"] = c1 - c0
            res[f"{name}_compilations_while_timed"] = self.events.snapshot()[0] - c1
        same = [
            np.array_equal(x, y)
            for bx, by in zip(outputs["kv_cache"], outputs["no_cache"])
            for x, y in zip(bx, by)
        ]
        res["same_output_share"] = float(np.mean(same))
        res["speedup"] = res["no_cache_seconds"] / res["kv_cache_seconds"]
        res["method"] = (
            "greedy on the first test sentences (sorted by length, one batch shape); "
            "kv_cache = seq2seq.decoding.greedy_search (lax.while_loop, KV cache); "
            "no_cache = Transformer.decode over the whole prefix at every step "
            "(all decoder layers, cross-attention K/V and the output projection "
            "recomputed), prefix padded up to a multiple of prefix_rounding "
            "positions to bound compilations (causal mask: the padding changes "
            "nothing), one jit call per step"
        )
        say(
            f"  KV cache vs recomputing the prefix (greedy, {len(ids)} sentences, "
            f"{rows}x{width} sources, max {max_len} steps): {res['kv_cache_seconds']:.2f} s vs "
            f"{res['no_cache_seconds']:.2f} s, speed-up {res['speedup']:.2f}x; identical output "
            f"for {res['same_output_share']:.0%} of sentences"
        )
        return res

    # -- attention memory --------------------------------------------------------------------
    def run_attention(self) -> None:
        say("\n== attention memory ==")
        a = self.args
        m = self.config().model
        d, heads = m.d_model, m.num_heads
        dtype = jnp.dtype(a.dtype)
        out: dict[str, Any] = {
            "d_model": d,
            "heads": heads,
            "batch": 1,
            "dtype": a.dtype,
            "chunk": a.attention_chunk,
            "lengths": {},
            "measure": "compiled executable's memory_analysis(): temporary "
            "bytes of value_and_grad of one self-attention layer "
            "(projections + attention, segment mask built from "
            "segment ids); nothing is run",
        }
        paths: dict[str, Callable[..., jax.Array]] = {
            "default": attention_layer_default,
            "chunked": functools.partial(attention_layer_chunked, chunk=a.attention_chunk),
        }
        if jax.default_backend() == "gpu":
            paths["cudnn"] = attention_layer_cudnn
        layer = MultiHeadAttention(d, heads, dtype=dtype, rngs=nnx.Rngs(0))
        graphdef, params = nnx.split(layer)
        out["chunked_check"] = check_chunked(d, heads, chunk=max(1, a.attention_chunk // 8))
        check = out["chunked_check"]
        say(
            f"  chunked = default on a packed, padded row (n={check['n']}): max |diff| of output "
            f"and gradients {check['max_abs_diff']:.2e}"
        )
        for n in a.attention_lengths:
            row: dict[str, Any] = {"scores_bytes_per_layer": n * n * heads * 4}
            for name, fn in paths.items():
                row[name] = compiled_memory(fn, graphdef, params, n, d, dtype)
            out["lengths"][str(n)] = row
            say(
                f"  n={n}: "
                + ", ".join(
                    f"{k} temp {v['temp_bytes'] / 2**20:.1f} MiB"
                    if v.get("temp_bytes") is not None
                    else f"{k} {v}"
                    for k, v in row.items()
                    if isinstance(v, dict)
                )
            )
        self.result["attention"] = out

    # -- memory (child processes) ------------------------------------------------------------
    def run_memory(self) -> None:
        say("\n== memory ==")
        self.prepared()  # so that no child trains a tokenizer
        out: dict[str, Any] = {
            "method": "each phase in its own child process of this script; "
            "peak RSS = VmHWM of /proc/self/status (else "
            "getrusage ru_maxrss); "
            "baseline = RSS after imports, setup = RSS with data "
            "and model ready, before the first step"
        }
        phases = ("train", "decode")
        # One after the other, so that each has the machine to itself (--smoke: side by side).
        procs = {}
        for phase in phases:
            procs[phase] = self.child(phase)
            if not self.args.smoke:
                procs[phase].wait()
        for phase in phases:
            stdout, stderr = procs[phase].communicate()
            if procs[phase].returncode != 0:
                raise RuntimeError(f"memory child {phase} failed:\n{stderr[-4000:]}")
            out[phase] = r = json.loads(stdout.strip().splitlines()[-1])
            say(
                f"  {phase}: peak RSS {r['peak_rss_bytes'] / 2**20:.0f} MiB (after imports "
                f"{(r['baseline_rss_bytes'] or 0) / 2**20:.0f} MiB, after setup "
                f"{(r['setup_rss_bytes'] or 0) / 2**20:.0f} MiB); device {r.get('device_memory')}"
            )
        self.result["memory"] = out

    def child(self, phase: str) -> subprocess.Popen:
        a = self.args
        cmd = [
            sys.executable,
            "-m",
            "benchmarks.benchmark",
            "--memory-child",
            phase,
            "--config",
            a.config,
            "--cache-dir",
            a.cache_dir,
            "--dtype",
            a.dtype,
            "--matmul-dtype",
            a.matmul_dtype,
            "--steps",
            str(a.steps),
            "--warmup",
            str(a.warmup),
            "--memory-decode-sentences",
            str(a.memory_decode_sentences),
        ]
        if a.smoke:
            cmd.append("--smoke")
        if a.workdir:
            cmd += ["--workdir", a.workdir]
        # No up-front GPU memory grab: the parent still holds its own, and the allocator's
        # peak is then what the phase really used.
        env = child_env(XLA_PYTHON_CLIENT_PREALLOCATE="false")
        return subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=os.getcwd(), env=env
        )

    def memory_child(self, phase: str) -> dict[str, Any]:
        a = self.args
        baseline = rss_now()
        if phase == "train":
            data = self.prepared()
            config = self.config()
            batches = [data.train.batch_at(k) for k in range(a.warmup + a.steps)]
            context, state = train_step(config.model, config.train, data.tokenizer.bos_id)
            setup = rss_now()
            for batch in batches:
                state, metrics = context.step(state, micro_batch(batch))
            jax.block_until_ready((state, metrics))
            what = f"{a.warmup + a.steps} training steps of the preset on the real corpus"
        else:
            config, tokenizer, graphdef, params, model_what = self.decode_model()
            sources = self.test_sources(config)
            every = max(1, len(sources) // max(a.memory_decode_sentences, 1))
            sources = sources[::every][: a.memory_decode_sentences]
            setup = rss_now()
            Translator(
                graphdef,
                params,
                tokenizer,
                dataclasses.replace(config.decode, beam_size=4),
                max_src_len=decode_source_limit(config),
            ).translate(sources)
            what = (
                f"beam-4 translation of {len(sources)} test sentences spread over the split "
                f"({model_what.split(' (')[0]})"
            )
        return {
            "phase": phase,
            "what": what,
            "baseline_rss_bytes": baseline,
            "setup_rss_bytes": setup,
            "peak_rss_bytes": peak_rss(),
            "device_memory": device_memory(),
        }


# -- decoding without a cache -----------------------------------------------------------------


def _positions(segments: jax.Array) -> jax.Array:
    return jnp.where(segments > 0, jnp.arange(segments.shape[1])[None, :], 0).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _encode(params, src, src_segments, *, graphdef):
    return nnx.merge(graphdef, params).encode(src, src_segments, _positions(src_segments))


@functools.partial(
    jax.jit, static_argnames=("graphdef", "prefix_len", "bos_id", "eos_id", "pad_id")
)
def _no_cache_step(
    params,
    encoded,
    src_segments,
    dec_in,
    out,
    finished,
    max_lengths,
    index,
    *,
    graphdef,
    prefix_len,
    bos_id,
    eos_id,
    pad_id,
):
    """One greedy step that runs the whole decoder over ``dec_in[:, :prefix_len]``."""
    model = nnx.merge(graphdef, params)
    prefix = dec_in[:, :prefix_len]
    segments = jnp.ones_like(prefix)
    positions = jnp.broadcast_to(jnp.arange(prefix_len, dtype=jnp.int32), prefix.shape)
    logits = model.decode(prefix, segments, positions, encoded, src_segments)
    logits = jax.lax.dynamic_index_in_dim(logits, index, axis=1, keepdims=False)
    logp = jax.nn.log_softmax(logits.astype(jnp.float32))
    token = jnp.arange(logp.shape[-1])
    # the same rules as seq2seq.decoding.greedy_search
    banned = (token == pad_id) | (token == bos_id)
    banned = banned | ((index + 1 >= max_lengths)[:, None] & (token != eos_id))
    tok = jnp.argmax(jnp.where(banned, -1e9, logp), axis=-1).astype(jnp.int32)
    live = ~finished
    cols = jnp.arange(out.shape[1])
    out = jnp.where((cols == index) & live[:, None], tok[:, None], out)
    dec_in = jnp.where(cols == index + 1, tok[:, None], dec_in)
    return dec_in, out, finished | (tok == eos_id)


def no_cache_greedy(
    graphdef,
    params,
    src,
    src_segments,
    max_lengths,
    *,
    max_len: int,
    prefix_step: int,
    bos_id: int,
    eos_id: int,
    pad_id: int,
) -> np.ndarray:
    """Greedy decoding that recomputes the decoder over the prefix at every step (no KV cache).

    Returns the same int32 ``[batch, max_len]`` tokens as ``seq2seq.decoding.greedy_search``.
    """
    batch = src.shape[0]
    encoded = _encode(params, src, src_segments, graphdef=graphdef)
    dec_in = jnp.full((batch, max_len), pad_id, jnp.int32).at[:, 0].set(bos_id)
    out = jnp.full((batch, max_len), pad_id, jnp.int32)
    finished = jnp.zeros((batch,), bool)
    max_lengths = jnp.minimum(max_lengths, max_len)
    for i in range(max_len):
        prefix_len = min(max_len, -(-(i + 1) // prefix_step) * prefix_step)
        dec_in, out, finished = _no_cache_step(
            params,
            encoded,
            src_segments,
            dec_in,
            out,
            finished,
            max_lengths,
            jnp.int32(i),
            graphdef=graphdef,
            prefix_len=prefix_len,
            bos_id=bos_id,
            eos_id=eos_id,
            pad_id=pad_id,
        )
        if bool(jnp.all(finished)):
            break
    return np.asarray(out)


# -- attention memory ---------------------------------------------------------------------------


def _qkv(layer: MultiHeadAttention, x: jax.Array):
    split = lambda y: y.reshape(*y.shape[:-1], layer.num_heads, layer.head_dim)
    return split(layer.query(x)), split(layer.key(x)), split(layer.value(x))


def attention_layer_default(layer: MultiHeadAttention, x: jax.Array, segments: jax.Array):
    """The model's path: a dense ``[batch, 1, n, n]`` mask and ``jax.nn.dot_product_attention``."""
    return layer(x, x, segment_mask(segments, segments))


def chunked_attention(q, k, v, q_segments, k_segments, *, chunk: int) -> jax.Array:
    """softmax(QKᵀ/√d)V computed one block of ``chunk`` queries at a time.

    Each block's scores ``[batch, heads, chunk, n]`` exist only inside a ``jax.checkpoint``
    (recomputed in the backward pass), so memory grows as O(n·chunk), not O(n²). Same
    semantics as the model's attention with ``segment_mask``.

    Args:
      q, k, v: ``[batch, n, heads, head_dim]``; ``n`` divisible by ``chunk``.
      q_segments, k_segments: int ``[batch, n]``.
    """
    b, n, h, dh = q.shape
    blocks = n // chunk
    qb = q.reshape(b, blocks, chunk, h, dh).swapaxes(0, 1)
    sb = q_segments.reshape(b, blocks, chunk).swapaxes(0, 1)

    @jax.checkpoint
    def block(args):
        qi, si = args
        return dot_product_attention(qi, k, v, segment_mask(si, k_segments))

    return jax.lax.map(block, (qb, sb)).swapaxes(0, 1).reshape(b, n, h, dh)


def attention_layer_chunked(
    layer: MultiHeadAttention, x: jax.Array, segments: jax.Array, *, chunk: int
):
    q, k, v = _qkv(layer, x)
    out = chunked_attention(q, k, v, segments, segments, chunk=min(chunk, x.shape[1]))
    return layer.out(out.reshape(*out.shape[:-2], -1))


def attention_layer_cudnn(layer: MultiHeadAttention, x: jax.Array, segments: jax.Array):
    """cuDNN flash attention (GPU, fp16/bf16); padding given as lengths, no dense mask."""
    q, k, v = _qkv(layer, x)
    lengths = jnp.sum(segments > 0, axis=1).astype(jnp.int32)
    out = jax.nn.dot_product_attention(
        q, k, v, query_seq_lengths=lengths, key_value_seq_lengths=lengths, implementation="cudnn"
    )
    return layer.out(out.reshape(*out.shape[:-2], -1))


def check_chunked(d: int, heads: int, *, chunk: int) -> dict[str, Any]:
    """Largest difference between the chunked and the default path (float32): the output and
    the gradients of a random loss, on one row of 3 packed segments and padding."""
    n = 8 * chunk
    x = jax.random.normal(jax.random.key(1), (1, n, d), jnp.float32)
    cotangent = jax.random.normal(jax.random.key(2), (1, n, d), jnp.float32)
    segments = jnp.concatenate(
        [
            jnp.full((3 * chunk,), 1),
            jnp.full((2 * chunk + 5,), 2),
            jnp.full((2 * chunk - 5,), 3),
            jnp.zeros((chunk,)),
        ]
    )[None]
    segments = segments.astype(jnp.int32)
    graphdef, params = nnx.split(MultiHeadAttention(d, heads, dtype=jnp.float32, rngs=nnx.Rngs(0)))

    def run(fn):
        def loss(p, x):
            y = fn(nnx.merge(graphdef, p), x, segments).astype(jnp.float32)
            return jnp.sum(y * cotangent), y

        (_, y), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(params, x)
        return y, grads

    ref, got = (
        run(attention_layer_default),
        run(functools.partial(attention_layer_chunked, chunk=chunk)),
    )
    diffs = jax.tree.map(lambda u, v: jnp.max(jnp.abs(u - v)), ref, got)
    return {"n": n, "chunk": chunk, "max_abs_diff": float(max(jax.tree.leaves(diffs)))}


def compiled_memory(fn: Callable, graphdef, params, n: int, d: int, dtype) -> dict[str, Any]:
    """Memory of ``value_and_grad`` of ``sum(fn(layer, x, segments))`` at length ``n``."""

    def loss(p, x, segments):
        return jnp.sum(fn(nnx.merge(graphdef, p), x, segments).astype(jnp.float32))

    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
    x = jax.ShapeDtypeStruct((1, n, d), dtype)
    segments = jax.ShapeDtypeStruct((1, n), jnp.int32)
    abstract = jax.tree.map(lambda v: jax.ShapeDtypeStruct(v.shape, v.dtype), params)
    try:
        t = time.perf_counter()
        compiled = step.lower(abstract, x, segments).compile()
        seconds = time.perf_counter() - t
        mem = compiled.memory_analysis()
    except Exception as e:  # noqa: BLE001 - e.g. cuDNN unavailable for this shape or dtype
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
    get = lambda name: int(getattr(mem, name)) if mem is not None and hasattr(mem, name) else None
    return {
        "temp_bytes": get("temp_size_in_bytes"),
        "argument_bytes": get("argument_size_in_bytes"),
        "output_bytes": get("output_size_in_bytes"),
        "compile_seconds": seconds,
    }


# -- smoke corpus ---------------------------------------------------------------------------------


def write_smoke_corpus(directory: Path, sizes=(("train", 1200), ("dev", 40), ("test", 24))) -> Path:
    """First lines of the shipped corpus as small plain-text splits (for ``--smoke``)."""
    data = ROOT / "data" / "tatoeba-en-es"
    for split, count in sizes:
        for lang in ("en", "es"):
            path = directory / f"{split}.{lang}"
            if path.is_file():
                continue
            directory.mkdir(parents=True, exist_ok=True)
            with gzip.open(data / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
                lines = [next(f) for _ in range(count)]
            path.write_text("".join(lines), encoding="utf-8")
    return directory


# -- command line ---------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--only",
        default=",".join(SECTIONS),
        help=f"comma-separated sections to run: {','.join(SECTIONS)} (default all)",
    )
    p.add_argument(
        "--preset",
        default=",".join(PRESETS),
        help="comma-separated configs for train/decode: tatoeba (shipped preset on the "
        "real corpus), tiny, base (fixed shapes) (default all)",
    )
    p.add_argument("--steps", type=int, default=None, help="timed training steps (default 10)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 2)")
    p.add_argument(
        "--dtype",
        default=None,
        choices=("float32", "bfloat16"),
        help="compute dtype (default float32 on CPU, bfloat16 on GPU/TPU)",
    )
    p.add_argument(
        "--matmul-dtype",
        default="float32",
        choices=("float32", "bfloat16"),
        help="model.matmul_dtype: bfloat16 rounds every projection's operands of a float32 "
        "model (MFU is then against the bfloat16 peak)",
    )
    p.add_argument("--config", default="configs/tatoeba_en_es.yaml", help="the small preset")
    p.add_argument(
        "--workdir",
        default=None,
        help="a trained run to decode with (default: a randomly initialised model)",
    )
    p.add_argument(
        "--cache-dir",
        default=None,
        help="where the preset's tokenizer and token ids are cached "
        "(default runs/benchmark; a temporary directory with --smoke)",
    )
    p.add_argument("--beams", default="1,4", help="beam sizes on the test split (1 = greedy)")
    p.add_argument(
        "--decode-limit",
        type=int,
        default=None,
        help="decode only the first N test sentences (0 = all 2,780; default)",
    )
    p.add_argument(
        "--decode-repeats", type=int, default=None, help="fixed-shape decode repeats (10)"
    )
    p.add_argument(
        "--kv-sentences", type=int, default=None, help="sentences for the KV-cache test (128)"
    )
    p.add_argument("--kv-rows", type=int, default=64, help="batch rows for the KV-cache test")
    p.add_argument(
        "--kv-prefix-step",
        type=int,
        default=None,
        help="no-cache decoder: prefix length rounded up to a multiple of this (8)",
    )
    p.add_argument(
        "--shape-batches",
        type=int,
        default=None,
        help="pipeline batches checked for distinct shapes (200)",
    )
    p.add_argument("--attention-lengths", default=None, help="default 1024,2048,4096,8192")
    p.add_argument("--attention-chunk", type=int, default=None, help="query block size (512)")
    p.add_argument(
        "--peak-size",
        type=int,
        default=None,
        help="matmul size for the peak (2048 on CPU, 8192 on accelerators)",
    )
    p.add_argument("--peak-repeats", type=int, default=None, help="peak matmul samples (10)")
    p.add_argument("--tokenize-repeats", type=int, default=None, help="tokenization repeats (3)")
    p.add_argument(
        "--memory-decode-sentences",
        type=int,
        default=None,
        help="test sentences decoded by the memory child (256)",
    )
    p.add_argument(
        "--smoke",
        action="store_true",
        help="tiny shapes, 2 steps, a few sentences: checks that the script runs",
    )
    p.add_argument("--out", default=None, help="write the figures as JSON to this file")
    p.add_argument(
        "--long",
        action="store_true",
        help="the long-input benchmark instead (benchmarks/long_inputs.py; its options follow)",
    )
    p.add_argument("--memory-child", choices=("train", "decode"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)

    accelerator = jax.default_backend() != "cpu"
    smoke = a.smoke
    defaults = dict(
        steps=(2 if smoke else 10),
        warmup=(1 if smoke else 2),
        dtype=("bfloat16" if accelerator else "float32"),
        decode_limit=(8 if smoke else 0),
        decode_repeats=(1 if smoke else 10),
        kv_prefix_step=(64 if smoke else 8),
        kv_sentences=(8 if smoke else 128),
        shape_batches=(20 if smoke else 200),
        attention_lengths=("64,128" if smoke else "1024,2048,4096,8192"),
        attention_chunk=(32 if smoke else 512),
        peak_size=(256 if smoke else PEAK_SIZE["accelerator" if accelerator else "cpu"]),
        peak_repeats=(3 if smoke else PEAK_REPEATS),
        tokenize_repeats=(1 if smoke else 3),
        memory_decode_sentences=(8 if smoke else 256),
    )
    for k, v in defaults.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if smoke and a.kv_rows == 64:
        a.kv_rows = 4
    a.sections = [s for s in a.only.split(",") if s]
    a.presets = [s for s in a.preset.split(",") if s]
    a.beams = [int(b) for b in a.beams.split(",") if b]
    a.attention_lengths = [int(n) for n in a.attention_lengths.split(",") if n]
    for s in a.sections:
        if s not in SECTIONS:
            p.error(f"unknown section {s!r}; choose from {', '.join(SECTIONS)}")
    for s in a.presets:
        if s not in PRESETS:
            p.error(f"unknown preset {s!r}; choose from {', '.join(PRESETS)}")
    if a.steps < 1 or a.warmup < 0:
        p.error("--steps must be >= 1 and --warmup >= 0")
    return a


def main(argv: list[str] | None = None) -> int:
    raw = sys.argv[1:] if argv is None else argv
    if "--long" in raw:  # the long-input section has its own options (benchmarks/long_inputs.py)
        return run_experiment("long_inputs", [a for a in raw if a != "--long"])
    args = parse_args(argv)
    tmp = None
    if args.cache_dir is None:
        if args.smoke:
            tmp = tempfile.mkdtemp(prefix="bench-smoke-")
            args.cache_dir = tmp
        else:
            args.cache_dir = str(Path("runs") / "benchmark")
    if args.smoke:
        # Smoke runs only check that the script works: let the memory children reuse the
        # parent's compilations (never in a real run, where compile time and memory count).
        jax.config.update("jax_compilation_cache_dir", str(Path(args.cache_dir) / "xla-cache"))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    try:
        import datasets

        datasets.disable_progress_bars()
    except Exception:  # noqa: BLE001 - cosmetic only
        pass
    bench = Bench(args)
    if args.memory_child:
        print(json.dumps(bench.memory_child(args.memory_child)))
        return 0
    start = time.perf_counter()
    bench.result["meta"] = {
        "argv": sys.argv[1:] if argv is None else argv,
        "sections": args.sections,
        "presets": args.presets,
        "smoke": args.smoke,
        "steps": args.steps,
        "warmup": args.warmup,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "matmul_dtype": args.matmul_dtype,
        "machine": machine_info(args.dtype),
        "config": args.config,
        "cache_dir": args.cache_dir,
        "note": "figures from one run; on a shared machine check load_average_start/_end",
    }
    m = bench.result["meta"]["machine"]
    say(
        f"machine: {m['cpu']}, {m['cpus_usable']} usable cores, jax {m['jax']}, backend "
        f"{m['backend']} ({m['device_kind']}), dtype {args.dtype}, matmul operands "
        f"{args.matmul_dtype}, load {m['load_average_start']}"
    )
    try:
        seconds = bench.result["meta"]["section_seconds"] = {}
        for section in SECTIONS:  # a fixed order: data first fills the cache the others use
            if section in args.sections:
                t = time.perf_counter()
                getattr(bench, f"run_{section}")()
                seconds[section] = time.perf_counter() - t
        if "train" in args.sections:
            bench.sample_peak()  # a second peak sample at the end, against drift in load
            bench.rescale_mfu()
        bench.result["preset_config"] = jsonable(dataclasses.asdict(bench.config()))
        bench.result["goals"] = GOALS
        m["load_average_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
        bench.result["meta"]["seconds"] = time.perf_counter() - start
        bench.result["meta"]["peak_rss_bytes"] = peak_rss()
        bench.result["meta"]["device_memory"] = device_memory()
        say("\n== rows of docs/benchmarks.md ==\n" + readme_rows(bench.result))
        if args.out:
            Path(args.out).write_text(json.dumps(jsonable(bench.result), indent=1) + "\n")
            say(f"\nwrote {args.out}")
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


def readme_rows(r: dict[str, Any]) -> str:
    """The figures of ``r`` as rows of the tables in ``docs/benchmarks.md`` (sections that ran)."""

    def num(x, digits=3):
        return "—" if x is None else f"{x:,.{digits}g}" if abs(x) < 10**digits else f"{x:,.0f}"

    def rng(s, scale=1.0):
        return f"{num(s['median'] * scale)} ({num(s['min'] * scale)}–{num(s['max'] * scale)})"

    lines = []
    m = r["meta"]["machine"]
    peak = r.get("peak", {}).get("gflops_per_second")
    f32_peak = r.get("float32_peak", {}).get("gflops_per_second")
    lines.append(
        f"Machine: {m['cpu']}, {m['cpus_usable']} cores; jax {m['jax']}; backend "
        f"{m['backend']} ({m['device_kind']}); dtype {m['dtype']}; matmul peak "
        f"{rng(peak) if peak else '—'} GFLOP/s"
        + (f" ({r['peak']['dtype']}), float32 {rng(f32_peak)}" if f32_peak else "")
        + f"; load {m['load_average_start']}"
    )
    for name, t in r.get("train", {}).items():
        b = t["batch_shape"]
        p = t.get("pipeline")
        shapes = (
            f"{t['compilations']['jit_cache_entries']} / {p['distinct_batch_shapes'] if p else '—'}"
        )
        real = f"{p['real_token_share']['median']:.1%}" if p else "100%"
        lines.append(
            f"| {name} | {b['rows']}×{b['src_len']} | {rng(t['step_seconds'])} | "
            f"{num(t['tokens_per_second'])} | {num(t['real_target_tokens_per_second'])} | "
            f"{num(t['compile_seconds'])} | {shapes} | {real} | "
            f"{num(t['model_flops_per_step'] / 1e9)} ({num(t['xla_over_model_flops'])}) | "
            f"{num(t['achieved_gflops_per_second'])} | {t['mfu']:.1%}"
            + (f" ({t['of_float32_peak']:.0%} of float32)" if "of_float32_peak" in t else "")
            + " |"
        )
    d = r.get("decode", {})
    for name, t in d.get("test_split", {}).items():
        lines.append(
            f"| test split, {name} | {num(t['sentences_per_second'])} | "
            f"{num(t['output_tokens_per_second'])} | {num(t['compile_seconds'])} | "
            f"{num(t['seconds_with_compile'])} |"
        )
    for search, key in (("beam 4", "fixed"), ("greedy", "fixed_greedy")):
        for name, t in d.get(key, {}).items():
            lines.append(
                f"| {name}, {search} | {rng(t['sentences_per_second'])} | | "
                f"{num(t['compile_seconds'])} | |"
            )
    if "kv_cache" in d:
        lines.append(f"| KV cache speed-up (greedy) | {num(d['kv_cache']['speedup'])}× |")
    if "model" in d:
        lines.append(f"decoding model: {d['model']}")
    data, mem = r.get("data"), r.get("memory")
    if data or mem:
        mib = lambda x: "—" if x is None else f"{x / 2**20:,.0f} MiB"
        dev = (mem or {}).get("train", {}).get("device_memory") or {}
        lines.append(
            f"| {rng(data['tokenize_sentences_per_second']) if data else '—'} | "
            f"{num(data['time_to_first_batch_new_run_seconds']) if data else '—'} | "
            f"{num(data['time_to_first_batch_cached_seconds']) if data else '—'} | "
            f"{mib(mem['train']['peak_rss_bytes']) if mem else '—'} | "
            f"{mib(mem['decode']['peak_rss_bytes']) if mem else '—'} | "
            f"{mib(dev.get('peak_bytes_in_use'))} |"
        )
    att = r.get("attention")
    if att:
        for path in ("default", "chunked", "cudnn"):
            cells = [row.get(path, {}) for row in att["lengths"].values()]
            if any(cells):
                lines.append(
                    f"| {path} | "
                    + " | ".join(
                        f"{c['temp_bytes'] / 2**20:,.0f} MiB"
                        if c.get("temp_bytes") is not None
                        else "—"
                        for c in cells
                    )
                    + " |"
                )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
